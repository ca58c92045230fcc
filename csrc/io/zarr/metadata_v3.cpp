// zarr v3: zarr.json, its codecs and the sharding_indexed codec.
#include <stdexcept>

#include "core/errors.h"
#include "io/text.h"
#include "io/zarr/json.h"
#include "io/zarr/metadata.h"

namespace torch_shards::io::zarr {

using core::concat;
using core::ReadError;
using json = nlohmann::json;

namespace {

// A codec entry: {"name": ..., "configuration": {...}}, or just its name.
std::pair<std::string, json> codec_entry(const json& codec, const MetadataReader& reader) {
  if (codec.is_string()) return {codec.get<std::string>(), json::object()};
  const std::string name = reader.string(reader.member(codec, "name"), "name");
  json configuration = codec.contains("configuration") ? codec["configuration"] : json::object();
  if (!configuration.is_object()) reader.fail(concat("configuration of codec '", name, "' is not an object"));
  return {name, configuration};
}

std::optional<BytesCodec> v3_bytes_codec(const std::string& name) {
  if (name == "blosc" || name == "numcodecs.blosc") return BytesCodec::kBlosc;
  if (name == "gzip" || name == "numcodecs.gzip") return BytesCodec::kGzip;
  if (name == "zstd" || name == "numcodecs.zstd") return BytesCodec::kZstd;
  if (name == "numcodecs.zlib") return BytesCodec::kZlib;
  if (name == "crc32c" || name == "numcodecs.crc32c") return BytesCodec::kCrc32c;
  return std::nullopt;
}

bool parse_endian(const json& configuration, const MetadataReader& reader) {
  if (!configuration.contains("endian") || configuration["endian"].is_null()) return false;
  const std::string endian = reader.string(configuration["endian"], "endian");
  if (endian != "little" && endian != "big") reader.fail(concat("invalid endian '", endian, "'"));
  return endian == "big";
}

std::vector<int64_t> parse_transpose_order(const json& configuration, size_t dims, const MetadataReader& reader) {
  // The specification's form only: a list of integers permuting the axes
  // (zarr-python refuses the "C" / "F" strings of early drafts too).
  const json& order = reader.member(configuration, "order");
  if (!order.is_array()) reader.fail(concat("transpose order ", json_text(order), " is not a list of axes"));
  const std::vector<int64_t> permutation = reader.shape(order, "order", 0);
  if (permutation.size() != dims) {
    reader.fail(concat("transpose order ", json_text(order), " has ", permutation.size(), " axes, the array ", dims));
  }
  std::vector<bool> seen(dims, false);
  for (int64_t axis : permutation) {
    if (axis >= static_cast<int64_t>(dims) || seen[static_cast<size_t>(axis)]) {
      reader.fail(concat("transpose order ", json_text(order), " is not a permutation of ", dims, " axes"));
    }
    seen[static_cast<size_t>(axis)] = true;
  }
  return permutation;
}

void parse_v3_codecs(const json& codecs, ZarrMetadata& meta, CodecChain& chain, bool inside_shard,
                     const MetadataReader& reader);

void parse_sharding(const json& configuration, ZarrMetadata& meta, const MetadataReader& reader) {
  ShardLayout layout;
  layout.inner_chunk_shape = reader.shape(reader.member(configuration, "chunk_shape"), "chunk_shape", 1);
  if (layout.inner_chunk_shape.size() != meta.shape.size()) {
    reader.fail("sharding chunk_shape and the array's shape differ in length");
  }
  for (size_t d = 0; d < meta.shape.size(); ++d) {
    if (meta.chunk_shape[d] % layout.inner_chunk_shape[d] != 0) {
      reader.fail(concat("shard shape ", json_text(json(meta.chunk_shape)),
                         " is not a multiple of the inner chunk shape ", json_text(json(layout.inner_chunk_shape))));
    }
  }
  parse_v3_codecs(reader.member(configuration, "codecs"), meta, meta.chain, /*inside_shard=*/true, reader);

  const json index_codecs =
      configuration.contains("index_codecs")
          ? configuration["index_codecs"]
          : json::array({json{{"name", "bytes"}, {"configuration", {{"endian", "little"}}}}, json{{"name", "crc32c"}}});
  if (!index_codecs.is_array()) reader.fail("index_codecs is not a list");
  bool seen_bytes = false;
  for (const json& codec : index_codecs) {
    const auto [name, codec_configuration] = codec_entry(codec, reader);
    if (name == "bytes" && !seen_bytes) {
      layout.index_big_endian = parse_endian(codec_configuration, reader);
      seen_bytes = true;
    } else if (name == "crc32c" && seen_bytes && !layout.index_crc32c) {
      layout.index_crc32c = true;
    } else {
      throw core::Unsupported(concat("unsupported zarr shard index codec '", name, "' in ", meta.where));
    }
  }
  if (!seen_bytes) reader.fail("index_codecs lack the \"bytes\" codec");
  if (configuration.contains("index_location")) {
    const std::string location = reader.string(configuration["index_location"], "index_location");
    if (location != "start" && location != "end") reader.fail(concat("invalid index_location '", location, "'"));
    layout.index_at_start = location == "start";
  }
  meta.sharding = std::move(layout);
}

void parse_v3_codecs(const json& codecs, ZarrMetadata& meta, CodecChain& chain, bool inside_shard,
                     const MetadataReader& reader) {
  if (!codecs.is_array()) reader.fail("\"codecs\" is not a list");
  bool seen_array_to_bytes = false;
  for (const json& codec : codecs) {
    const auto [name, configuration] = codec_entry(codec, reader);
    if (name == "transpose") {
      if (seen_array_to_bytes) reader.fail("transpose after the array->bytes codec");
      chain.transposes.push_back(parse_transpose_order(configuration, meta.shape.size(), reader));
      continue;
    }
    if (name == "bytes" || name == "endian" || name == "vlen-utf8" || name == "vlen-bytes" ||
        name == "sharding_indexed") {
      if (seen_array_to_bytes) reader.fail(concat("more than one array->bytes codec ('", name, "')"));
      seen_array_to_bytes = true;
      if (name == "bytes" || name == "endian") {
        chain.array_to_bytes = ArrayToBytes::kBytes;
        chain.big_endian = parse_endian(configuration, reader);
      } else if (name == "vlen-utf8") {
        chain.array_to_bytes = ArrayToBytes::kVLenUtf8;
      } else if (name == "vlen-bytes") {
        chain.array_to_bytes = ArrayToBytes::kVLenBytes;
      } else {
        if (inside_shard)
          throw core::Unsupported(
              concat("unsupported zarr codec 'sharding_indexed' nested in a shard in ", meta.where));
        if (!chain.transposes.empty()) {
          throw core::Unsupported(
              concat("unsupported zarr codec chain (transpose before sharding_indexed) in ", meta.where));
        }
        parse_sharding(configuration, meta, reader);
      }
      continue;
    }
    const std::optional<BytesCodec> bytes_codec = v3_bytes_codec(name);
    if (!bytes_codec) throw core::Unsupported(concat("unsupported zarr codec '", name, "' in ", meta.where));
    if (!seen_array_to_bytes) reader.fail(concat("bytes->bytes codec '", name, "' before the array->bytes codec"));
    if (meta.sharding && !inside_shard) {
      throw core::Unsupported(
          concat("unsupported zarr codec chain ('", name, "' after sharding_indexed) in ", meta.where));
    }
    chain.bytes_codecs.push_back(*bytes_codec);
  }
  if (!seen_array_to_bytes) reader.fail("no array->bytes codec (\"bytes\") in \"codecs\"");
}

}  // namespace

void parse_v3(const json& zarr_json, ZarrMetadata& meta) {
  const MetadataReader reader(meta.where, "zarr.json");
  if (zarr_json.contains("zarr_format") && zarr_json["zarr_format"] != 3) {
    reader.fail(concat("zarr_format is ", json_text(zarr_json["zarr_format"]), ", expected 3"));
  }
  meta.format = 3;
  meta.shape = reader.shape(reader.member(zarr_json, "shape"), "shape", 0);

  const json& data_type = reader.member(zarr_json, "data_type");
  std::string type_name;
  json type_configuration = json::object();
  if (data_type.is_object()) {
    type_name = reader.string(reader.member(data_type, "name"), "data_type name");
    if (data_type.contains("configuration")) type_configuration = data_type["configuration"];
  } else {
    type_name = reader.string(data_type, "data_type");
  }
  meta.type_name = type_name;
  const auto length_bytes = [&]() {
    const int64_t length = reader.integer(reader.member(type_configuration, "length_bytes"), "length_bytes");
    if (length < 1 || length > (int64_t{1} << 31)) reader.fail(concat("length_bytes of ", length));
    return static_cast<size_t>(length);
  };
  if (type_name == "string" || type_name == "variable_length_utf8") {
    meta.kind = ElementKind::kVLenUtf8;
  } else if (type_name == "bytes" || type_name == "variable_length_bytes") {
    meta.kind = ElementKind::kVLenBytes;
  } else if (type_name == "fixed_length_utf32") {
    meta.kind = ElementKind::kFixedUtf32;
    meta.item_size = length_bytes();
    if (meta.item_size % 4 != 0) reader.fail("fixed_length_utf32 length_bytes is not a multiple of 4");
  } else if (type_name == "null_terminated_bytes" || type_name == "fixed_length_bytes") {
    meta.kind = ElementKind::kFixedBytes;
    meta.item_size = length_bytes();
  } else {
    try {
      meta.dtype = parse_zarr_v3_dtype(type_name);
    } catch (const std::invalid_argument&) {
      throw core::Unsupported(concat(meta.where, ": unsupported zarr data_type '", type_name, "'"));
    }
    meta.item_size = dtype_size(meta.dtype);
  }

  const json& grid = reader.member(zarr_json, "chunk_grid");
  const std::string grid_name = reader.string(reader.member(grid, "name"), "chunk_grid name");
  if (grid_name != "regular")
    throw core::Unsupported(concat(meta.where, ": unsupported zarr chunk grid '", grid_name, "'"));
  meta.chunk_shape = reader.shape(reader.member(reader.member(grid, "configuration"), "chunk_shape"), "chunk_shape", 1);
  if (meta.chunk_shape.size() != meta.shape.size()) reader.fail("chunk_shape and shape differ in length");

  meta.keys = ChunkKeys{true, '/'};
  if (zarr_json.contains("chunk_key_encoding")) {
    const json& encoding = zarr_json["chunk_key_encoding"];
    const std::string name = reader.string(reader.member(encoding, "name"), "chunk_key_encoding name");
    if (name == "v2") {
      meta.keys = ChunkKeys{false, '.'};
    } else if (name != "default") {
      throw core::Unsupported(concat(meta.where, ": unsupported zarr chunk_key_encoding '", name, "'"));
    }
    if (encoding.contains("configuration") && encoding["configuration"].contains("separator")) {
      const std::string separator = reader.string(encoding["configuration"]["separator"], "separator");
      if (separator != "." && separator != "/") reader.fail(concat("invalid separator '", separator, "'"));
      meta.keys.separator = separator[0];
    }
  }
  if (zarr_json.contains("storage_transformers") && !zarr_json["storage_transformers"].is_null() &&
      !zarr_json["storage_transformers"].empty()) {
    throw core::Unsupported(concat(meta.where, ": unsupported zarr storage_transformers"));
  }
  parse_v3_codecs(reader.member(zarr_json, "codecs"), meta, meta.chain, /*inside_shard=*/false, reader);
  meta.fill_value = reader.member(zarr_json, "fill_value");  // required by the specification
}

}  // namespace torch_shards::io::zarr
