// libFuzzer target: zarr metadata parsing and chunk decoding end to end.
// Input: a format byte (bit 0 clear: zarr.json, set: .zarray; the rest picks
// the chunk key), the metadata text, a NUL byte, then the bytes of the first
// chunk (or shard), written into a per-process scratch store; the array is
// opened and its first rows read, and it is read as strings. Only
// core::ReadError and core::InvalidArgument may come out.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/thread_pool.h"
#include "io/zarr/array.h"

namespace {

namespace fs = std::filesystem;

const std::string& scratch() {
  static const std::string directory = [] {
    const fs::path path = fs::temp_directory_path() / ("fuzz_zarr_" + std::to_string(::getpid()));
    fs::create_directories(path);
    return path.string();
  }();
  return directory;
}

void write(const fs::path& path, const uint8_t* data, size_t size) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool v3 = data[0] % 2 == 0;
  const uint8_t* text = data + 1;
  const uint8_t* end = data + size;
  const uint8_t* split = static_cast<const uint8_t*>(std::memchr(text, 0, static_cast<size_t>(end - text)));
  const size_t text_size = static_cast<size_t>((split ? split : end) - text);
  const uint8_t* chunk = split ? split + 1 : end;
  const size_t chunk_size = static_cast<size_t>(end - chunk);
  const fs::path store = scratch();
  std::error_code ignored;
  fs::remove_all(store, ignored);
  write(store / (v3 ? "zarr.json" : ".zarray"), text, text_size);
  static const char* const kKeys[] = {"0", "0.0", "0/0", "c/0", "c/0/0", "c.0.0"};
  write(store / kKeys[(data[0] >> 1) % 6], chunk, chunk_size);
  torch_shards::core::ThreadPool pool(0);
  try {
    const auto array = torch_shards::io::open_zarr_array(store.string(), "/");
    const int64_t rows = std::min<int64_t>(array->num_rows(), 4);
    if (array->row_bytes() <= (size_t{1} << 20)) {
      std::vector<uint8_t> out(static_cast<size_t>(rows) * array->row_bytes());
      array->read({torch_shards::io::Segment{0, rows, 0}}, out.data(), pool);
    }
  } catch (const torch_shards::core::ReadError&) {
  } catch (const torch_shards::core::InvalidArgument&) {
  }
  try {
    torch_shards::io::read_zarr_strings(store.string(), "/");
  } catch (const torch_shards::core::ReadError&) {
  } catch (const torch_shards::core::InvalidArgument&) {
  }
  return 0;
}
