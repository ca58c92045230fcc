#include "zarr_array.h"

#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>

#include "../core/errors.h"
#include "chunked_array.h"
#include "codecs.h"
#include "file.h"
#include "storage/url.h"
#include "text.h"

namespace torch_shards::io {

using core::concat;
using core::FileNotFound;
using core::ReadError;
using json = nlohmann::json;

namespace {

constexpr uint64_t kMissingEntry = std::numeric_limits<uint64_t>::max();
// Largest decoded size a frame header is trusted to announce (guards against
// corrupt headers asking for absurd allocations).
constexpr size_t kMaxRecordedSize = size_t{1} << 32;
// String arrays are read whole: more chunks than this, or more strings in
// chunks never written than in written ones (beyond this many), is a corrupt
// shape, not an array anyone wrote.
constexpr int64_t kMaxStringChunks = int64_t{1} << 22;
constexpr uint64_t kMaxFillStrings = uint64_t{1} << 20;

// ---------------------------------------------------------------------------
// Paths and JSON

std::string node_directory(const std::string& store, const std::string& path) {
  return path == "/" ? store : store + path;
}

std::string format_coords(const std::vector<int64_t>& coords) {
  std::string text = "(";
  for (size_t i = 0; i < coords.size(); ++i) text += (i ? ", " : "") + std::to_string(coords[i]);
  return text + (coords.size() == 1 ? ",)" : ")");
}

// Python's json module (which zarr-python 2 used) writes bare NaN, Infinity
// and -Infinity; nlohmann rejects them. They are swapped for marker strings,
// parsed, and turned back into numbers.
const char kNanMarker[] = "\x01NaN";
const char kInfMarker[] = "\x01Infinity";
const char kNegInfMarker[] = "\x01-Infinity";

std::string quote_nonfinite_tokens(const std::string& text) {
  std::string out;
  out.reserve(text.size() + 16);
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) {
        out += text[++i];
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      out += c;
      continue;
    }
    const auto token = [&](const char* word, const char* marker) {
      const size_t n = std::strlen(word);
      if (text.compare(i, n, word) != 0) return false;
      out += json(marker).dump();
      i += n - 1;
      return true;
    };
    if (token("-Infinity", kNegInfMarker) || token("Infinity", kInfMarker) || token("NaN", kNanMarker)) continue;
    out += c;
  }
  return out;
}

void restore_nonfinite(json& value) {
  if (value.is_string()) {
    const std::string text = value.get<std::string>();
    if (text == kNanMarker) value = std::numeric_limits<double>::quiet_NaN();
    if (text == kInfMarker) value = std::numeric_limits<double>::infinity();
    if (text == kNegInfMarker) value = -std::numeric_limits<double>::infinity();
  } else if (value.is_structured()) {
    for (auto& item : value) restore_nonfinite(item);
  }
}

json parse_json(const std::string& text) {
  try {
    return json::parse(text);
  } catch (const json::parse_error&) {
    json value = json::parse(quote_nonfinite_tokens(text));  // rethrows the error if still invalid
    restore_nonfinite(value);
    return value;
  }
}

// The JSON object in dir/name, or nullopt if there is no such file.
std::optional<json> read_json_file(const std::string& dir, const std::string& name, const std::string& where) {
  const std::string file = dir + "/" + name;
  if (!file_exists(file)) return std::nullopt;
  const std::vector<uint8_t> bytes = read_whole_file(file);
  json value;
  try {
    value = parse_json(std::string(bytes.begin(), bytes.end()));
  } catch (const json::exception& error) {
    throw core::MetadataError(concat(where, ": invalid JSON in ", name, ": ", printable(error.what())));
  }
  if (!value.is_object()) throw core::MetadataError(concat(where, ": ", name, " is not a JSON object"));
  return value;
}

std::string node_type_of(const std::string& dir) {
  const std::string file = dir + "/zarr.json";
  if (!file_exists(file)) return "";
  try {
    const std::vector<uint8_t> bytes = read_whole_file(file);
    const json value = parse_json(std::string(bytes.begin(), bytes.end()));
    if (value.is_object() && value.contains("node_type") && value["node_type"].is_string()) {
      return value["node_type"].get<std::string>();
    }
  } catch (const std::exception&) {
    // An unreadable zarr.json is no node; opening it reports why.
  }
  return "";
}

// Helpers that turn malformed metadata into ReadErrors naming the array.
class MetadataReader {
 public:
  MetadataReader(std::string where, std::string file) : where_(std::move(where)), file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& message) const {
    throw ReadError(concat(where_, ": ", file_, ": ", message));
  }
  const std::string& where() const { return where_; }

  const json& member(const json& object, const char* key) const {
    if (!object.is_object() || !object.contains(key)) fail(concat("missing \"", key, "\""));
    return object[key];
  }
  std::string string(const json& value, const char* what) const {
    if (!value.is_string()) fail(concat("\"", what, "\" is not a string: ", json_text(value)));
    return value.get<std::string>();
  }
  int64_t integer(const json& value, const char* what) const {
    if (!value.is_number_integer()) fail(concat("\"", what, "\" is not an integer: ", json_text(value)));
    if (value.is_number_unsigned() &&
        value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail(concat("\"", what, "\" is ", value.get<uint64_t>(), ", above 2^63 - 1"));
    }
    return value.get<int64_t>();
  }
  std::vector<int64_t> shape(const json& value, const char* what, int64_t minimum) const {
    if (!value.is_array()) fail(concat("\"", what, "\" is not a list: ", json_text(value)));
    std::vector<int64_t> shape;
    for (const json& item : value) {
      shape.push_back(integer(item, what));
      if (shape.back() < minimum) fail(concat("\"", what, "\" has an entry below ", minimum, ": ", json_text(value)));
    }
    return shape;
  }

 private:
  std::string where_;
  std::string file_;
};

// ---------------------------------------------------------------------------
// Metadata model shared by both formats

enum class BytesCodec { kBlosc, kGzip, kZlib, kZstd, kCrc32c };

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

std::vector<int64_t> reversed_order(size_t dims) {
  std::vector<int64_t> order(dims);
  for (size_t d = 0; d < dims; ++d) order[d] = static_cast<int64_t>(dims - 1 - d);
  return order;
}

// ---------------------------------------------------------------------------
// zarr v2

std::optional<BytesCodec> v2_compressor(const std::string& id) {
  if (id == "blosc") return BytesCodec::kBlosc;
  if (id == "zstd") return BytesCodec::kZstd;
  if (id == "zlib") return BytesCodec::kZlib;
  if (id == "gzip") return BytesCodec::kGzip;
  return std::nullopt;
}

void parse_v2(const json& zarray, ZarrMetadata& meta) {
  const MetadataReader reader(meta.where, ".zarray");
  if (zarray.contains("zarr_format") && zarray["zarr_format"] != 2) {
    reader.fail(concat("zarr_format is ", json_text(zarray["zarr_format"]), ", expected 2"));
  }
  meta.format = 2;
  meta.shape = reader.shape(reader.member(zarray, "shape"), "shape", 0);
  meta.chunk_shape = reader.shape(reader.member(zarray, "chunks"), "chunks", 1);
  if (meta.chunk_shape.size() != meta.shape.size()) reader.fail("\"chunks\" and \"shape\" differ in length");

  std::vector<std::string> filters;
  if (zarray.contains("filters") && !zarray["filters"].is_null()) {
    if (!zarray["filters"].is_array()) reader.fail("\"filters\" is not a list");
    for (const json& filter : zarray["filters"]) filters.push_back(reader.string(reader.member(filter, "id"), "id"));
  }
  const json& dtype = reader.member(zarray, "dtype");
  if (!dtype.is_string()) {
    throw core::Unsupported(concat(meta.where, ": unsupported zarr dtype ", json_text(dtype), " (structured)"));
  }
  const std::string typestr = dtype.get<std::string>();
  meta.type_name = typestr;
  const auto unsupported_filter = [&](const std::string& id) {
    throw core::Unsupported(concat("unsupported zarr filter '", id, "' in ", meta.where));
  };
  const auto fixed_length = [&](size_t unit) {
    // numpy's "<U12" / "|S5": a positive count of characters, digits only.
    const std::string digits = typestr.substr(2);
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos ||
        std::stoul(digits) == 0) {
      throw core::Unsupported(concat(meta.where, ": unsupported zarr dtype '", printable(typestr), "'"));
    }
    return std::stoul(digits) * unit;
  };
  if (typestr == "|O") {
    if (filters.empty()) throw ReadError(concat(meta.where, ": object dtype '|O' without an object codec filter"));
    if (filters[0] == "vlen-utf8") {
      meta.kind = ElementKind::kVLenUtf8;
    } else if (filters[0] == "vlen-bytes") {
      meta.kind = ElementKind::kVLenBytes;
    } else {
      unsupported_filter(filters[0]);
    }
    if (filters.size() > 1) unsupported_filter(filters[1]);
    meta.chain.array_to_bytes =
        meta.kind == ElementKind::kVLenUtf8 ? ArrayToBytes::kVLenUtf8 : ArrayToBytes::kVLenBytes;
  } else {
    if (!filters.empty()) unsupported_filter(filters[0]);
    if (typestr.size() >= 3 && typestr[1] == 'U' && typestr[0] != '|') {
      meta.kind = ElementKind::kFixedUtf32;
      meta.item_size = fixed_length(4);
      meta.chain.big_endian = typestr[0] == '>';
    } else if (typestr.size() >= 3 && typestr[1] == 'S') {
      meta.kind = ElementKind::kFixedBytes;
      meta.item_size = fixed_length(1);
    } else {
      try {
        meta.dtype = parse_numpy_typestr(typestr, meta.chain.big_endian);
      } catch (const std::invalid_argument&) {
        throw core::Unsupported(concat(meta.where, ": unsupported zarr dtype '", typestr, "'"));
      }
      meta.item_size = dtype_size(meta.dtype);
    }
  }

  if (zarray.contains("compressor") && !zarray["compressor"].is_null()) {
    const std::string id = reader.string(reader.member(zarray["compressor"], "id"), "id");
    const std::optional<BytesCodec> codec = v2_compressor(id);
    if (!codec) throw core::Unsupported(concat("unsupported zarr compressor '", id, "' in ", meta.where));
    meta.chain.bytes_codecs.push_back(*codec);
  }
  // Required by the specification, as zarr-python requires it: read as C
  // order, an F-order array whose "order" was lost has its rows permuted.
  if (!zarray.contains("order")) reader.fail("missing \"order\" (\"C\" or \"F\"; required in zarr v2 metadata)");
  const std::string order = reader.string(zarray["order"], "order");
  if (order == "F") {
    if (meta.shape.size() > 1) meta.chain.transposes.push_back(reversed_order(meta.shape.size()));
  } else if (order != "C") {
    reader.fail(concat("invalid order '", order, "'"));
  }
  // Required by the specification (null allowed): without it, a reader cannot know what never-written chunks hold.
  meta.fill_value = reader.member(zarray, "fill_value");
  meta.keys.v3_default = false;
  meta.keys.separator = '.';
  if (zarray.contains("dimension_separator") && !zarray["dimension_separator"].is_null()) {
    const std::string separator = reader.string(zarray["dimension_separator"], "dimension_separator");
    if (separator != "." && separator != "/") reader.fail(concat("invalid dimension_separator '", separator, "'"));
    meta.keys.separator = separator[0];
  }
}

// ---------------------------------------------------------------------------
// zarr v3

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

// ---------------------------------------------------------------------------
// Fill values

void store_little_endian(uint64_t bits, size_t size, uint8_t* out) {
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<uint8_t>(bits >> (8 * i));
}

std::optional<uint64_t> hex_bits(const json& value) {
  if (!value.is_string()) return std::nullopt;
  const std::string& text = value.get_ref<const std::string&>();
  if (text.size() < 3 || text.size() > 18 || text[0] != '0' || (text[1] != 'x' && text[1] != 'X')) return std::nullopt;
  if (text.find_first_not_of("0123456789abcdefABCDEF", 2) != std::string::npos) return std::nullopt;
  return std::stoull(text.substr(2), nullptr, 16);
}

uint16_t half_from_float(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7fffffff;
  if (magnitude > 0x7f800000) return sign | 0x7e00;                       // NaN
  if (magnitude < 0x38800000) {                                           // zero or subnormal half (below 2^-14)
    const float scaled = std::nearbyint(std::fabs(value) * 16777216.0f);  // units of 2^-24; 1024 is the smallest normal
    return sign | static_cast<uint16_t>(scaled);
  }
  const int32_t exponent = static_cast<int32_t>(magnitude >> 23) - 127 + 15;
  if (exponent >= 31) return sign | 0x7c00;  // overflow, or infinity
  uint32_t half = (static_cast<uint32_t>(exponent) << 10) | ((magnitude & 0x7fffff) >> 13);
  const uint32_t rest = magnitude & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;  // round to nearest even; may carry into infinity
  return sign | static_cast<uint16_t>(half);
}

uint16_t bfloat16_from_float(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

double float_fill(const json& value) {
  if (value.is_number()) return value.get<double>();
  if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    if (text == "NaN" || text == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (text == "Infinity" || text == "inf") return std::numeric_limits<double>::infinity();
    if (text == "-Infinity" || text == "-inf") return -std::numeric_limits<double>::infinity();
  }
  throw std::invalid_argument("not a floating-point value");
}

// One real floating-point value of `size` bytes, little-endian.
void encode_float_fill(const json& value, DType dtype, uint8_t* out) {
  const size_t size = dtype_size(dtype);
  if (const std::optional<uint64_t> bits = hex_bits(value)) return store_little_endian(*bits, size, out);
  const double number = float_fill(value);
  switch (dtype) {
    case DType::kFloat16:
      return store_little_endian(half_from_float(static_cast<float>(number)), 2, out);
    case DType::kBFloat16:
      return store_little_endian(bfloat16_from_float(static_cast<float>(number)), 2, out);
    case DType::kFloat32: {
      const float single = static_cast<float>(number);
      uint32_t bits;
      std::memcpy(&bits, &single, 4);
      return store_little_endian(bits, 4, out);
    }
    default: {
      uint64_t bits;
      std::memcpy(&bits, &number, 8);
      return store_little_endian(bits, 8, out);
    }
  }
}

uint64_t integer_fill(const json& value, DType dtype) {
  if (value.is_boolean()) return value.get<bool>() ? 1 : 0;
  if (const std::optional<uint64_t> bits = hex_bits(value)) return *bits;
  const bool is_signed =
      dtype == DType::kInt8 || dtype == DType::kInt16 || dtype == DType::kInt32 || dtype == DType::kInt64;
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer()) {
    const int64_t number = value.get<int64_t>();
    if (number < 0 && !is_signed) throw std::invalid_argument("negative value for an unsigned type");
    return static_cast<uint64_t>(number);
  }
  if (value.is_number_float()) {
    const double number = value.get<double>();
    if (number != std::floor(number) || std::fabs(number) > 9.2e18) throw std::invalid_argument("not an integer");
    return static_cast<uint64_t>(static_cast<int64_t>(number));
  }
  throw std::invalid_argument("not an integer");
}

// One element of the fill value in stored byte order.
std::vector<uint8_t> numeric_fill_bytes(const ZarrMetadata& meta) {
  const DType dtype = meta.dtype;
  std::vector<uint8_t> bytes(dtype_size(dtype), 0);
  const json& value = meta.fill_value;
  if (value.is_null()) return bytes;
  try {
    switch (dtype) {
      case DType::kBool:
        if (value.is_boolean()) {
          bytes[0] = value.get<bool>();
        } else if (value.is_number()) {
          bytes[0] = value.get<double>() != 0;
        } else {
          throw std::invalid_argument("not a boolean");
        }
        break;
      case DType::kFloat16:
      case DType::kBFloat16:
      case DType::kFloat32:
      case DType::kFloat64:
        encode_float_fill(value, dtype, bytes.data());
        break;
      case DType::kComplex64:
      case DType::kComplex128: {
        const DType part = dtype == DType::kComplex64 ? DType::kFloat32 : DType::kFloat64;
        const size_t half = bytes.size() / 2;
        if (value.is_array()) {
          if (value.size() != 2) throw std::invalid_argument("complex fill_value needs [real, imaginary]");
          encode_float_fill(value[0], part, bytes.data());
          encode_float_fill(value[1], part, bytes.data() + half);
        } else {
          encode_float_fill(value, part, bytes.data());
          encode_float_fill(0.0, part, bytes.data() + half);
        }
        break;
      }
      default:
        store_little_endian(integer_fill(value, dtype), bytes.size(), bytes.data());
        break;
    }
  } catch (const std::exception& error) {
    throw ReadError(concat(meta.where, ": invalid fill_value ", json_text(value), " for ", dtype_name(dtype), " (",
                           error.what(), ")"));
  }
  if (meta.chain.big_endian)
    codecs::byteswap(bytes.data(), bytes.size() / dtype_swap_unit(dtype), dtype_swap_unit(dtype));
  return bytes;
}

// ---------------------------------------------------------------------------
// Decoding

codecs::Codec decompressor(BytesCodec codec) {
  switch (codec) {
    case BytesCodec::kBlosc:
      return codecs::Codec::kBlosc;
    case BytesCodec::kGzip:
      return codecs::Codec::kGzip;
    case BytesCodec::kZlib:
      return codecs::Codec::kZlib;
    case BytesCodec::kZstd:
      return codecs::Codec::kZstd;
    case BytesCodec::kCrc32c:
      break;
  }
  throw std::logic_error("not a decompressor");
}

// The decoded size a compressed frame records (blosc and zstd headers), for
// chunks whose decoded size the metadata does not give (variable-length
// strings), checked against the frame before it is used to allocate. zlib and
// gzip record none: undo_bytes_codecs inflates them into a growing buffer.
size_t recorded_decoded_size(BytesCodec codec, const std::vector<uint8_t>& data) {
  const codecs::DecodedSize found = codecs::decoded_size(decompressor(codec), data.data(), data.size());
  if (!found.exact) {
    throw std::runtime_error(
        concat("a ", bytes_codec_name(codec), " stream that does not record its decoded size, which this chunk needs"));
  }
  if (found.size > kMaxRecordedSize) {
    throw std::runtime_error(concat(bytes_codec_name(codec), " frame claims ", found.size, " decoded bytes"));
  }
  return static_cast<size_t>(found.size);
}

void decompress(BytesCodec codec, const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size) {
  switch (codec) {
    case BytesCodec::kBlosc:
      return codecs::decompress_blosc(in, in_size, out, out_size);
    case BytesCodec::kGzip:
      return codecs::inflate_gzip(in, in_size, out, out_size);
    case BytesCodec::kZlib:
      return codecs::inflate_zlib(in, in_size, out, out_size);
    case BytesCodec::kZstd:
      return codecs::decompress_zstd(in, in_size, out, out_size);
    case BytesCodec::kCrc32c:
      break;
  }
  throw std::logic_error("not a decompressor");
}

void decompress(BytesCodec codec, const std::vector<uint8_t>& in, uint8_t* out, size_t out_size) {
  decompress(codec, in.data(), in.size(), out, out_size);
}

// Checks and strips the little-endian CRC-32C that ends `data`.
void strip_crc32c(std::vector<uint8_t>& data) {
  if (data.size() < 4) throw std::runtime_error(concat("crc32c: ", data.size(), " bytes cannot hold a checksum"));
  const size_t size = data.size() - 4;
  uint32_t stored = 0;
  for (int i = 3; i >= 0; --i) stored = stored << 8 | data[size + i];
  const uint32_t computed = codecs::crc32c(data.data(), size);
  if (stored != computed) {
    throw std::runtime_error(concat("crc32c checksum mismatch (stored ", stored, ", computed ", computed, ")"));
  }
  data.resize(size);
}

// Undoes bytes->bytes codecs, last first. `decoded_size`, when known, is the
// size once all are undone. With `out` (which has room for decoded_size
// bytes), a final decompression writes there directly, saving a copy; returns
// whether it did, else `data` holds the decoded bytes.
bool undo_bytes_codecs(const std::vector<BytesCodec>& chain, std::vector<uint8_t>& data,
                       std::optional<size_t> decoded_size, uint8_t* out) {
  for (size_t i = chain.size(); i-- > 0;) {
    if (chain[i] == BytesCodec::kCrc32c) {
      strip_crc32c(data);
      continue;
    }
    // Below this codec only checksums (4 bytes each) may remain.
    const bool only_checksums_below =
        std::all_of(chain.begin(), chain.begin() + i, [](BytesCodec codec) { return codec == BytesCodec::kCrc32c; });
    const bool known = decoded_size && only_checksums_below;
    if (!known && (chain[i] == BytesCodec::kGzip || chain[i] == BytesCodec::kZlib)) {
      data = codecs::inflate_unsized(decompressor(chain[i]), data.data(), data.size(), kMaxRecordedSize);
      continue;
    }
    const size_t size = known ? *decoded_size + 4 * i : recorded_decoded_size(chain[i], data);
    if (out && i == 0) {
      decompress(chain[i], data, out, size);
      return true;
    }
    std::vector<uint8_t> decoded(size);
    decompress(chain[i], data, decoded.data(), size);
    data.swap(decoded);
  }
  return false;
}

// Writes into `out` (C order, shape `decoded_shape`) the C-order array `in`
// whose axes are the decoded axes permuted by `order` (encoded axis k is
// decoded axis order[k]), as zarr's transpose codec and Fortran order store it.
template <size_t kItem>
void untranspose(const uint8_t* in, uint8_t* out, const std::vector<int64_t>& decoded_shape,
                 const std::vector<int64_t>& order) {
  const size_t dims = decoded_shape.size();
  std::vector<int64_t> decoded_strides(dims, 1);
  for (size_t d = dims - 1; d-- > 0;) decoded_strides[d] = decoded_strides[d + 1] * decoded_shape[d + 1];
  std::vector<int64_t> encoded_shape(dims), out_strides(dims);
  int64_t total = 1;
  for (size_t k = 0; k < dims; ++k) {
    encoded_shape[k] = decoded_shape[order[k]];
    out_strides[k] = decoded_strides[order[k]];
    total *= encoded_shape[k];
  }
  if (total == 0) return;
  const int64_t run = encoded_shape[dims - 1], run_stride = out_strides[dims - 1];
  std::vector<int64_t> index(dims, 0);
  int64_t offset = 0;  // output element of index (over the outer encoded axes)
  for (int64_t base = 0; base < total; base += run) {
    const uint8_t* source = in + static_cast<size_t>(base) * kItem;
    for (int64_t j = 0; j < run; ++j) {
      std::memcpy(out + static_cast<size_t>(offset + j * run_stride) * kItem, source + static_cast<size_t>(j) * kItem,
                  kItem);
    }
    for (size_t k = dims - 1; k-- > 0;) {
      offset += out_strides[k];
      if (++index[k] < encoded_shape[k]) break;
      offset -= out_strides[k] * encoded_shape[k];
      index[k] = 0;
    }
  }
}

void untranspose(const uint8_t* in, uint8_t* out, const std::vector<int64_t>& decoded_shape,
                 const std::vector<int64_t>& order, size_t item) {
  switch (item) {
    case 1:
      return untranspose<1>(in, out, decoded_shape, order);
    case 2:
      return untranspose<2>(in, out, decoded_shape, order);
    case 4:
      return untranspose<4>(in, out, decoded_shape, order);
    case 8:
      return untranspose<8>(in, out, decoded_shape, order);
    case 16:
      return untranspose<16>(in, out, decoded_shape, order);
  }
  // Fixed-length strings of any width: one element at a time.
  const size_t dims = decoded_shape.size();
  std::vector<int64_t> decoded_strides(dims, 1);
  for (size_t d = dims - 1; d-- > 0;) decoded_strides[d] = decoded_strides[d + 1] * decoded_shape[d + 1];
  int64_t total = 1;
  for (int64_t extent : decoded_shape) total *= extent;
  std::vector<int64_t> index(dims, 0);
  for (int64_t e = 0; e < total; ++e) {
    int64_t rest = e, offset = 0;
    for (size_t k = dims; k-- > 0;) {
      const int64_t extent = decoded_shape[order[k]];
      offset += (rest % extent) * decoded_strides[order[k]];
      rest /= extent;
    }
    std::memcpy(out + offset * item, in + e * item, item);
  }
}

// Decodes the fixed-size elements of one chunk (numeric or fixed-length
// strings): bytes->bytes codecs, then the transposes, into C order.
class ZarrChunkDecoder : public ChunkDecoder {
 public:
  ZarrChunkDecoder(CodecChain chain, std::vector<int64_t> chunk_shape, size_t item_size)
      : chain_(std::move(chain)), item_size_(item_size) {
    // Shapes before each transpose (decoded side), innermost last.
    std::vector<int64_t> shape = std::move(chunk_shape);
    for (const std::vector<int64_t>& order : chain_.transposes) {
      shapes_.push_back(shape);
      std::vector<int64_t> next(shape.size());
      for (size_t k = 0; k < shape.size(); ++k) next[k] = shape[order[k]];
      shape = std::move(next);
    }
  }

  bool stores_raw() const override { return chain_.transposes.empty() && chain_.bytes_codecs.empty(); }

  // The outermost decompressor, with only checksums (4 bytes each) after
  // and before it, must be able to yield the chunk's bytes.
  void check_encoded(const std::vector<uint8_t>& encoded, size_t out_bytes, uint32_t) const override {
    size_t size = encoded.size();
    for (size_t i = chain_.bytes_codecs.size(); i-- > 0;) {
      if (chain_.bytes_codecs[i] == BytesCodec::kCrc32c) {
        if (size < 4) throw std::runtime_error(concat("crc32c: ", size, " bytes cannot hold a checksum"));
        size -= 4;
        continue;
      }
      const bool only_checksums_below = std::all_of(chain_.bytes_codecs.begin(), chain_.bytes_codecs.begin() + i,
                                                    [](BytesCodec codec) { return codec == BytesCodec::kCrc32c; });
      if (only_checksums_below) {
        codecs::check_decoded_size(decompressor(chain_.bytes_codecs[i]), encoded.data(), size, out_bytes + 4 * i);
      }
      return;
    }
    if (size != out_bytes) throw std::runtime_error(concat("holds ", size, " bytes, expected ", out_bytes));
  }

  // One decompressor and nothing else (annbatch's blosc, most zarr arrays):
  // it reads the stored bytes where they are.
  bool decodes_views() const override {
    return chain_.transposes.empty() && chain_.bytes_codecs.size() == 1 &&
           chain_.bytes_codecs[0] != BytesCodec::kCrc32c;
  }

  void decode_view(const uint8_t* encoded, size_t size, size_t out_bytes,
                   core::FunctionRef<uint8_t*()> out) const override {
    codecs::check_decoded_size(decompressor(chain_.bytes_codecs[0]), encoded, size, out_bytes);  // before out()
    decompress(chain_.bytes_codecs[0], encoded, size, out(), out_bytes);  // writes exactly out_bytes or throws
  }

  // blosc frames: parts of a chunk decoded without the rest.
  bool decodes_ranges() const override { return decodes_views() && chain_.bytes_codecs[0] == BytesCodec::kBlosc; }

  bool decode_view_ranges(const uint8_t* encoded, size_t size, size_t out_bytes,
                          const std::vector<codecs::ByteRange>& ranges, bool trusted) const override {
    return codecs::decompress_blosc_ranges(encoded, size, out_bytes, ranges, trusted);
  }

  void decode(std::vector<uint8_t>& encoded, uint8_t* out, size_t out_bytes) const override {
    const bool plain = chain_.transposes.empty();
    if (undo_bytes_codecs(chain_.bytes_codecs, encoded, out_bytes, plain ? out : nullptr)) return;
    if (encoded.size() != out_bytes) {
      throw std::runtime_error(concat("decodes to ", encoded.size(), " bytes, expected ", out_bytes));
    }
    if (plain) {
      std::memcpy(out, encoded.data(), out_bytes);
      return;
    }
    std::vector<uint8_t> scratch(shapes_.size() > 1 ? out_bytes : 0);
    const uint8_t* source = encoded.data();
    for (size_t t = shapes_.size(); t-- > 0;) {
      uint8_t* target = t == 0 ? out : (source == scratch.data() ? encoded.data() : scratch.data());
      untranspose(source, target, shapes_[t], chain_.transposes[t], item_size_);
      source = target;
    }
  }

 private:
  CodecChain chain_;
  size_t item_size_;
  std::vector<std::vector<int64_t>> shapes_;
};

// ---------------------------------------------------------------------------
// Chunk stores

// The array's metadata file as the store was opened. A chunk (or shard)
// file that does not exist was never written, and one opened later belongs
// to the store that was opened, as long as that file is unchanged: a store
// deleted or moved while open would otherwise read as its fill value, and a
// store replaced or rewritten (another metadata file) would mix old and new
// chunks in one read.
class MetadataStamp {
 public:
  explicit MetadataStamp(std::string path) : path_(std::move(path)), stamp_(FileStamp::of_path(path_)) {}
  const std::string& path() const { return path_; }
  uint64_t digest() const { return stamp_ ? stamp_->digest() : 0; }
  // Throws FileNotFound if the file is gone, ReadError if it changed.
  void check() const {
    const std::optional<FileStamp> now = FileStamp::of_path(path_);
    if (!now) throw FileNotFound(path_);
    const std::string change = stamp_ && file_checks_enabled() ? stamp_->changes_to(*now) : "";
    if (change.empty()) return;
    throw ReadError(concat(path_, ": the zarr store changed while being read (", change,
                           "): chunks read from it may mix its old and new contents, so they are not delivered; "
                           "open the dataset again once the store is written"));
  }

 private:
  std::string path_;
  std::optional<FileStamp> stamp_;  // nullopt: it could not be stat'ed at open (then only its presence counts)
};

// One file per chunk, named by its key. A chunk file is opened for each
// read, so each chunk's stamp from its first read in the job (this process
// or the one it was forked from) is kept in a table: a chunk written again
// since (zarr-python writes a chunk to a new file renamed over the old one,
// leaving the metadata file as it was) is refused, not mixed with chunks read
// before. Arrays of more than kMaxStampedChunks chunks keep no table.
class ChunkFiles : public ChunkStore {
 public:
  ChunkFiles(std::string dir, ChunkKeys keys, std::string metadata_file, std::vector<int64_t> grid)
      : dir_(std::move(dir)),
        keys_(keys),
        metadata_(std::move(metadata_file)),
        grid_(std::move(grid)),
        chunks_(chunk_count_capped(grid_, kMaxStampedChunks)) {}
  ~ChunkFiles() override { delete[] stamps_.load(); }

  std::optional<std::vector<uint8_t>> read_chunk(const std::vector<int64_t>& coords) const override {
    if (reads_together()) {
      core::ThreadPool inline_pool(0);
      return std::move(read_chunks({coords}, inline_pool)[0]);
    }
    const std::shared_ptr<const File> file = open_chunk(coords);
    if (!file) return std::nullopt;
    return file->read_at(0, static_cast<size_t>(file->size()), "the whole file");
  }
  // Chunks behind URLs: each a whole object, all fetched together.
  bool reads_together() const override { return storage::is_url(dir_); }
  std::vector<std::optional<std::vector<uint8_t>>> read_chunks(const std::vector<std::vector<int64_t>>& coords,
                                                               core::ThreadPool& /*pool*/) const override {
    std::vector<std::string> paths;
    paths.reserve(coords.size());
    for (const std::vector<int64_t>& chunk : coords) paths.push_back(dir_ + "/" + keys_.key(chunk));
    std::vector<FileStamp> stamps;
    std::vector<std::optional<std::vector<uint8_t>>> chunks = read_whole_files_if_exist(paths, &stamps);
    metadata_.check();
    for (size_t i = 0; i < coords.size(); ++i) {
      if (chunks[i]) check_chunk(coords[i], paths[i], stamps[i].digest());
    }
    return chunks;
  }
  bool can_locate() const override { return true; }
  std::optional<ChunkLocation> locate(const std::vector<int64_t>& coords) const override {
    std::shared_ptr<const File> file = open_chunk(coords);
    if (!file) return std::nullopt;
    const int64_t size = file->size();
    return ChunkLocation{std::move(file), 0, size};
  }
  std::string describe_chunk(const std::vector<int64_t>& coords) const override {
    return concat("chunk ", format_coords(coords), " (", keys_.key(coords), ")");
  }
  void opened_stamps(FileStamps& stamps) const override { stamps[metadata_.path()] = metadata_.digest(); }

 private:
  static constexpr int64_t kMaxStampedChunks = int64_t{1} << 22;  // 32 MiB of stamps

  // The chunk's file, opened (each is opened when read, never kept open), or
  // null if it was never written; either once the store and the chunk are
  // checked unchanged.
  std::shared_ptr<const File> open_chunk(const std::vector<int64_t>& coords) const {
    std::shared_ptr<const File> file = File::open_if_exists(dir_ + "/" + keys_.key(coords));
    metadata_.check();
    if (file) check_chunk(coords, file->path(), file->stamp().digest());
    return file;
  }

  void check_chunk(const std::vector<int64_t>& coords, const std::string& path, uint64_t now) const {
    if (!file_checks_enabled() || chunks_ > kMaxStampedChunks || coords.size() != grid_.size()) return;
    int64_t chunk = 0;
    for (size_t d = 0; d < coords.size(); ++d) {
      if (coords[d] < 0 || coords[d] >= grid_[d]) return;
      chunk = chunk * grid_[d] + coords[d];
    }
    std::atomic<uint64_t>& slot = stamps()[chunk];
    uint64_t first = 0;
    if (slot.compare_exchange_strong(first, now, std::memory_order_relaxed) || first == now) return;
    throw ReadError(concat(path,
                           ": the zarr chunk changed while being read (written again since it was first "
                           "read, the array's metadata as it was): rows read from it may mix its old and "
                           "new contents, so they are not delivered; open the dataset again once the "
                           "store is written"));
  }

  // The table of first stamps (0: not read yet), made on first use.
  std::atomic<uint64_t>* stamps() const {
    if (std::atomic<uint64_t>* table = stamps_.load(std::memory_order_acquire)) return table;
    std::lock_guard<std::mutex> lock(first_use_mutex());
    if (stamps_.load(std::memory_order_relaxed) == nullptr) {
      stamps_.store(new std::atomic<uint64_t>[static_cast<size_t>(chunks_)](), std::memory_order_release);
    }
    return stamps_.load(std::memory_order_relaxed);
  }

  std::string dir_;
  ChunkKeys keys_;
  MetadataStamp metadata_;
  std::vector<int64_t> grid_;  // chunks along each dimension
  int64_t chunks_ = 0;         // in all (kMaxStampedChunks + 1: more)
  mutable std::atomic<std::atomic<uint64_t>*> stamps_{nullptr};
};

// Where each inner chunk of one shard lies in the shard file.
struct ShardIndex {
  bool shard_exists = false;
  std::shared_ptr<const File> file;                    // kept open (and mapped) while the store lives
  std::vector<std::pair<uint64_t, uint64_t>> entries;  // (offset, nbytes); kMissingEntry twice: never written
};

// Inner chunks of v3 shards: inner grid coordinates -> shard file -> index
// entry. Each shard's index is read once (only its bytes) and kept. Shards
// are found by their position in the shard grid (no key string, no shared
// lookup per chunk) when the grid is of a reasonable size, by key otherwise.
class ShardedChunkStore : public ChunkStore {
 public:
  ShardedChunkStore(std::string dir, ChunkKeys keys, std::vector<int64_t> chunks_per_shard,
                    std::vector<int64_t> shard_grid, ShardLayout layout, std::string metadata_file)
      : dir_(std::move(dir)),
        keys_(keys),
        metadata_(std::move(metadata_file)),
        chunks_per_shard_(std::move(chunks_per_shard)),
        shard_grid_(std::move(shard_grid)),
        layout_(std::move(layout)) {
    // Each inner chunk takes 16 bytes of the index, which every shard file holds.
    constexpr int64_t kMaxEntries = std::numeric_limits<int64_t>::max() / 16 - 1;
    for (int64_t count : chunks_per_shard_) {
      if (count != 0 && inner_chunks_ > kMaxEntries / count) {
        throw std::runtime_error("shards of more than 2^59 inner chunks (corrupt chunk shapes)");
      }
      inner_chunks_ *= count;
    }
    // Shards found by grid position when there are at most kMaxIndexedShards of them.
    indexed_shards_ = 1;
    for (int64_t count : shard_grid_) {
      const bool fits = indexed_shards_ >= 0 && count > 0 && indexed_shards_ <= kMaxIndexedShards / count;
      indexed_shards_ = fits ? indexed_shards_ * count : -1;
    }
  }

  std::optional<std::vector<uint8_t>> read_chunk(const std::vector<int64_t>& coords) const override {
    const std::optional<ChunkLocation> location = locate(coords);
    if (!location) return std::nullopt;
    return location->file->read_at(location->offset, static_cast<size_t>(location->size),
                                   "inner chunk " + format_coords(coords));
  }

  bool can_locate() const override { return true; }
  bool maps_chunks() const override { return true; }
  // Shards behind URLs: the indexes a read needs are loaded in parallel
  // first, then each shard's chunks requested together.
  bool reads_together() const override { return storage::is_url(dir_); }
  std::vector<std::optional<std::vector<uint8_t>>> read_chunks(const std::vector<std::vector<int64_t>>& coords,
                                                               core::ThreadPool& pool) const override {
    std::map<std::vector<int64_t>, size_t> first_of_shard;  // a chunk of each shard touched
    for (size_t i = 0; i < coords.size(); ++i) first_of_shard.emplace(shard_of(coords[i]), i);
    std::vector<size_t> firsts;
    for (const auto& [shard, i] : first_of_shard) firsts.push_back(i);
    pool.parallel_for(static_cast<int64_t>(firsts.size()),
                      [&](int64_t k) { (void)locate(coords[firsts[static_cast<size_t>(k)]]); });
    return ChunkStore::read_chunks(coords, pool);
  }
  std::optional<ChunkLocation> locate(const std::vector<int64_t>& coords) const override {
    // shard: the position in the grid, or -1 (too many shards, or outside the grid) to look it up by key.
    int64_t entry = 0, shard = indexed_shards_ >= 0 ? 0 : -1;
    for (size_t d = 0; d < coords.size(); ++d) {
      const int64_t position = coords[d] / chunks_per_shard_[d];
      if (shard >= 0) shard = position < shard_grid_[d] ? shard * shard_grid_[d] + position : -1;
      entry = entry * chunks_per_shard_[d] + coords[d] % chunks_per_shard_[d];
    }
    const ShardIndex& index = shard_index(coords, shard);
    if (!index.shard_exists) return std::nullopt;
    const auto [offset, nbytes] = index.entries[entry];
    if (offset == kMissingEntry) return std::nullopt;
    return ChunkLocation{index.file, static_cast<int64_t>(offset), static_cast<int64_t>(nbytes)};
  }

  std::string describe_chunk(const std::vector<int64_t>& coords) const override {
    return concat("inner chunk ", format_coords(coords), " of shard ", keys_.key(shard_of(coords)));
  }

  void opened_stamps(FileStamps& stamps) const override { stamps[metadata_.path()] = metadata_.digest(); }

  void open_files(std::vector<const File*>& files) const override {
    Cache& cache = this->cache();
    std::lock_guard<std::mutex> lock(cache.mutex);
    files.insert(files.end(), cache.files.begin(), cache.files.end());
  }

 private:
  static constexpr int64_t kMaxIndexedShards = int64_t{1} << 16;
  static constexpr size_t kMaxRecheckedShards = 256;

  struct Slot {
    std::mutex mutex;  // held while the index loads, so each loads once
    std::shared_ptr<const ShardIndex> index;
    std::atomic<const ShardIndex*> loaded{nullptr};  // index, once set: read without the lock
  };

  struct Cache {
    explicit Cache(int64_t indexed_shards) : indexed(static_cast<size_t>(std::max<int64_t>(indexed_shards, 0))) {}
    std::vector<Slot> indexed;  // by position in the shard grid (empty: too many shards)
    std::mutex mutex;           // guards slots and files
    std::map<std::string, std::shared_ptr<Slot>> slots;
    std::vector<const File*> files;  // of the shards loaded
  };

  // This process's cache of shard indexes. A forked child starts its own: a
  // thread of the parent may have held one of the old cache's mutexes at the
  // fork, and would never release it in the child. The inherited cache is
  // left alone (its indexes may still be referenced), not destroyed while
  // perhaps locked.
  Cache& cache() const {
    const int pid = current_process_id();
    if (cache_pid_.load(std::memory_order_acquire) != pid) {
      std::lock_guard<std::mutex> lock(first_use_mutex());
      if (cache_pid_.load(std::memory_order_relaxed) != pid) {
        if (cache_pid_.load(std::memory_order_relaxed) != 0) (void)cache_.release();
        cache_ = std::make_unique<Cache>(indexed_shards_);
        cache_pid_.store(pid, std::memory_order_release);
      }
    }
    return *cache_;
  }

  std::vector<int64_t> shard_of(const std::vector<int64_t>& coords) const {
    std::vector<int64_t> shard(coords.size());
    for (size_t d = 0; d < coords.size(); ++d) shard[d] = coords[d] / chunks_per_shard_[d];
    return shard;
  }

  // `position`: the shard's place in the grid, or -1 to look it up by key.
  // The index of the shard holding `coords`; valid while the store lives.
  const ShardIndex& shard_index(const std::vector<int64_t>& coords, int64_t position) const {
    Cache& cache = this->cache();
    Slot* slot = nullptr;
    if (position >= 0 && !cache.indexed.empty()) {
      slot = &cache.indexed[static_cast<size_t>(position)];
      if (const ShardIndex* loaded = slot->loaded.load(std::memory_order_acquire)) return *loaded;
    } else {
      std::lock_guard<std::mutex> lock(cache.mutex);
      std::shared_ptr<Slot>& entry = cache.slots[keys_.key(shard_of(coords))];
      if (!entry) entry = std::make_shared<Slot>();
      slot = entry.get();  // slots are never removed
    }
    std::lock_guard<std::mutex> lock(slot->mutex);
    // A failed load leaves the slot empty: later reads retry.
    if (!slot->index) {
      std::shared_ptr<const ShardIndex> index = load_index(keys_.key(shard_of(coords)));
      check_held_shards(cache);
      if (index->file) {
        std::lock_guard<std::mutex> files_lock(cache.mutex);
        cache.files.push_back(index->file.get());
      }
      slot->index = std::move(index);
      slot->loaded.store(slot->index.get(), std::memory_order_release);
    }
    return *slot->index;
  }

  // A shard opened now must come from the store whose shards this process
  // holds: each held shard's path (the newest kMaxRecheckedShards) must still
  // lead to the file held. zarr-python writes a shard to a new file renamed
  // over the old one, the metadata file left as it was: without this, rows of
  // held (old) and new shards would mix.
  void check_held_shards(Cache& cache) const {
    if (!file_checks_enabled()) return;
    std::vector<const File*> held;
    {
      std::lock_guard<std::mutex> lock(cache.mutex);
      const size_t first = cache.files.size() > kMaxRecheckedShards ? cache.files.size() - kMaxRecheckedShards : 0;
      held.assign(cache.files.begin() + static_cast<std::ptrdiff_t>(first), cache.files.end());
    }
    for (const File* file : held) {
      // Shards behind URLs need no look: every read of one carries its ETag (If-Match).
      if (file->remote()) continue;
      const std::optional<FileStamp> now = FileStamp::of_path(file->path());
      if (now && now->device == file->stamp().device && now->inode == file->stamp().inode) continue;
      throw ReadError(concat(file->path(), ": the zarr store changed while being read (",
                             now ? file->stamp().changes_to(*now) : std::string("this shard is gone"),
                             ", found opening another shard): rows read from its shards may mix old and new contents, "
                             "so they are not delivered; open the dataset again once the store is written"));
    }
  }

  std::shared_ptr<const ShardIndex> load_index(const std::string& key) const {
    auto index = std::make_shared<ShardIndex>();
    const std::string path = dir_ + "/" + key;
    index->file = File::open_if_exists(path, File::Access::kMapped);
    // Throws (the slot stays empty) unless the shard opened, or found missing, is the store's (the file is
    // then checked by its own stamp).
    metadata_.check();
    if (!index->file) return index;
    index->shard_exists = true;
    const File& file = *index->file;
    const size_t entry_bytes = static_cast<size_t>(inner_chunks_) * 16;
    const size_t index_bytes = entry_bytes + (layout_.index_crc32c ? 4 : 0);
    if (static_cast<uint64_t>(file.size()) < index_bytes) {
      throw std::runtime_error(
          concat("the shard has ", file.size(), " bytes, less than its ", index_bytes, "-byte index (truncated)"));
    }
    const int64_t index_offset = layout_.index_at_start ? 0 : file.size() - static_cast<int64_t>(index_bytes);
    std::vector<uint8_t> bytes = file.read_at(index_offset, index_bytes, "the shard index");
    if (layout_.index_crc32c) {
      try {
        strip_crc32c(bytes);
      } catch (const std::runtime_error& error) {
        throw std::runtime_error(concat("shard index: ", error.what()));
      }
    }
    const uint64_t file_size = static_cast<uint64_t>(file.size());
    index->entries.resize(static_cast<size_t>(inner_chunks_));
    for (int64_t i = 0; i < inner_chunks_; ++i) {
      uint64_t values[2] = {0, 0};
      for (int v = 0; v < 2; ++v) {
        const uint8_t* field = bytes.data() + i * 16 + v * 8;
        for (int b = 0; b < 8; ++b) {
          const int shift = layout_.index_big_endian ? 8 * (7 - b) : 8 * b;
          values[v] |= static_cast<uint64_t>(field[b]) << shift;
        }
      }
      const auto [offset, nbytes] = values;
      const bool missing = offset == kMissingEntry && nbytes == kMissingEntry;
      if (!missing && (offset > file_size || nbytes > file_size - offset)) {
        throw std::runtime_error(concat("shard index entry ", i, " (offset ", offset, ", nbytes ", nbytes,
                                        ") lies outside the shard's ", file_size, " bytes (corrupt index)"));
      }
      index->entries[i] = {offset, nbytes};
    }
    return index;
  }

  std::string dir_;
  ChunkKeys keys_;
  MetadataStamp metadata_;
  std::vector<int64_t> chunks_per_shard_;
  std::vector<int64_t> shard_grid_;  // shards along each dimension
  ShardLayout layout_;
  int64_t inner_chunks_ = 1;
  int64_t indexed_shards_ = -1;  // shards in the grid, or -1: more than kMaxIndexedShards
  mutable std::unique_ptr<Cache> cache_;
  mutable std::atomic<int> cache_pid_{0};
};

std::shared_ptr<const ChunkStore> make_chunk_store(const ZarrMetadata& meta) {
  const std::string metadata_file = meta.dir + (meta.format == 3 ? "/zarr.json" : "/.zarray");
  // Chunks (shards when sharded) along each dimension, rounded up without overflow: a shape may be as large
  // as 2^63 - 1.
  std::vector<int64_t> grid(meta.shape.size());
  for (size_t d = 0; d < grid.size(); ++d) {
    grid[d] = meta.shape[d] / meta.chunk_shape[d] + (meta.shape[d] % meta.chunk_shape[d] != 0 ? 1 : 0);
  }
  if (!meta.sharding) return std::make_shared<ChunkFiles>(meta.dir, meta.keys, metadata_file, std::move(grid));
  std::vector<int64_t> chunks_per_shard(meta.shape.size()), shard_grid = std::move(grid);
  for (size_t d = 0; d < chunks_per_shard.size(); ++d) {
    chunks_per_shard[d] = meta.chunk_shape[d] / meta.sharding->inner_chunk_shape[d];
  }
  try {
    return std::make_shared<ShardedChunkStore>(meta.dir, meta.keys, std::move(chunks_per_shard), std::move(shard_grid),
                                               *meta.sharding, metadata_file);
  } catch (const std::runtime_error& error) {
    throw ReadError(concat(meta.where, ": ", error.what()));
  }
}

// ---------------------------------------------------------------------------
// Strings

uint32_t load_u32_le(const uint8_t* data) {
  return static_cast<uint32_t>(data[0]) | static_cast<uint32_t>(data[1]) << 8 | static_cast<uint32_t>(data[2]) << 16 |
         static_cast<uint32_t>(data[3]) << 24;
}

// numcodecs VLenUTF8 / VLenBytes: uint32 LE item count, then per item a
// uint32 LE byte length and the bytes.
std::vector<std::string> decode_vlen(const std::vector<uint8_t>& data, size_t expected_items) {
  if (data.size() < 4) throw std::runtime_error("variable-length string chunk shorter than its header");
  const size_t count = load_u32_le(data.data());
  if (count != expected_items) {
    throw std::runtime_error(concat("variable-length string chunk holds ", count, " items, expected ", expected_items));
  }
  std::vector<std::string> items;
  items.reserve(count);
  size_t position = 4;
  for (size_t i = 0; i < count; ++i) {
    if (data.size() - position < 4) throw std::runtime_error(concat("variable-length item ", i, " truncated"));
    const size_t length = load_u32_le(data.data() + position);
    position += 4;
    if (data.size() - position < length) throw std::runtime_error(concat("variable-length item ", i, " truncated"));
    items.emplace_back(reinterpret_cast<const char*>(data.data()) + position, length);
    position += length;
  }
  return items;
}

void append_utf8(uint32_t code, std::string& out) {
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else if (code < 0x800) {
    out += static_cast<char>(0xc0 | code >> 6);
    out += static_cast<char>(0x80 | (code & 0x3f));
  } else if (code < 0x10000) {
    out += static_cast<char>(0xe0 | code >> 12);
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (code & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | code >> 18);
    out += static_cast<char>(0x80 | ((code >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (code & 0x3f));
  }
}

std::string utf32_to_utf8(const uint8_t* data, size_t bytes, bool big_endian) {
  size_t units = bytes / 4;
  const auto unit = [&](size_t i) {
    const uint8_t* p = data + 4 * i;
    return big_endian ? (static_cast<uint32_t>(p[0]) << 24 | static_cast<uint32_t>(p[1]) << 16 |
                         static_cast<uint32_t>(p[2]) << 8 | p[3])
                      : load_u32_le(p);
  };
  while (units > 0 && unit(units - 1) == 0) --units;
  std::string text;
  for (size_t i = 0; i < units; ++i) {
    const uint32_t code = unit(i);
    if (code > 0x10ffff || (code >= 0xd800 && code < 0xe000)) {
      throw std::runtime_error(concat("invalid UTF-32 code point ", code));
    }
    append_utf8(code, text);
  }
  return text;
}

std::string strip_trailing_nuls(const uint8_t* data, size_t bytes) {
  while (bytes > 0 && data[bytes - 1] == 0) --bytes;
  return std::string(reinterpret_cast<const char*>(data), bytes);
}

std::string base64_decode(const std::string& text) {
  static const std::string kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  uint32_t buffer = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=') break;
    const size_t value = kAlphabet.find(c);
    if (value == std::string::npos) throw std::invalid_argument("not base64");
    buffer = buffer << 6 | static_cast<uint32_t>(value);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((buffer >> bits) & 0xff);
    }
  }
  return out;
}

// The string standing in for elements of chunks never written.
std::string string_fill(const ZarrMetadata& meta) {
  if (!meta.fill_value.is_string()) return "";
  const std::string& text = meta.fill_value.get_ref<const std::string&>();
  // v2 stores fixed-length bytes fill values base64-encoded.
  if (meta.format == 2 && meta.kind == ElementKind::kFixedBytes) {
    try {
      const std::string bytes = base64_decode(text);
      return strip_trailing_nuls(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::invalid_argument&) {
      return text;
    }
  }
  return text;
}

std::vector<std::string> decode_string_chunk(const ZarrMetadata& meta, std::vector<uint8_t>& encoded, size_t items) {
  if (meta.kind == ElementKind::kVLenUtf8 || meta.kind == ElementKind::kVLenBytes) {
    undo_bytes_codecs(meta.chain.bytes_codecs, encoded, std::nullopt, nullptr);
    return decode_vlen(encoded, items);
  }
  if (meta.item_size != 0 && items > (size_t{1} << 62) / meta.item_size) {
    throw std::runtime_error(concat(items, " strings of ", meta.item_size, " bytes per chunk"));
  }
  const size_t bytes = items * meta.item_size;
  const ZarrChunkDecoder decoder(meta.chain, meta.read_chunk_shape(), meta.item_size);
  decoder.check_encoded(encoded, bytes, 0);
  std::vector<uint8_t> decoded(bytes);
  decoder.decode(encoded, decoded.data(), bytes);
  std::vector<std::string> strings;
  strings.reserve(items);
  for (size_t i = 0; i < items; ++i) {
    const uint8_t* item = decoded.data() + i * meta.item_size;
    strings.push_back(meta.kind == ElementKind::kFixedUtf32 ? utf32_to_utf8(item, meta.item_size, meta.chain.big_endian)
                                                            : strip_trailing_nuls(item, meta.item_size));
  }
  return strings;
}

}  // namespace

// ---------------------------------------------------------------------------
// Public functions

std::string normalize_zarr_path(const std::string& path) {
  std::string normalized;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    const std::string part = path.substr(start, end - start);
    if (part == "." || part == "..") core::check_argument(false, "invalid zarr path '", path, "'");
    if (!part.empty()) normalized += "/" + part;
    start = end + 1;
  }
  return normalized.empty() ? "/" : normalized;
}

bool is_zarr_array(const std::string& dir) { return file_exists(dir + "/.zarray") || node_type_of(dir) == "array"; }

bool is_zarr_group(const std::string& dir) { return file_exists(dir + "/.zgroup") || node_type_of(dir) == "group"; }

bool is_zarr_string_array(const std::string& store, const std::string& path) {
  return read_metadata(store, path).kind != ElementKind::kNumeric;
}

std::shared_ptr<const Array> open_zarr_array(const std::string& store, const std::string& path) {
  const ZarrMetadata meta = read_metadata(store, path);
  if (meta.kind != ElementKind::kNumeric) {
    throw core::Unsupported(concat(meta.where, ": '", meta.type_name, "' is a string type (read it as strings)"));
  }
  if (meta.shape.empty()) throw core::InvalidArgument(concat(meta.where, ": 0-d arrays are not supported"));
  ArrayInfo info;
  info.file = store;
  info.path = meta.path;
  info.dtype = meta.dtype;
  info.shape = meta.shape;
  info.big_endian = meta.chain.big_endian && dtype_swap_unit(meta.dtype) > 1;
  auto decoder = std::make_shared<ZarrChunkDecoder>(meta.chain, meta.read_chunk_shape(), meta.item_size);
  return std::make_shared<ChunkedArray>(std::move(info), meta.read_chunk_shape(), make_chunk_store(meta),
                                        std::move(decoder), numeric_fill_bytes(meta));
}

std::vector<std::string> read_zarr_strings(const std::string& store, const std::string& path) {
  const ZarrMetadata meta = read_metadata(store, path);
  if (meta.kind == ElementKind::kNumeric) {
    throw ReadError(concat(meta.where, ": not a string array (data type '", meta.type_name, "')"));
  }
  if (meta.shape.size() > 1) {
    throw ReadError(concat(meta.where, ": string arrays must be 1-D, this one has ", meta.shape.size(), " dimensions"));
  }
  // A 0-d array (AnnData's scalar strings) is one chunk with empty coordinates.
  const bool scalar = meta.shape.empty();
  const std::shared_ptr<const ChunkStore> chunks = make_chunk_store(meta);
  const int64_t length = scalar ? 1 : meta.shape[0];
  const int64_t per_chunk = scalar ? 1 : meta.read_chunk_shape()[0];
  const int64_t chunk_count = length / per_chunk + (length % per_chunk != 0);
  if (chunk_count > kMaxStringChunks) {
    throw ReadError(concat(meta.where, ": ", length, " strings in ", chunk_count, " chunks of ", per_chunk,
                           " (more than ", kMaxStringChunks, " chunks: corrupt shape or chunk shape?)"));
  }
  // Chunks never written hold the fill value. A string array's elements come
  // from its stored chunks; a shape claiming far more than they hold (a
  // corrupt shape) is refused before the fill strings are made.
  std::vector<std::optional<std::vector<std::string>>> decoded(static_cast<size_t>(chunk_count));
  uint64_t stored = 0, missing = 0;
  for (int64_t chunk = 0; chunk < chunk_count; ++chunk) {
    const std::vector<int64_t> coords = scalar ? std::vector<int64_t>{} : std::vector<int64_t>{chunk};
    const size_t wanted = static_cast<size_t>(std::min(per_chunk, length - chunk * per_chunk));
    try {
      std::optional<std::vector<uint8_t>> encoded = chunks->read_chunk(coords);
      if (!encoded) {
        missing += wanted;
        continue;
      }
      std::vector<std::string> items = decode_string_chunk(meta, *encoded, static_cast<size_t>(per_chunk));
      items.resize(wanted);
      stored += wanted;
      decoded[static_cast<size_t>(chunk)] = std::move(items);
    } catch (const ReadError&) {
      throw;
    } catch (const std::exception& error) {
      throw ReadError(concat(meta.where, ": ", chunks->describe_chunk(coords), ": ", error.what()));
    }
  }
  if (missing > std::max<uint64_t>(stored, kMaxFillStrings)) {
    throw ReadError(
        concat(meta.where, ": ", missing, " of its ", length, " strings lie in chunks never written (corrupt shape?)"));
  }
  const std::string fill = string_fill(meta);
  std::vector<std::string> strings;
  strings.reserve(static_cast<size_t>(length));
  for (int64_t chunk = 0; chunk < chunk_count; ++chunk) {
    auto& items = decoded[static_cast<size_t>(chunk)];
    if (items) {
      std::move(items->begin(), items->end(), std::back_inserter(strings));
    } else {
      strings.insert(strings.end(), static_cast<size_t>(std::min(per_chunk, length - chunk * per_chunk)), fill);
    }
  }
  for (size_t i = 0; i < strings.size(); ++i) {
    if (!is_valid_utf8(strings[i])) {
      throw ReadError(concat(meta.where, ": string ", i, " is not valid UTF-8: \"", printable(strings[i]), "\""));
    }
  }
  return strings;
}

nlohmann::json read_zarr_attributes(const std::string& store, const std::string& path) {
  const std::string normalized = normalize_zarr_path(path);
  const std::string dir = node_directory(store, normalized);
  const std::string where = concat(store, ":", normalized);
  if (std::optional<json> zarr_json = read_json_file(dir, "zarr.json", where)) {
    if (!zarr_json->contains("attributes") || (*zarr_json)["attributes"].is_null()) return json::object();
    const json& attributes = (*zarr_json)["attributes"];
    if (!attributes.is_object()) throw ReadError(concat(where, ": zarr.json \"attributes\" is not an object"));
    return attributes;
  }
  if (std::optional<json> attributes = read_json_file(dir, ".zattrs", where)) return *attributes;
  if (!file_exists(dir + "/.zarray") && !file_exists(dir + "/.zgroup")) {
    throw ReadError(concat(where, ": no zarr array or group there"));
  }
  return json::object();
}

}  // namespace torch_shards::io
