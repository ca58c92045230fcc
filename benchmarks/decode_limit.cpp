// The decode limit of the storage benchmarks: every chunk of the given arrays
// read and decoded in order, by --threads threads taking chunk-aligned pieces
// in turn, from the page cache, with the same io code the sources read with.
// No row selection, no output tensors, no planning: what a read of the same
// chunks cannot beat on the same threads.
//
//   decode_limit --threads 2 --seconds 8 store.zarr:/X/data store.zarr:/X/indices ...
//
// Prints one JSON line: {"passes": full passes over all arrays, "seconds": their
// time, "cpu_seconds": the process's CPU time meanwhile, "decoded_bytes": bytes
// one pass decodes, "arrays": [...]}.
//
// The rate of writing dense rows to memory (what dense=True adds to a CSR read):
//
//   decode_limit --threads 2 --seconds 8 --write-rows 2000
//
// rows of 2000 float32 values copied from 64 row buffers that stay in cache
// to a 16,384-row output (past the last-level cache) with the non-temporal
// stores the dense scatter streams its rows with (core/streaming_copy.h);
// "passes" are whole outputs written ("written_rows" rows each).
// --write-density D (default 1): the share of non-zero values in each row, at
// random columns. It matters: this VM's memory takes all-zero cache lines
// about twice as fast as others.
//
// The floor of random block reads of CSR matrices:
//
//   decode_limit --threads 2 --seconds 8 --csr-blocks 64 --fetch-rows 2048 store.zarr:/dataset_0 ...
//
// Each STORE:PATH is an AnnData whose X is CSR. Its rows are cut into blocks
// of --csr-blocks rows, shuffled (--seed), and taken --fetch-rows rows at a
// time by the threads in turn; a fetch is planned and read with the io code
// the sources use (CsrMatrix::plan and read: indptr, then only the parts of
// the chunks of indices and data its rows need), into buffers each thread
// reuses. No batches, no tensors, no Python: what any reader of the same
// random blocks pays at least. "passes" are then epochs over every row.
// --shuffle-rows: each fetch's rows are shuffled too, as a loader delivers
// them (BlockShuffling permutes every fetch): the CSR plan then has a segment
// per row, read in source order and each row copied to its own place.
//
// The copy limit of the host path (benchmarks/host_path.py): rows of memory
// gathered as BlockShuffling delivers them, with nothing but the copy.
//
//   decode_limit --threads 2 --seconds 2 --gather-rows 100000 --row-bytes 8192 --blocks 64 --fetch-rows 4096
//
// A source of --gather-rows rows of --row-bytes bytes in plain memory (not
// zero: this VM takes all-zero lines faster), cut into blocks of --blocks
// rows, shuffled, taken --fetch-rows rows a fetch, each fetch's rows shuffled.
// Fetch after fetch, the threads copy its rows (64 at a time) in
// ascending source order to their places in the fetch (as the sources do),
// into three recycled output buffers (huge pages asked for as the pool does),
// with non-temporal stores as the readers decide (core::streams: from 8 MB,
// rows that fill whole lines). The plan is made before
// the clock starts. "passes" are epochs of every row;
// "gathered_rows" the rows of one.
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/streaming_copy.h"
#include "core/thread_pool.h"
#include "io/anndata.h"
#include "io/chunked_array.h"
#include "io/file.h"
#include "io/hdf5_group.h"
#include "io/zarr/group.h"

namespace io = torch_shards::io;

namespace {

double cpu_seconds() {  // of the whole process, every thread
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec + 1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

// Passes run after one untimed pass, until `seconds` have gone by (one at least).
struct Timed {
  int passes = 0;
  double seconds = 0, cpu_seconds = 0;
};

template <typename Pass>
Timed time_passes(const Pass& pass, double seconds) {
  pass();  // untimed: first touches (memory faulted in, chunks checked whole)
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const double cpu_start = cpu_seconds();
  Timed timed;
  while (timed.passes == 0 || timed.seconds < seconds) {
    pass();
    ++timed.passes;
    timed.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  }
  timed.cpu_seconds = cpu_seconds() - cpu_start;
  return timed;
}

struct Piece {
  const io::Array* array;
  int64_t begin, end;
};

std::shared_ptr<const io::Array> open_array(const std::string& spec) {
  const size_t colon = spec.rfind(':');
  if (colon == std::string::npos) throw std::invalid_argument("expected STORE:ARRAY, got " + spec);
  const std::string store = spec.substr(0, colon), path = spec.substr(colon + 1);
  const auto root = io::is_directory(store) ? io::open_zarr_group(store, "/") : io::open_hdf5_group(store, "/");
  return root->array(path);
}

// Chunk-aligned pieces of about `target_bytes` decoded bytes, in array order.
std::vector<Piece> pieces_of(const io::Array& array, size_t target_bytes) {
  int64_t chunk_rows = 1;
  if (const auto* chunked = dynamic_cast<const io::ChunkedArray*>(&array)) chunk_rows = chunked->chunk_shape()[0];
  const size_t chunk_bytes = static_cast<size_t>(chunk_rows) * std::max<size_t>(array.row_bytes(), 1);
  const int64_t rows = chunk_rows * std::max<int64_t>(1, static_cast<int64_t>(target_bytes / chunk_bytes));
  std::vector<Piece> pieces;
  for (int64_t begin = 0; begin < array.num_rows(); begin += rows) {
    pieces.push_back(Piece{&array, begin, std::min(array.num_rows(), begin + rows)});
  }
  return pieces;
}

std::shared_ptr<const io::Group> open_group(const std::string& spec) {
  const size_t colon = spec.rfind(':');
  if (colon == std::string::npos) throw std::invalid_argument("expected STORE:PATH, got " + spec);
  const std::string store = spec.substr(0, colon), path = spec.substr(colon + 1);
  return io::is_directory(store) ? io::open_zarr_group(store, path) : io::open_hdf5_group(store, path);
}

struct Fetch {
  const io::CsrMatrix* matrix;
  std::vector<int64_t> rows;  // blocks of consecutive rows, in shuffled order (rows shuffled: any order)
};

// The epoch of random block reads: every row of every matrix, once.
std::vector<Fetch> block_fetches(const std::vector<std::shared_ptr<const io::CsrMatrix>>& matrices, int64_t block,
                                 int64_t fetch_rows, uint64_t seed, bool shuffle_rows) {
  std::vector<Fetch> fetches;
  std::mt19937_64 random(seed);
  for (const auto& matrix : matrices) {
    std::vector<int64_t> starts;
    for (int64_t row = 0; row < matrix->num_rows(); row += block) starts.push_back(row);
    std::shuffle(starts.begin(), starts.end(), random);
    Fetch fetch{matrix.get(), {}};
    for (const int64_t start : starts) {
      for (int64_t row = start; row < std::min(matrix->num_rows(), start + block); ++row) fetch.rows.push_back(row);
      if (static_cast<int64_t>(fetch.rows.size()) >= fetch_rows) {
        fetches.push_back(std::move(fetch));
        fetch = Fetch{matrix.get(), {}};
      }
    }
    if (!fetch.rows.empty()) fetches.push_back(std::move(fetch));
  }
  if (shuffle_rows) {
    for (Fetch& fetch : fetches) std::shuffle(fetch.rows.begin(), fetch.rows.end(), random);
  }
  return fetches;
}

// Memory for the gather mode (uninitialised); huge: asked to use huge pages
// from 4 MB, as BufferPool's storages do (a tensor torch allocates is not).
struct Memory {
  Memory(size_t bytes, bool huge) : bytes(bytes) {
    constexpr size_t kHuge = size_t{2} << 20;
    data = static_cast<uint8_t*>(std::aligned_alloc(kHuge, (bytes + kHuge - 1) / kHuge * kHuge));
    if (data == nullptr) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    if (huge && bytes >= 2 * kHuge) (void)madvise(data, bytes / kHuge * kHuge, MADV_HUGEPAGE);
#endif
  }
  ~Memory() { std::free(data); }
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;
  uint8_t* data = nullptr;
  size_t bytes = 0;
};

// One fetch of the gather mode: (source row, place in the fetch), by source row.
using GatherFetch = std::vector<std::pair<int64_t, int64_t>>;

std::vector<GatherFetch> gather_fetches(int64_t rows, int64_t block, int64_t fetch_rows, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::vector<int64_t> starts;
  for (int64_t row = 0; row < rows; row += block) starts.push_back(row);
  std::shuffle(starts.begin(), starts.end(), random);
  std::vector<int64_t> plan;  // every row, block after block: cut into fetches of fetch_rows, as the planner does
  for (const int64_t start : starts) {
    for (int64_t row = start; row < std::min(rows, start + block); ++row) plan.push_back(row);
  }
  std::vector<GatherFetch> fetches;
  for (size_t begin = 0; begin < plan.size(); begin += static_cast<size_t>(fetch_rows)) {
    std::vector<int64_t> delivered(
        plan.begin() + static_cast<std::ptrdiff_t>(begin),
        plan.begin() + static_cast<std::ptrdiff_t>(std::min(plan.size(), begin + static_cast<size_t>(fetch_rows))));
    std::shuffle(delivered.begin(), delivered.end(), random);
    GatherFetch fetch;
    for (size_t place = 0; place < delivered.size(); ++place) {
      fetch.emplace_back(delivered[place], static_cast<int64_t>(place));
    }
    std::sort(fetch.begin(), fetch.end());
    fetches.push_back(std::move(fetch));
  }
  return fetches;
}

// The gather mode's epochs (see the top of this file).
Timed gather_epochs(int64_t rows, size_t row_bytes, int64_t block, int64_t fetch_rows, uint64_t seed, int threads,
                    double seconds) {
  const std::vector<GatherFetch> fetches = gather_fetches(rows, block, fetch_rows, seed);
  // The source: 1 MB of random words (never an all-zero line), repeated.
  Memory source(static_cast<size_t>(rows) * row_bytes, false);
  std::vector<uint64_t> pattern(size_t{1} << 17);
  std::mt19937_64 random(seed);
  for (uint64_t& word : pattern) word = random() | 1;
  const size_t pattern_bytes = pattern.size() * sizeof(uint64_t);
  for (size_t at = 0; at < source.bytes; at += pattern_bytes) {
    std::memcpy(source.data + at, pattern.data(), std::min(pattern_bytes, source.bytes - at));
  }
  constexpr size_t kBuffers = 3;
  const size_t fetch_bytes = static_cast<size_t>(fetch_rows) * row_bytes;
  const bool streaming = torch_shards::core::streams(fetch_bytes, row_bytes);
  std::vector<std::unique_ptr<Memory>> outputs;
  for (size_t b = 0; b < kBuffers; ++b) outputs.push_back(std::make_unique<Memory>(fetch_bytes, true));
  // Fetch after fetch, its copy spread over the threads (as a reader spreads
  // a large fetch's): they take 64 rows at a time and meet at its end,
  // spinning (one thread per core: a sleeping thread's wake-up would be
  // counted against the copy).
  constexpr size_t kTaskRows = 64;
  const auto pass = [&] {
    std::atomic<size_t> arrived{0}, generation{0}, next_task{0};
    const auto meet = [&] {
      const size_t mine = generation.load();
      if (arrived.fetch_add(1) + 1 == static_cast<size_t>(threads)) {
        arrived = 0;
        next_task = 0;  // every thread is here: the next fetch starts afresh
        generation.fetch_add(1);
      } else {
        while (generation.load() == mine) {
        }
      }
    };
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&] {
        for (size_t f = 0; f < fetches.size(); ++f) {
          const GatherFetch& fetch = fetches[f];
          uint8_t* out = outputs[f % kBuffers]->data;
          for (size_t begin = kTaskRows * next_task++; begin < fetch.size(); begin = kTaskRows * next_task++) {
            for (size_t k = begin; k < std::min(fetch.size(), begin + kTaskRows); ++k) {
              const auto [row, place] = fetch[k];
              torch_shards::core::copy_bytes(out + static_cast<size_t>(place) * row_bytes,
                                             source.data + static_cast<size_t>(row) * row_bytes, row_bytes, streaming);
            }
          }
          if (streaming) torch_shards::core::streaming_fence();
          meet();
        }
      });
    }
    for (auto& worker : workers) worker.join();
  };
  return time_passes(pass, seconds);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  double seconds = 5;
  int64_t block = 0, fetch_rows = 2048, write_columns = 0, gather_rows = 0;
  size_t gather_row_bytes = 8192;
  double write_density = 1.0;
  uint64_t seed = 0;
  bool shuffle_rows = false;
  std::vector<std::string> specs;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--gather-rows" && i + 1 < argc) {
      gather_rows = std::max<int64_t>(1, std::atoll(argv[++i]));
    } else if (arg == "--row-bytes" && i + 1 < argc) {
      gather_row_bytes = static_cast<size_t>(std::max<int64_t>(1, std::atoll(argv[++i])));
    } else if (arg == "--blocks" && i + 1 < argc) {
      block = std::max<int64_t>(1, std::atoll(argv[++i]));
    } else if (arg == "--write-rows" && i + 1 < argc) {
      write_columns = std::max<int64_t>(1, std::atoll(argv[++i]));
    } else if (arg == "--write-density" && i + 1 < argc) {
      write_density = std::atof(argv[++i]);
    } else if (arg == "--csr-blocks" && i + 1 < argc) {
      block = std::max<int64_t>(1, std::atoll(argv[++i]));
    } else if (arg == "--fetch-rows" && i + 1 < argc) {
      fetch_rows = std::max<int64_t>(1, std::atoll(argv[++i]));
    } else if (arg == "--shuffle-rows") {
      shuffle_rows = true;
    } else if (arg == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--threads" && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else {
      specs.push_back(arg);
    }
  }
  if (gather_rows > 0) {
    try {
      const Timed run =
          gather_epochs(gather_rows, gather_row_bytes, std::max<int64_t>(1, block), fetch_rows, seed, threads, seconds);
      std::cout << "{\"passes\": " << run.passes << ", \"seconds\": " << run.seconds
                << ", \"cpu_seconds\": " << run.cpu_seconds << ", \"gathered_rows\": " << gather_rows
                << ", \"row_bytes\": " << gather_row_bytes << ", \"threads\": " << threads << "}" << std::endl;
    } catch (const std::exception& error) {
      std::cerr << "decode_limit: " << error.what() << "\n";
      return 1;
    }
    return 0;
  }
  if (specs.empty() && write_columns == 0) {
    std::cerr << "usage: decode_limit [--threads N] [--seconds S] STORE:ARRAY [STORE:ARRAY ...]\n"
                 "       decode_limit [--threads N] [--seconds S] --csr-blocks ROWS [--fetch-rows ROWS] [--seed S] "
                 "[--shuffle-rows] "
                 "STORE:ANNDATA [...]\n"
                 "       decode_limit [--threads N] [--seconds S] --write-rows COLUMNS\n"
                 "       decode_limit [--threads N] [--seconds S] --gather-rows ROWS [--row-bytes B] [--blocks ROWS] "
                 "[--fetch-rows ROWS] [--seed S]\n";
    return 2;
  }
  try {
    std::vector<std::shared_ptr<const io::Array>> arrays;
    std::vector<std::shared_ptr<const io::CsrMatrix>> matrices;
    std::vector<Piece> pieces;
    std::vector<Fetch> fetches;
    size_t decoded_bytes = 0, largest = 0;
    std::string names;
    for (const std::string& spec : specs) {
      names += (names.empty() ? "\"" : ", \"") + spec + "\"";
      if (block > 0) {
        const io::MatrixData x = io::AnnDataStore(open_group(spec)).matrix(std::nullopt);
        if (!x.csr) throw std::invalid_argument(spec + ": X is not a CSR matrix");
        matrices.push_back(x.csr);
        continue;
      }
      arrays.push_back(open_array(spec));
      for (const Piece& piece : pieces_of(*arrays.back(), size_t{4} << 20)) {
        pieces.push_back(piece);
        largest = std::max(largest, static_cast<size_t>(piece.end - piece.begin) * piece.array->row_bytes());
      }
      decoded_bytes += static_cast<size_t>(arrays.back()->num_rows()) * arrays.back()->row_bytes();
    }
    if (block > 0) fetches = block_fetches(matrices, block, fetch_rows, seed, shuffle_rows);
    constexpr int64_t kWriteRows = 16384, kWriteTask = 256;  // rows of the output, rows per task
    const size_t row_bytes = static_cast<size_t>(write_columns) * sizeof(float);
    std::vector<uint8_t> written(write_columns > 0 ? kWriteRows * row_bytes : 0, 1);  // faulted in once
    if (write_columns > 0) names = "\"write rows\"";
    constexpr int64_t kRowPatterns = 64;
    // The patterns lie as far from a 64-byte line's start as the output rows they are copied to
    // (kWriteTask is a multiple of kRowPatterns), as the dense scatter stages its rows.
    std::vector<uint8_t> pattern_bytes(kRowPatterns * row_bytes + 64);
    auto* patterns =
        reinterpret_cast<float*>(torch_shards::core::line_aligned_like(pattern_bytes.data(), written.data()));
    std::mt19937_64 random(seed);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    for (int64_t i = 0; i < kRowPatterns * write_columns; ++i)
      patterns[i] = uniform(random) < write_density ? 1.0F + static_cast<float>(uniform(random)) : 0.0F;
    const size_t tasks = write_columns > 0 ? kWriteRows / kWriteTask : (block > 0 ? fetches.size() : pieces.size());
    // One pass over every task, by `threads` threads taking tasks in turn.
    const auto pass = [&] {
      std::atomic<size_t> next{0};
      std::vector<std::thread> workers;
      std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
      for (int t = 0; t < threads; ++t) {
        workers.emplace_back([&, t] {
          try {
            torch_shards::core::ThreadPool inline_pool(0);  // one task per thread, as reader threads read
            std::vector<uint8_t> out(largest), values;
            std::vector<int32_t> columns;
            for (size_t p = next++; p < tasks; p = next++) {
              if (write_columns > 0) {
                for (int64_t r = 0; r < kWriteTask; ++r) {
                  const float* row = patterns + (r % kRowPatterns) * write_columns;
                  torch_shards::core::streaming_copy(written.data() + (p * kWriteTask + r) * row_bytes, row, row_bytes);
                }
                torch_shards::core::streaming_fence();
                continue;
              }
              if (block == 0) {
                const Piece& piece = pieces[p];
                piece.array->read({io::Segment{piece.begin, piece.end - piece.begin, 0}}, out.data(), inline_pool);
                continue;
              }
              const Fetch& fetch = fetches[p];
              const io::CsrPlan plan = fetch.matrix->plan(fetch.rows, inline_pool);
              const auto nnz = static_cast<size_t>(plan.nnz());
              columns.resize(nnz);
              values.resize(nnz * io::dtype_size(fetch.matrix->value_dtype()));
              fetch.matrix->read(plan, columns.data(), io::DType::kInt32, values.data(), inline_pool);
            }
          } catch (...) {
            errors[static_cast<size_t>(t)] = std::current_exception();
          }
        });
      }
      for (auto& worker : workers) worker.join();
      for (const auto& error : errors) {
        if (error) std::rethrow_exception(error);
      }
    };
    const Timed run = time_passes(pass, seconds);  // compressed chunks are checked whole in the untimed pass
    std::cout << "{\"passes\": " << run.passes << ", \"seconds\": " << run.seconds
              << ", \"cpu_seconds\": " << run.cpu_seconds << ", \"decoded_bytes\": " << decoded_bytes
              << ", \"written_rows\": " << (write_columns > 0 ? kWriteRows : 0) << ", \"threads\": " << threads
              << ", \"arrays\": [" << names << "]}" << std::endl;
  } catch (const std::exception& error) {
    std::cerr << "decode_limit: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
