#include "io/hdf5_format.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>

#include "core/errors.h"

namespace torch_shards::io::hdf5 {

using core::concat;

namespace {

[[noreturn]] void corrupt(const std::string& message) { throw std::runtime_error(message); }

// A bounds-checked little-endian reader over a byte range.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size, const char* what) : data_(data), size_(size), what_(what) {}
  explicit Reader(const std::vector<uint8_t>& bytes, const char* what) : Reader(bytes.data(), bytes.size(), what) {}

  size_t position() const { return position_; }
  size_t remaining() const { return size_ - position_; }
  const uint8_t* here() const { return data_ + position_; }

  void need(size_t bytes) const {
    if (bytes > remaining()) {
      corrupt(concat(what_, " ends after ", size_, " bytes where ", position_ + bytes, " are needed"));
    }
  }
  const uint8_t* take(size_t bytes) {
    need(bytes);
    const uint8_t* start = data_ + position_;
    position_ += bytes;
    return start;
  }
  void skip(size_t bytes) { take(bytes); }
  void seek(size_t position) {
    if (position > size_) corrupt(concat(what_, ": position ", position, " past its ", size_, " bytes"));
    position_ = position;
  }
  // Skips to the next multiple of `alignment` from the start (not past the end).
  void align(size_t alignment) { seek(std::min(size_, (position_ + alignment - 1) / alignment * alignment)); }
  uint64_t integer(size_t bytes) {
    const uint8_t* p = take(bytes);
    uint64_t value = 0;
    for (size_t i = bytes; i-- > 0;) value = value << 8 | p[i];
    return value;
  }
  uint8_t u8() { return static_cast<uint8_t>(integer(1)); }
  uint16_t u16() { return static_cast<uint16_t>(integer(2)); }
  uint32_t u32() { return static_cast<uint32_t>(integer(4)); }
  std::vector<uint8_t> bytes(size_t count) {
    const uint8_t* p = take(count);
    return std::vector<uint8_t>(p, p + count);
  }
  // A NUL-terminated string inside the next `field` bytes.
  std::string name(size_t field) {
    const uint8_t* p = take(field);
    const uint8_t* end = std::find(p, p + field, uint8_t{0});
    return std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(end - p));
  }

 private:
  const uint8_t* data_;
  size_t size_;
  const char* what_;
  size_t position_ = 0;
};

constexpr uint8_t kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

// Absolute file offset of a file address, checked to lie in the file with `bytes` after it.
int64_t absolute(const File& file, const FormatInfo& format, uint64_t address, uint64_t bytes, const char* what) {
  const uint64_t size = static_cast<uint64_t>(file.size());
  const uint64_t base = static_cast<uint64_t>(format.base);
  if (address == kUndefinedAddress || address > size || base > size - address || bytes > size - base - address) {
    corrupt(concat(what, " at address ", address, " (", bytes, " bytes) lies outside the file's ", size, " bytes"));
  }
  return static_cast<int64_t>(base + address);
}

uint64_t read_address(Reader& reader, const FormatInfo& format) {
  const uint64_t value = reader.integer(static_cast<size_t>(format.address_size));
  // All bits set (of the address's width) is HDF5's "undefined address".
  const uint64_t undefined = format.address_size >= 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * format.address_size)) - 1;
  return value == undefined ? kUndefinedAddress : value;
}

inline uint32_t rotate(uint32_t value, int bits) { return (value << bits) | (value >> (32 - bits)); }

}  // namespace

// ---------------------------------------------------------------- checksums

uint32_t lookup3_checksum(const uint8_t* data, size_t size, uint32_t initial) {
  uint32_t a = 0xdeadbeef + static_cast<uint32_t>(size) + initial, b = a, c = a;
  const auto mix = [&] {
    a -= c, a ^= rotate(c, 4), c += b;
    b -= a, b ^= rotate(a, 6), a += c;
    c -= b, c ^= rotate(b, 8), b += a;
    a -= c, a ^= rotate(c, 16), c += b;
    b -= a, b ^= rotate(a, 19), a += c;
    c -= b, c ^= rotate(b, 4), b += a;
  };
  const auto word = [](const uint8_t* p, size_t n) {
    uint32_t value = 0;
    for (size_t i = 0; i < n; ++i) value |= static_cast<uint32_t>(p[i]) << (8 * i);
    return value;
  };
  while (size > 12) {
    a += word(data, 4), b += word(data + 4, 4), c += word(data + 8, 4);
    mix();
    data += 12, size -= 12;
  }
  if (size == 0) return c;
  a += word(data, std::min<size_t>(size, 4));
  if (size > 4) b += word(data + 4, std::min<size_t>(size - 4, 4));
  if (size > 8) c += word(data + 8, size - 8);
  c ^= b, c -= rotate(b, 14);
  a ^= c, a -= rotate(c, 11);
  b ^= a, b -= rotate(a, 25);
  c ^= b, c -= rotate(b, 16);
  a ^= c, a -= rotate(c, 4);
  b ^= a, b -= rotate(a, 14);
  c ^= b, c -= rotate(b, 24);
  return c;
}

// --------------------------------------------------------------- superblock

std::optional<int64_t> find_superblock(const File& file) {
  for (int64_t offset = 0; offset + 8 <= file.size(); offset = offset == 0 ? 512 : offset * 2) {
    uint8_t signature[8];
    file.read_at(offset, 8, signature, "the superblock signature");
    if (std::memcmp(signature, kSignature, 8) == 0) return offset;
  }
  return std::nullopt;
}

FormatInfo read_format_info(const File& file) {
  const std::optional<int64_t> found = find_superblock(file);
  if (!found) corrupt("no HDF5 superblock signature");
  const int64_t offset = *found;
  const int64_t available = std::min<int64_t>(file.size() - offset, 64);
  const std::vector<uint8_t> bytes = file.read_at(offset, static_cast<size_t>(available), "the superblock");
  Reader reader(bytes, "the superblock");
  reader.skip(8);
  const uint8_t version = reader.u8();
  FormatInfo format;
  if (version <= 1) {
    reader.skip(4);  // free space, root group and shared header versions, reserved
    format.address_size = reader.u8();
    format.length_size = reader.u8();
    reader.skip(1 + 4 + 4 + (version == 1 ? 4 : 0));  // reserved, group K values, flags, indexed storage K
  } else if (version <= 3) {
    format.address_size = reader.u8();
    format.length_size = reader.u8();
    reader.skip(1);  // flags
  } else {
    corrupt(concat("unsupported superblock version ", int{version}));
  }
  for (int size : {format.address_size, format.length_size}) {
    if (size != 2 && size != 4 && size != 8) corrupt(concat("the superblock gives an invalid field size of ", size));
  }
  const uint64_t base = reader.integer(static_cast<size_t>(format.address_size));
  if (base > static_cast<uint64_t>(file.size()))
    corrupt(concat("the superblock's base address ", base, " is past the end"));
  format.base = static_cast<int64_t>(base);
  return format;
}

// ------------------------------------------------------------ object headers

namespace {

constexpr size_t kMaxHeaderChunks = 4096;

// A message just parsed: a continuation's (address, length) goes to `continuations`, a NIL message
// (type 0) nowhere, any other to `messages`.
void keep_message(Message message, std::vector<Message>& messages,
                  std::vector<std::pair<uint64_t, uint64_t>>& continuations, const FormatInfo& format) {
  if (message.type == kContinuationMessage) {
    Reader continuation(message.data, "continuation message");
    const uint64_t address = read_address(continuation, format);
    const uint64_t chunk = continuation.integer(static_cast<size_t>(format.length_size));
    continuations.emplace_back(address, chunk);
  } else if (message.type != 0) {
    messages.push_back(std::move(message));
  }
}

// Messages of one chunk [data, data + size) of a version 1 header.
void parse_v1_messages(const uint8_t* data, size_t size, std::vector<Message>& messages,
                       std::vector<std::pair<uint64_t, uint64_t>>& continuations, const FormatInfo& format) {
  Reader reader(data, size, "object header chunk");
  while (reader.remaining() >= 8) {
    Message message;
    message.type = reader.u16();
    const uint16_t length = reader.u16();
    message.flags = reader.u8();
    reader.skip(3);
    message.data = reader.bytes(length);
    keep_message(std::move(message), messages, continuations, format);
  }
}

// Messages of one version 2 chunk (after its signature, before its gap and checksum).
void parse_v2_messages(Reader& reader, size_t end, bool creation_order, std::vector<Message>& messages,
                       std::vector<std::pair<uint64_t, uint64_t>>& continuations, const FormatInfo& format) {
  const size_t header_bytes = creation_order ? 6 : 4;
  while (end - reader.position() >= header_bytes) {
    Message message;
    message.type = reader.u8();
    const uint16_t length = reader.u16();
    message.flags = reader.u8();
    if (creation_order) reader.skip(2);
    if (length > end - reader.position()) {
      corrupt(concat("object header message of type ", message.type, " claims ", length, " bytes, past its chunk"));
    }
    message.data = reader.bytes(length);
    keep_message(std::move(message), messages, continuations, format);
  }
  reader.seek(end);  // a gap too small for a message
}

void check_v2_checksum(const std::vector<uint8_t>& chunk, const char* what) {
  if (chunk.size() < 4) corrupt(concat(what, " is too short for its checksum"));
  const size_t body = chunk.size() - 4;
  Reader stored_reader(chunk.data() + body, 4, what);
  const uint32_t stored = stored_reader.u32();
  const uint32_t computed = lookup3_checksum(chunk.data(), body);
  if (stored != computed) corrupt(concat(what, " fails its checksum (stored ", stored, ", computed ", computed, ")"));
}

}  // namespace

std::vector<Message> read_object_header(const File& file, const FormatInfo& format, uint64_t address) {
  std::vector<Message> messages;
  std::vector<std::pair<uint64_t, uint64_t>> continuations;
  uint8_t start[4];
  file.read_at(absolute(file, format, address, 4, "object header"), 4, start, "an object header");
  const bool version2 = std::memcmp(start, "OHDR", 4) == 0;
  if (version2) {
    // Signature, version, flags, optional times and attribute limits, then the first chunk's size.
    std::vector<uint8_t> prefix =
        file.read_at(absolute(file, format, address, 6, "object header"), 6, "object header prefix");
    const uint8_t version = prefix[4], flags = prefix[5];
    if (version != 2) corrupt(concat("object header version ", int{version}, ", expected 2"));
    const size_t size_bytes = size_t{1} << (flags & 3);
    const size_t prefix_size = 6 + ((flags & 0x20) ? 16 : 0) + ((flags & 0x10) ? 4 : 0) + size_bytes;
    prefix = file.read_at(absolute(file, format, address, prefix_size, "object header"), prefix_size,
                          "object header prefix");
    Reader size_reader(prefix.data() + prefix_size - size_bytes, size_bytes, "object header prefix");
    const uint64_t chunk0 = size_reader.integer(size_bytes);
    const uint64_t total = prefix_size + chunk0 + 4;
    if (chunk0 > static_cast<uint64_t>(file.size())) corrupt(concat("object header chunk of ", chunk0, " bytes"));
    std::vector<uint8_t> chunk = file.read_at(absolute(file, format, address, total, "object header"),
                                              static_cast<size_t>(total), "object header chunk 0");
    check_v2_checksum(chunk, "object header");
    Reader reader(chunk, "object header");
    reader.seek(prefix_size);
    parse_v2_messages(reader, prefix_size + static_cast<size_t>(chunk0), (flags & 0x04) != 0, messages, continuations,
                      format);
    std::set<uint64_t> visited{address};
    for (size_t i = 0; i < continuations.size(); ++i) {
      const auto [where, length] = continuations[i];
      if (!visited.insert(where).second || visited.size() > kMaxHeaderChunks) {
        corrupt(concat("object header continuation at ", where, " repeats (a cycle)"));
      }
      if (length < 8) corrupt(concat("object header continuation of ", length, " bytes"));
      const std::vector<uint8_t> more =
          file.read_at(absolute(file, format, where, length, "object header continuation"), static_cast<size_t>(length),
                       "object header continuation");
      if (std::memcmp(more.data(), "OCHK", 4) != 0)
        corrupt(concat("object header continuation at ", where, " lacks OCHK"));
      check_v2_checksum(more, "object header continuation");
      Reader more_reader(more, "object header continuation");
      more_reader.seek(4);
      parse_v2_messages(more_reader, more.size() - 4, (flags & 0x04) != 0, messages, continuations, format);
    }
    return messages;
  }
  const std::vector<uint8_t> prefix =
      file.read_at(absolute(file, format, address, 16, "object header"), 16, "object header prefix");
  Reader prefix_reader(prefix, "object header prefix");
  const uint8_t version = prefix_reader.u8();
  if (version != 1) corrupt(concat("object header version ", int{version}, " at address ", address));
  prefix_reader.skip(1 + 2 + 4);  // reserved, message count, reference count
  const uint64_t chunk0 = prefix_reader.u32();
  continuations.emplace_back(address + 16, chunk0);
  std::set<uint64_t> visited;
  for (size_t i = 0; i < continuations.size(); ++i) {
    const auto [where, length] = continuations[i];
    if (!visited.insert(where).second || visited.size() > kMaxHeaderChunks) {
      corrupt(concat("object header continuation at ", where, " repeats (a cycle)"));
    }
    const std::vector<uint8_t> chunk = file.read_at(absolute(file, format, where, length, "object header chunk"),
                                                    static_cast<size_t>(length), "object header chunk");
    parse_v1_messages(chunk.data(), chunk.size(), messages, continuations, format);
  }
  return messages;
}

// ---------------------------------------------------------------- datatypes

bool Datatype::plain_integer() const {
  return (type_class == kFixedPoint || type_class == kBitfield) && bit_offset == 0 && precision == 8 * size &&
         (size == 1 || size == 2 || size == 4 || size == 8);
}

bool Datatype::ieee_float() const {
  if (type_class != kFloat || bit_offset != 0 || precision != 8 * size ||
      exponent_location + exponent_size != sign_location || mantissa_location != 0 ||
      mantissa_size != exponent_location || sign_location + 1u != 8 * size) {
    return false;
  }
  // Implied leading one (normalisation 2), and the exponent bias of the standard formats.
  const bool normalised = ((bits >> 4) & 3) == 2;
  if (size == 2) return normalised && exponent_size == 5 && exponent_bias == 15;
  if (size == 4) return normalised && exponent_size == 8 && exponent_bias == 127;
  if (size == 8) return normalised && exponent_size == 11 && exponent_bias == 1023;
  return false;
}

std::string Datatype::describe() const {
  static const char* kNames[] = {"integer",  "float",     "time", "string",          "bitfield", "opaque",
                                 "compound", "reference", "enum", "variable-length", "array"};
  const char* name = type_class >= 0 && type_class <= 10 ? kNames[type_class] : "unknown";
  return concat("HDF5 ", variable_string ? "variable-length string" : name, ", ", size, " bytes");
}

namespace {

constexpr int kMaxTypeDepth = 8;
constexpr uint32_t kMaxMembers = 4096;

Datatype decode_datatype_at(Reader& reader, const FormatInfo& format, int depth);

// Member and enum names: NUL-terminated, padded to 8 bytes before version 3.
std::string member_name(Reader& reader, int version) {
  const uint8_t* start = reader.here();
  const uint8_t* end = std::find(start, start + reader.remaining(), uint8_t{0});
  if (end == start + reader.remaining()) corrupt("datatype member name is not terminated");
  const size_t length = static_cast<size_t>(end - start);
  std::string name(reinterpret_cast<const char*>(start), length);
  reader.skip(version < 3 ? (length + 8) / 8 * 8 : length + 1);
  return name;
}

Datatype decode_datatype_at(Reader& reader, const FormatInfo& format, int depth) {
  if (depth > kMaxTypeDepth) corrupt("datatype nested too deeply");
  Datatype type;
  const uint8_t class_and_version = reader.u8();
  type.type_class = class_and_version & 0x0f;
  type.version = class_and_version >> 4;
  if (type.version < 1 || type.version > 4) corrupt(concat("datatype message version ", type.version));
  type.bits = static_cast<uint32_t>(reader.integer(3));
  type.size = reader.u32();
  switch (type.type_class) {
    case Datatype::kFixedPoint:
    case Datatype::kBitfield:
      type.big_endian = type.bits & 1;
      type.is_signed = type.type_class == Datatype::kFixedPoint && (type.bits & 8);
      type.bit_offset = reader.u16();
      type.precision = reader.u16();
      break;
    case Datatype::kFloat:
      type.big_endian = type.bits & 1;
      if (type.bits & 0x40) corrupt("VAX floating-point byte order");
      type.sign_location = static_cast<uint8_t>((type.bits >> 8) & 0xff);
      type.bit_offset = reader.u16();
      type.precision = reader.u16();
      type.exponent_location = reader.u8();
      type.exponent_size = reader.u8();
      type.mantissa_location = reader.u8();
      type.mantissa_size = reader.u8();
      type.exponent_bias = reader.u32();
      break;
    case Datatype::kString:
      type.padding = type.bits & 0x0f;
      break;
    case Datatype::kEnum: {
      const uint32_t count = type.bits & 0xffff;
      if (count > kMaxMembers) corrupt(concat("enum datatype with ", count, " members"));
      auto base = std::make_shared<Datatype>(decode_datatype_at(reader, format, depth + 1));
      if (base->size == 0 || base->size > 8) corrupt(concat("enum datatype with a ", base->size, "-byte base"));
      for (uint32_t i = 0; i < count; ++i) type.members.push_back({member_name(reader, type.version), 0, base});
      for (uint32_t i = 0; i < count; ++i) type.enum_values.push_back(reader.bytes(base->size));
      if (base->size != type.size) corrupt(concat("enum of ", type.size, " bytes over a ", base->size, "-byte base"));
      type.base = std::move(base);
      break;
    }
    case Datatype::kVariableLength: {
      type.variable_string = (type.bits & 0x0f) == 1;
      type.padding = (type.bits >> 4) & 0x0f;
      type.base = std::make_shared<Datatype>(decode_datatype_at(reader, format, depth + 1));
      const uint32_t descriptor = 4 + static_cast<uint32_t>(format.address_size) + 4;
      if (type.size != descriptor) {
        corrupt(concat("variable-length datatype of ", type.size, " bytes, expected ", descriptor));
      }
      break;
    }
    case Datatype::kCompound: {
      const uint32_t count = type.bits & 0xffff;
      if (count > kMaxMembers) corrupt(concat("compound datatype with ", count, " members"));
      for (uint32_t i = 0; i < count; ++i) {
        Datatype::Member member;
        member.name = member_name(reader, type.version);
        if (type.version >= 3) {
          size_t width = 1;
          while (width < 8 && (uint64_t{1} << (8 * width)) <= type.size) ++width;
          member.offset = static_cast<uint32_t>(reader.integer(width));
        } else {
          member.offset = reader.u32();
        }
        if (type.version == 1) reader.skip(1 + 3 + 4 + 4 + 16);  // dimensionality, reserved, permutation, sizes
        member.type = std::make_shared<Datatype>(decode_datatype_at(reader, format, depth + 1));
        if (member.offset > type.size || member.type->size > type.size - member.offset) {
          corrupt(concat("compound member '", member.name, "' at ", member.offset, " overflows the ", type.size,
                         "-byte compound"));
        }
        type.members.push_back(std::move(member));
      }
      break;
    }
    default:
      // Time, opaque, reference, array: torch_shards reads none of them;
      // their properties are skipped with the rest of the message.
      reader.skip(reader.remaining());
      break;
  }
  if (type.type_class == Datatype::kFixedPoint || type.type_class == Datatype::kFloat ||
      type.type_class == Datatype::kBitfield) {
    if (type.size == 0 || type.size > 16 || type.precision == 0 || type.bit_offset + type.precision > 8 * type.size) {
      corrupt(concat("numeric datatype of ", type.size, " bytes with ", type.precision, " bits at offset ",
                     type.bit_offset));
    }
  }
  if (type.size == 0) corrupt("datatype of 0 bytes");
  return type;
}

}  // namespace

Datatype decode_datatype(const std::vector<uint8_t>& message, const FormatInfo& format) {
  Reader reader(message, "datatype message");
  return decode_datatype_at(reader, format, 0);
}

// --------------------------------------------------------------- dataspaces

uint64_t Dataspace::elements() const {
  if (kind == kNull) return 0;
  uint64_t count = 1;
  for (uint64_t dim : dims) {
    if (dim != 0 && count > ~uint64_t{0} / dim) corrupt("dataspace with more than 2^64 elements");
    count *= dim;
  }
  return count;
}

namespace {

Dataspace decode_dataspace_at(Reader& reader, const FormatInfo& format) {
  Dataspace space;
  const uint8_t version = reader.u8();
  const uint8_t rank = reader.u8();
  const uint8_t flags = reader.u8();
  if (version == 1) {
    reader.skip(5);
    space.kind = rank == 0 ? Dataspace::kScalar : Dataspace::kSimple;
  } else if (version == 2) {
    const uint8_t kind = reader.u8();
    if (kind > 2) corrupt(concat("dataspace of type ", int{kind}));
    space.kind = static_cast<Dataspace::Kind>(kind);
  } else {
    corrupt(concat("dataspace message version ", int{version}));
  }
  if (rank > 32) corrupt(concat("dataspace of rank ", int{rank}, " (HDF5 allows 32)"));
  if (space.kind != Dataspace::kSimple && rank != 0) corrupt("scalar or null dataspace with dimensions");
  for (int d = 0; d < rank; ++d) space.dims.push_back(reader.integer(static_cast<size_t>(format.length_size)));
  if (flags & 1) {
    for (int d = 0; d < rank; ++d) space.max_dims.push_back(reader.integer(static_cast<size_t>(format.length_size)));
    for (int d = 0; d < rank; ++d) {
      const uint64_t unlimited = format.length_size >= 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * format.length_size)) - 1;
      if (space.max_dims[d] == unlimited) {
        space.max_dims[d] = ~uint64_t{0};
      } else if (space.max_dims[d] < space.dims[d]) {
        corrupt(concat("dataspace dimension ", d, " is ", space.dims[d], ", above its maximum ", space.max_dims[d]));
      }
    }
  }
  space.elements();  // checks the product
  return space;
}

}  // namespace

Dataspace decode_dataspace(const std::vector<uint8_t>& message, const FormatInfo& format) {
  Reader reader(message, "dataspace message");
  return decode_dataspace_at(reader, format);
}

// ------------------------------------------------------------------- layout

Layout decode_layout(const std::vector<uint8_t>& message, const FormatInfo& format) {
  Reader reader(message, "layout message");
  Layout layout;
  const uint8_t version = reader.u8();
  if (version == 1 || version == 2) {
    const uint8_t rank = reader.u8();
    const uint8_t kind = reader.u8();
    if (kind > 2) corrupt(concat("layout class ", int{kind}));
    layout.kind = static_cast<Layout::Kind>(kind);
    reader.skip(5);
    if (layout.kind != Layout::kCompact) layout.address = read_address(reader, format);
    if (rank < 1 || rank > 33) corrupt(concat("layout of ", int{rank}, " dimensions"));
    std::vector<uint64_t> dims;
    for (int d = 0; d < rank; ++d) dims.push_back(reader.u32());
    // Chunked: the last "dimension" is the element size.
    if (layout.kind == Layout::kChunked) layout.chunk.assign(dims.begin(), dims.end() - 1);
    if (layout.kind == Layout::kCompact) layout.compact = reader.bytes(reader.u32());
    return layout;
  }
  if (version != 3 && version != 4) corrupt(concat("layout message version ", int{version}));
  const uint8_t kind = reader.u8();
  if (kind > 3) corrupt(concat("layout class ", int{kind}));
  layout.kind = static_cast<Layout::Kind>(kind);
  switch (layout.kind) {
    case Layout::kCompact:
      layout.compact = reader.bytes(reader.u16());
      break;
    case Layout::kContiguous:
      layout.address = read_address(reader, format);
      layout.size = reader.integer(static_cast<size_t>(format.length_size));
      break;
    case Layout::kChunked: {
      if (version == 3) {
        const uint8_t rank = reader.u8();
        if (rank < 2 || rank > 33) corrupt(concat("chunked layout of ", int{rank}, " dimensions"));
        layout.address = read_address(reader, format);
        for (int d = 0; d + 1 < rank; ++d) layout.chunk.push_back(reader.u32());
        reader.skip(4);  // element size
      } else {
        reader.skip(1);  // flags
        const uint8_t rank = reader.u8();
        const uint8_t width = reader.u8();
        if (rank < 2 || rank > 33 || width < 1 || width > 8) {
          corrupt(concat("chunked layout of ", int{rank}, " dimensions of ", int{width}, " bytes"));
        }
        for (int d = 0; d + 1 < rank; ++d) layout.chunk.push_back(reader.integer(width));
        reader.skip(width);  // element size
        // Chunk index type and its parameters, then its address: read by libhdf5.
      }
      for (uint64_t extent : layout.chunk) {
        if (extent == 0) corrupt("chunk dimension of 0");
      }
      break;
    }
    case Layout::kVirtual:
      break;
  }
  return layout;
}

// -------------------------------------------------------------- fill values

std::vector<uint8_t> decode_fill_value(const Message& message) {
  Reader reader(message.data, "fill value message");
  if (message.type == kOldFillValueMessage) return reader.bytes(reader.u32());
  const uint8_t version = reader.u8();
  if (version == 1 || version == 2) {
    reader.skip(2);  // allocation and write times
    const uint8_t defined = reader.u8();
    if (version == 2 && !defined) return {};
    return reader.bytes(reader.u32());
  }
  if (version != 3) corrupt(concat("fill value message version ", int{version}));
  const uint8_t flags = reader.u8();
  if (!(flags & 0x20)) return {};
  return reader.bytes(reader.u32());
}

// ---------------------------------------------------------- filter pipeline

std::vector<Filter> decode_filter_pipeline(const std::vector<uint8_t>& message) {
  Reader reader(message, "filter pipeline message");
  const uint8_t version = reader.u8();
  const uint8_t count = reader.u8();
  if (version != 1 && version != 2) corrupt(concat("filter pipeline message version ", int{version}));
  if (count == 0 || count > 32) corrupt(concat("filter pipeline of ", int{count}, " filters (HDF5 writes 1 to 32)"));
  if (version == 1) reader.skip(6);
  std::vector<Filter> filters;
  for (int i = 0; i < count; ++i) {
    Filter filter;
    filter.id = reader.u16();
    const uint16_t name_length = version == 1 || filter.id >= 256 ? reader.u16() : 0;
    filter.flags = reader.u16();
    const uint16_t values = reader.u16();
    if (name_length > 0) {
      filter.name = reader.name(name_length);
      if (version == 1) reader.skip((8 - name_length % 8) % 8);
    }
    for (int v = 0; v < values; ++v) filter.values.push_back(reader.u32());
    if (version == 1 && values % 2) reader.skip(4);
    filters.push_back(std::move(filter));
  }
  return filters;
}

// --------------------------------------------------------------- attributes

Attribute decode_attribute(const std::vector<uint8_t>& message, const FormatInfo& format) {
  Reader reader(message, "attribute message");
  const uint8_t version = reader.u8();
  if (version < 1 || version > 3) corrupt(concat("attribute message version ", int{version}));
  const uint8_t flags = reader.u8();
  const uint16_t name_size = reader.u16();
  const uint16_t type_size = reader.u16();
  const uint16_t space_size = reader.u16();
  if (version >= 2 && (flags & 3)) corrupt("attribute with a shared (committed) datatype or dataspace");
  if (version == 3) reader.skip(1);  // name character set
  const auto padded = [&](size_t size) { return version == 1 ? (size + 7) / 8 * 8 : size; };
  Attribute attribute;
  reader.need(padded(name_size));
  attribute.name = reader.name(name_size);
  if (version == 1) reader.skip(padded(name_size) - name_size);
  {
    Reader type_reader(reader.take(type_size), type_size, "attribute datatype");
    attribute.type = decode_datatype_at(type_reader, format, 0);
    if (version == 1) reader.skip(padded(type_size) - type_size);
  }
  {
    Reader space_reader(reader.take(space_size), space_size, "attribute dataspace");
    attribute.space = decode_dataspace_at(space_reader, format);
    if (version == 1) reader.skip(padded(space_size) - space_size);
  }
  const uint64_t elements = attribute.space.elements();
  if (elements > reader.remaining() / attribute.type.size) {
    corrupt(concat("attribute '", attribute.name, "' needs ", elements, " elements of ", attribute.type.size,
                   " bytes, its message holds ", reader.remaining()));
  }
  attribute.data = reader.bytes(static_cast<size_t>(elements) * attribute.type.size);
  return attribute;
}

bool has_dense_attributes(const std::vector<Message>& messages, const FormatInfo& format) {
  for (const Message& message : messages) {
    if (message.type != kAttributeInfoMessage) continue;
    Reader reader(message.data, "attribute info message");
    reader.skip(1);  // version
    const uint8_t flags = reader.u8();
    if (flags & 1) reader.skip(2);
    if (read_address(reader, format) != kUndefinedAddress) return true;
  }
  return false;
}

// ------------------------------------------------------------- global heap

namespace {

// One global heap collection: its objects' bytes by index.
struct HeapCollection {
  std::vector<uint8_t> bytes;
  std::map<uint32_t, std::pair<size_t, size_t>> objects;  // index -> (offset, size) in bytes
};

HeapCollection read_collection(const File& file, const FormatInfo& format, uint64_t address) {
  const size_t header = 8 + static_cast<size_t>(format.length_size);
  std::vector<uint8_t> start = file.read_at(absolute(file, format, address, header, "global heap collection"), header,
                                            "a global heap collection");
  if (std::memcmp(start.data(), "GCOL", 4) != 0) corrupt(concat("no global heap collection at address ", address));
  if (start[4] != 1) corrupt(concat("global heap collection version ", int{start[4]}, " at address ", address));
  Reader size_reader(start.data() + 8, static_cast<size_t>(format.length_size), "global heap collection");
  const uint64_t size = size_reader.integer(static_cast<size_t>(format.length_size));
  if (size < header) corrupt(concat("global heap collection at ", address, " claims ", size, " bytes"));
  HeapCollection collection;
  collection.bytes = file.read_at(absolute(file, format, address, size, "global heap collection"),
                                  static_cast<size_t>(size), "a global heap collection");
  Reader reader(collection.bytes, "global heap collection");
  reader.seek(header);
  const size_t object_header = 8 + static_cast<size_t>(format.length_size);
  while (reader.remaining() >= object_header) {
    const uint16_t index = reader.u16();
    reader.skip(2 + 4);  // reference count, reserved
    const uint64_t object_size = reader.integer(static_cast<size_t>(format.length_size));
    if (index == 0) break;  // free space: the rest of the collection
    if (object_size > reader.remaining()) {
      corrupt(concat("global heap object ", index, " at ", address, " claims ", object_size,
                     " bytes, past its collection"));
    }
    if (!collection.objects.emplace(index, std::make_pair(reader.position(), static_cast<size_t>(object_size)))
             .second) {
      corrupt(concat("global heap collection at ", address, " holds object ", index, " twice"));
    }
    reader.skip(static_cast<size_t>(object_size));
    reader.align(8);
  }
  return collection;
}

}  // namespace

std::vector<std::string> read_variable_strings(const File& file, const FormatInfo& format, const uint8_t* descriptors,
                                               size_t count) {
  const size_t width = 4 + static_cast<size_t>(format.address_size) + 4;
  std::map<uint64_t, HeapCollection> collections;
  std::vector<std::string> strings;
  strings.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    Reader reader(descriptors + i * width, width, "variable-length descriptor");
    const uint32_t length = reader.u32();
    const uint64_t address = read_address(reader, format);
    const uint32_t index = reader.u32();
    if (address == 0) {  // a null sequence (HDF5 ignores its length): an empty string
      strings.emplace_back();
      continue;
    }
    auto found = collections.find(address);
    if (found == collections.end()) {
      if (collections.size() > 4096) collections.clear();  // bound the cache on huge string arrays
      found = collections.emplace(address, read_collection(file, format, address)).first;
    }
    const auto object = found->second.objects.find(index);
    if (object == found->second.objects.end()) {
      corrupt(concat("string ", i, " refers to global heap object ", index, " at address ", address,
                     ", which the collection does not hold"));
    }
    const auto [offset, size] = object->second;
    if (size != length) {
      corrupt(concat("string ", i, " is ", length, " bytes long but its global heap object holds ", size));
    }
    // HDF5 hands variable-length strings out as C strings: a NUL ends them.
    const char* text = reinterpret_cast<const char*>(found->second.bytes.data() + offset);
    strings.emplace_back(text, static_cast<size_t>(std::find(text, text + size, '\0') - text));
  }
  return strings;
}

std::vector<std::string> read_fixed_strings(const uint8_t* data, size_t count, size_t size, int padding) {
  std::vector<std::string> strings;
  strings.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const char* start = reinterpret_cast<const char*>(data + i * size);
    std::string value(start, size);
    value.erase(std::find(value.begin(), value.end(), '\0'), value.end());
    if (padding == 2) value.erase(value.find_last_not_of(' ') + 1);
    strings.push_back(std::move(value));
  }
  return strings;
}

}  // namespace torch_shards::io::hdf5

namespace torch_shards::io::hdf5 {

void read_ahead_chunk_btree(const File& file, const FormatInfo& format, uint64_t root, size_t dimensionality) {
  if (!file.remote() || root == kUndefinedAddress) return;
  constexpr int kMaxLevels = 16;
  constexpr size_t kMaxNodes = 1 << 14;
  constexpr int64_t kNodeReadBytes = 4 << 10;  // a node's start: pages are 64 KiB, nodes a few KB
  const size_t address_size = static_cast<size_t>(format.address_size);
  const size_t header_bytes = 8 + 2 * address_size;  // "TREE", type, level, entries, siblings
  const size_t key_bytes = 8 + 8 * dimensionality;   // chunk size, filter mask, offsets
  const int64_t file_size = file.size();
  std::vector<uint64_t> level = {root};
  size_t visited = 0;
  try {
    for (int depth = 0; depth < kMaxLevels && !level.empty() && visited < kMaxNodes; ++depth) {
      std::vector<std::pair<int64_t, int64_t>> ranges;
      for (uint64_t address : level) ranges.emplace_back(format.base + static_cast<int64_t>(address), kNodeReadBytes);
      file.hold_pages(ranges);  // this level's nodes in one round trip
      std::vector<uint64_t> next;
      for (uint64_t address : level) {
        ++visited;
        const int64_t at = format.base + static_cast<int64_t>(address);
        if (at < 0 || at + static_cast<int64_t>(header_bytes) > file_size) return;
        const std::vector<uint8_t> header = file.read_at(at, header_bytes, "a chunk index node");
        Reader reader(header, "a chunk index node");
        if (std::memcmp(reader.take(4), "TREE", 4) != 0 || reader.u8() != 1) return;  // not a chunk B-tree node
        const uint8_t node_level = reader.u8();
        const uint64_t entries = reader.integer(2);
        if (node_level == 0) continue;  // a leaf: its children are chunks
        const int64_t node_bytes =
            static_cast<int64_t>(header_bytes + entries * (key_bytes + address_size) + key_bytes);
        if (at + node_bytes > file_size) return;
        const std::vector<uint8_t> node = file.read_at(at, static_cast<size_t>(node_bytes), "a chunk index node");
        Reader children(node, "a chunk index node");
        children.seek(header_bytes);
        for (uint64_t i = 0; i < entries && next.size() < kMaxNodes; ++i) {
          children.skip(key_bytes);
          next.push_back(read_address(children, format));
        }
      }
      level = std::move(next);
    }
  } catch (const std::runtime_error&) {
    // A read ahead only: what it could not make sense of, HDF5 reads (and judges) itself.
  }
}

}  // namespace torch_shards::io::hdf5
