// One-dimensional arrays stored raw in files, as the GoogleTest suites read
// them: contiguous (an HDF5 contiguous dataset's layout), or in whole chunks
// of a fixed number of elements stored last chunk first (so that a chunk's
// place in the file is not its place in the array; the last one padded), read
// by copy or from a mapping of the file.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/chunked_array.h"
#include "io/contiguous_array.h"
#include "io/file.h"
#include "temp_dir.h"

namespace torch_shards::testing_support {

enum class RawLayout { kContiguous, kChunksLastFirst };

// Chunk c of `chunks` lies at byte (chunks - 1 - c) * chunk_bytes of the file.
class LastFirstChunks : public io::ChunkStore {
 public:
  LastFirstChunks(std::shared_ptr<const io::File> file, int64_t chunks, int64_t chunk_bytes)
      : file_(std::move(file)), chunks_(chunks), chunk_bytes_(chunk_bytes) {}
  bool can_locate() const override { return true; }
  bool locates_in_kept_files() const override { return true; }
  std::optional<io::ChunkLocation> locate(const std::vector<int64_t>& coords) const override {
    return io::ChunkLocation{file_, (chunks_ - 1 - coords[0]) * chunk_bytes_, chunk_bytes_};
  }
  std::optional<std::vector<uint8_t>> read_chunk(const std::vector<int64_t>& coords) const override {
    return file_->read_at((chunks_ - 1 - coords[0]) * chunk_bytes_, static_cast<size_t>(chunk_bytes_), "a chunk");
  }
  void open_files(std::vector<const io::File*>& files) const override { files.push_back(file_.get()); }

 private:
  std::shared_ptr<const io::File> file_;
  int64_t chunks_, chunk_bytes_;
};

// Chunks stored as they are read (no filter).
class StoredRaw : public io::ChunkDecoder {
 public:
  bool stores_raw() const override { return true; }
  void decode(std::vector<uint8_t>& encoded, uint8_t* out, size_t out_bytes) const override {
    std::memcpy(out, encoded.data(), out_bytes);
  }
};

// `values` written to dir/name in `layout` (chunks of chunk_elements), opened for reading with `access`.
template <typename T>
std::shared_ptr<const io::Array> raw_array(const TempDir& dir, const std::string& name, const std::vector<T>& values,
                                           io::DType dtype, RawLayout layout, io::File::Access access,
                                           int64_t chunk_elements = 1000) {
  const std::string path = dir / name;
  const auto count = static_cast<int64_t>(values.size());
  const auto* bytes = reinterpret_cast<const uint8_t*>(values.data());
  io::ArrayInfo info{path, "/X/" + name, dtype, {count}, false};
  if (layout == RawLayout::kContiguous) {
    write_file(path, std::vector<uint8_t>(bytes, bytes + values.size() * sizeof(T)));
    return std::make_shared<io::ContiguousArray>(info, std::make_shared<io::File>(path, access), 0);
  }
  const int64_t chunks = (count + chunk_elements - 1) / chunk_elements;
  const auto chunk_bytes = static_cast<size_t>(chunk_elements) * sizeof(T);
  std::vector<uint8_t> file(static_cast<size_t>(chunks) * chunk_bytes, 0xEE);  // the last chunk's padding
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t elements = std::min(chunk_elements, count - c * chunk_elements);
    std::memcpy(file.data() + static_cast<size_t>(chunks - 1 - c) * chunk_bytes,
                bytes + static_cast<size_t>(c) * chunk_bytes, static_cast<size_t>(elements) * sizeof(T));
  }
  write_file(path, file);
  auto store = std::make_shared<LastFirstChunks>(std::make_shared<io::File>(path, access), chunks,
                                                 static_cast<int64_t>(chunk_bytes));
  return std::make_shared<io::ChunkedArray>(info, std::vector<int64_t>{chunk_elements}, store,
                                            std::make_shared<StoredRaw>(), std::vector<uint8_t>{});
}

}  // namespace torch_shards::testing_support
