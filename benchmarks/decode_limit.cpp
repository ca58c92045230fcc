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
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "io/chunked_array.h"
#include "io/file.h"
#include "io/hdf5_group.h"
#include "io/zarr_group.h"

namespace io = torch_shards::io;

namespace {

double cpu_seconds() {  // of the whole process, every thread
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec + 1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
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

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  double seconds = 5;
  std::vector<std::string> specs;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else {
      specs.push_back(arg);
    }
  }
  if (specs.empty()) {
    std::cerr << "usage: decode_limit [--threads N] [--seconds S] STORE:ARRAY [STORE:ARRAY ...]\n";
    return 2;
  }
  try {
    std::vector<std::shared_ptr<const io::Array>> arrays;
    std::vector<Piece> pieces;
    size_t decoded_bytes = 0, largest = 0;
    std::string names;
    for (const std::string& spec : specs) {
      arrays.push_back(open_array(spec));
      for (const Piece& piece : pieces_of(*arrays.back(), size_t{4} << 20)) {
        pieces.push_back(piece);
        largest = std::max(largest, static_cast<size_t>(piece.end - piece.begin) * piece.array->row_bytes());
      }
      decoded_bytes += static_cast<size_t>(arrays.back()->num_rows()) * arrays.back()->row_bytes();
      names += (names.empty() ? "\"" : ", \"") + spec + "\"";
    }
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const double cpu_start = cpu_seconds();
    int passes = 0;
    double elapsed = 0;
    while (passes == 0 || elapsed < seconds) {
      std::atomic<size_t> next{0};
      std::vector<std::thread> workers;
      std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
      for (int t = 0; t < threads; ++t) {
        workers.emplace_back([&, t] {
          try {
            torch_shards::core::ThreadPool inline_pool(0);  // one piece per thread, as reader threads read
            std::vector<uint8_t> out(largest);
            for (size_t p = next++; p < pieces.size(); p = next++) {
              const Piece& piece = pieces[p];
              piece.array->read({io::Segment{piece.begin, piece.end - piece.begin, 0}}, out.data(), inline_pool);
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
      ++passes;
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    }
    const double cpu = cpu_seconds() - cpu_start;
    std::cout << "{\"passes\": " << passes << ", \"seconds\": " << elapsed << ", \"cpu_seconds\": " << cpu
              << ", \"decoded_bytes\": " << decoded_bytes << ", \"threads\": " << threads << ", \"arrays\": [" << names
              << "]}" << std::endl;
  } catch (const std::exception& error) {
    std::cerr << "decode_limit: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
