// What a zarr array's metadata says, in one model for both formats: v2
// (.zarray) and v3 (zarr.json, with the sharding_indexed codec).
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/dtype.h"

namespace torch_shards::io::zarr {

using json = nlohmann::json;

enum class BytesCodec { kBlosc, kGzip, kZlib, kZstd, kCrc32c };

enum class ArrayToBytes { kBytes, kVLenUtf8, kVLenBytes };

// How one chunk (or one inner chunk of a shard) is encoded, in encoding order:
// array->array transposes, then the array->bytes step, then bytes->bytes codecs.
struct CodecChain {
  std::vector<std::vector<int64_t>> transposes;  // each an order permutation
  ArrayToBytes array_to_bytes = ArrayToBytes::kBytes;
  bool big_endian = false;
  std::vector<BytesCodec> bytes_codecs;
};

struct ShardLayout {
  std::vector<int64_t> inner_chunk_shape;
  bool index_at_start = false;
  bool index_big_endian = false;
  bool index_crc32c = false;
};

enum class ElementKind { kNumeric, kVLenUtf8, kVLenBytes, kFixedUtf32, kFixedBytes };

struct ChunkKeys {
  bool v3_default = true;  // "c/0/1" rather than "0.1"
  char separator = '/';

  std::string key(const std::vector<int64_t>& coords) const {
    std::string key = v3_default ? "c" : "";
    for (size_t i = 0; i < coords.size(); ++i) {
      if (v3_default || i > 0) key += separator;
      key += std::to_string(coords[i]);
    }
    if (key.empty()) key = "0";  // 0-d v2 arrays
    return key;
  }
};

struct ZarrMetadata {
  std::string store, path, dir, where;
  int format = 2;
  std::vector<int64_t> shape;
  std::vector<int64_t> chunk_shape;  // of the chunk grid (whole shards when sharded)
  ElementKind kind = ElementKind::kNumeric;
  DType dtype = DType::kUInt8;
  size_t item_size = 1;  // bytes per element, fixed-size kinds
  std::string type_name;
  json fill_value;
  ChunkKeys keys;
  CodecChain chain;  // of each chunk, or of each inner chunk when sharded
  std::optional<ShardLayout> sharding;

  // Shape of the chunks that are read and decoded one by one.
  const std::vector<int64_t>& read_chunk_shape() const { return sharding ? sharding->inner_chunk_shape : chunk_shape; }
};

const char* bytes_codec_name(BytesCodec codec);

// The axes in reverse: the transpose of Fortran order.
std::vector<int64_t> reversed_order(size_t dims);

// The metadata of the array at `path` in the store (either format). Throws
// ReadError naming the store and the path for anything missing or malformed,
// Unsupported for what is valid but not read here.
ZarrMetadata read_metadata(const std::string& store, const std::string& path);

// One format's metadata file into `meta` (whose store, path, dir and where are set).
void parse_v2(const json& zarray, ZarrMetadata& meta);
void parse_v3(const json& zarr_json, ZarrMetadata& meta);

}  // namespace torch_shards::io::zarr
