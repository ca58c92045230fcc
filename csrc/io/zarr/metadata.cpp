#include "io/zarr/metadata.h"

#include "core/errors.h"
#include "io/text.h"
#include "io/zarr/array.h"
#include "io/zarr/json.h"

namespace torch_shards::io::zarr {

using core::concat;
using core::ReadError;
using json = nlohmann::json;

const char* bytes_codec_name(BytesCodec codec) {
  switch (codec) {
    case BytesCodec::kBlosc:
      return "blosc";
    case BytesCodec::kGzip:
      return "gzip";
    case BytesCodec::kZlib:
      return "zlib";
    case BytesCodec::kZstd:
      return "zstd";
    case BytesCodec::kCrc32c:
      return "crc32c";
  }
  return "?";
}

std::vector<int64_t> reversed_order(size_t dims) {
  std::vector<int64_t> order(dims);
  for (size_t d = 0; d < dims; ++d) order[d] = static_cast<int64_t>(dims - 1 - d);
  return order;
}

ZarrMetadata read_metadata(const std::string& store, const std::string& path) {
  ZarrMetadata meta;
  meta.store = store;
  meta.path = normalize_zarr_path(path);
  meta.dir = node_directory(store, meta.path);
  meta.where = concat(store, ":", meta.path);
  if (std::optional<json> zarr_json = read_json_file(meta.dir, "zarr.json", meta.where)) {
    const json node_type = zarr_json->contains("node_type") ? (*zarr_json)["node_type"] : json();
    if (node_type != "array") {
      throw ReadError(concat(meta.where, ": not a zarr array (node_type ", json_text(node_type), ")"));
    }
    parse_v3(*zarr_json, meta);
  } else if (std::optional<json> zarray = read_json_file(meta.dir, ".zarray", meta.where)) {
    parse_v2(*zarray, meta);
  } else {
    throw ReadError(concat(meta.where, ": no zarr array there (neither .zarray nor zarr.json)"));
  }
  const bool numeric = meta.kind == ElementKind::kNumeric;
  const bool fixed = numeric || meta.kind == ElementKind::kFixedUtf32 || meta.kind == ElementKind::kFixedBytes;
  if (fixed != (meta.chain.array_to_bytes == ArrayToBytes::kBytes)) {
    throw ReadError(concat(meta.where, ": data type '", meta.type_name, "' does not match its array->bytes codec"));
  }
  return meta;
}

}  // namespace torch_shards::io::zarr
