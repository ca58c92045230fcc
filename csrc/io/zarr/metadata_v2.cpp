// zarr v2: .zarray.
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

std::optional<BytesCodec> v2_compressor(const std::string& id) {
  if (id == "blosc") return BytesCodec::kBlosc;
  if (id == "zstd") return BytesCodec::kZstd;
  if (id == "zlib") return BytesCodec::kZlib;
  if (id == "gzip") return BytesCodec::kGzip;
  return std::nullopt;
}

}  // namespace

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

}  // namespace torch_shards::io::zarr
