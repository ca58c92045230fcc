// Reads epochs of a file through torch_shards' C++ API and prints rows/s, for
// benchmarks/cpp_iteration.py to compare with Python's in-process iteration
// of the same native dataset.
//
//   iterate (h5ad|hdf5) PATH BLOCK_SIZE THREADS SECONDS
#include <torch_shards/torch_shards.h>

#include <chrono>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
  if (argc != 6) {
    std::cerr << "usage: iterate (h5ad|hdf5) PATH BLOCK_SIZE THREADS SECONDS\n";
    return 2;
  }
  const std::string kind = argv[1], path = argv[2];
  const int64_t block_size = std::stoll(argv[3]), threads = std::stoll(argv[4]);
  const double seconds = std::stod(argv[5]);
  const torch_shards::Source source = kind == "h5ad" ? torch_shards::Source(torch_shards::AnnDataSource(path))
                                                     : torch_shards::Source(torch_shards::HDF5Source(path, "X"));
  torch_shards::ShardedDataset dataset(source, torch_shards::BlockShuffling(block_size),
                                       {.batch_size = 256, .fetch_factor = 16, .seed = 0, .num_threads = threads});
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  int64_t rows = 0;
  while (elapsed() < seconds) {
    for (const auto& batch : dataset) {
      rows += batch.at("index").size(0);
      if (elapsed() >= seconds) break;
    }
  }
  std::cout << rows / elapsed() << std::endl;
  return 0;
}
