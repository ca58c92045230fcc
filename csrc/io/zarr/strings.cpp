// zarr string arrays, read whole: variable-length (numcodecs vlen-utf8 and
// vlen-bytes) and fixed-length (UTF-32, NUL-padded bytes) strings.
#include <algorithm>
#include <iterator>
#include <optional>
#include <stdexcept>

#include "core/errors.h"
#include "io/text.h"
#include "io/zarr/array.h"
#include "io/zarr/chunk_decoding.h"
#include "io/zarr/chunk_stores.h"
#include "io/zarr/metadata.h"

namespace torch_shards::io {

using core::concat;
using core::ReadError;
using namespace zarr;

namespace {

// String arrays are read whole: more chunks than this, or more strings in
// chunks never written than in written ones (beyond this many), is a corrupt
// shape, not an array anyone wrote.
constexpr int64_t kMaxStringChunks = int64_t{1} << 22;
constexpr uint64_t kMaxFillStrings = uint64_t{1} << 20;

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
  const std::shared_ptr<const ChunkDecoder> decoder =
      make_chunk_decoder(meta.chain, meta.read_chunk_shape(), meta.item_size);
  decoder->check_encoded(encoded, bytes, 0);
  std::vector<uint8_t> decoded(bytes);
  decoder->decode(encoded, decoded.data(), bytes);
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

namespace {

ZarrMetadata string_array_metadata(const std::string& store, const std::string& path) {
  ZarrMetadata meta = read_metadata(store, path);
  if (meta.kind == ElementKind::kNumeric) {
    throw ReadError(concat(meta.where, ": not a string array (data type '", meta.type_name, "')"));
  }
  if (meta.shape.size() > 1) {
    throw ReadError(concat(meta.where, ": string arrays must be 1-D, this one has ", meta.shape.size(), " dimensions"));
  }
  return meta;
}

}  // namespace

int64_t zarr_string_array_length(const std::string& store, const std::string& path) {
  const ZarrMetadata meta = string_array_metadata(store, path);
  return meta.shape.empty() ? 1 : meta.shape[0];
}

std::vector<std::string> read_zarr_strings(const std::string& store, const std::string& path) {
  const ZarrMetadata meta = string_array_metadata(store, path);
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

}  // namespace torch_shards::io
