// Reads epochs of a file through torch_shards' C++ API and prints rows/s and
// rows per CPU-second of the process, for benchmarks/cpp_iteration.py and
// benchmarks/annbatch_format.py to compare with Python's in-process
// iteration of the same native dataset. The clock starts at the first
// batch, as the Python loops' do.
//
//   iterate (h5ad|hdf5|annbatch) PATH BLOCK_SIZE THREADS SECONDS [FETCH_FACTOR [dense]]
//
// annbatch: an annbatch DatasetCollection (torch_shards::AnnbatchCollection);
// dense: its CSR rows densified. FETCH_FACTOR defaults to 16.
#include <sys/resource.h>
#include <torch_shards/torch_shards.h>

#include <chrono>
#include <iostream>
#include <optional>
#include <string>

namespace {

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);  // every thread of the process
  const auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * t.tv_usec; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

torch_shards::Source open(const std::string& kind, const std::string& path, bool dense) {
  if (kind == "h5ad") return torch_shards::AnnDataSource(path, {.dense = dense});
  if (kind == "annbatch") return torch_shards::AnnbatchCollection(path, {.dense = dense});
  return torch_shards::HDF5Source(path, "X");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6 || argc > 8 || (argc == 8 && std::string(argv[7]) != "dense")) {
    std::cerr << "usage: iterate (h5ad|hdf5|annbatch) PATH BLOCK_SIZE THREADS SECONDS [FETCH_FACTOR [dense]]\n";
    return 2;
  }
  const std::string kind = argv[1], path = argv[2];
  const int64_t block_size = std::stoll(argv[3]), threads = std::stoll(argv[4]);
  const double seconds = std::stod(argv[5]);
  const int64_t fetch_factor = argc > 6 ? std::stoll(argv[6]) : 16;
  std::optional<torch_shards::ShardedDataset> made;
  try {
    made.emplace(open(kind, path, argc == 8), torch_shards::BlockShuffling(block_size),
                 torch_shards::DatasetOptions{
                     .batch_size = 256, .fetch_factor = fetch_factor, .seed = 0, .num_threads = threads});
  } catch (const c10::Error& error) {
    std::cerr << "iterate: " << error.msg() << "\n";
    return 1;
  }
  const torch_shards::ShardedDataset& dataset = *made;
  std::chrono::steady_clock::time_point start;
  double cpu_start = 0;
  bool started = false;
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  int64_t rows = 0;
  while (!started || elapsed() < seconds) {
    for (const auto& batch : dataset) {
      if (!started) {
        start = std::chrono::steady_clock::now();
        cpu_start = cpu_seconds();
        started = true;
        continue;
      }
      rows += batch.at("index").size(0);
      if (elapsed() >= seconds) break;
    }
  }
  std::cout << rows / elapsed() << " " << rows / (cpu_seconds() - cpu_start) << std::endl;
  return 0;
}
