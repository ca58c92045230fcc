// The HDF5 on-disk structures torch_shards decodes itself instead of asking
// libhdf5: the superblock's address sizes, object headers (versions 1 and 2,
// with their checksums), the datatype, dataspace, layout, fill value, filter
// pipeline and attribute messages inside them, and global heap collections
// (where variable-length strings live).
//
// Why: HDF5 1.10 (Debian 12's libhdf5) trusts these structures. A variable-
// length string whose heap object index lies past the end of its collection
// is read anyway (SIGSEGV), a heap object of size 0 makes the collection
// loader loop forever, an attribute or fill value with an absurd datatype
// size is allocated before anything checks it. Here every size, offset,
// count and index is checked against the bytes that hold it and the size of
// the file before it is used: a corrupt file is a std::runtime_error saying
// what is wrong, which callers turn into a ReadError naming the file and the
// object. Nothing here calls libhdf5.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/file.h"

namespace torch_shards::io::hdf5 {

// What the superblock says about addresses: every address in the file is
// relative to `base`; addresses and lengths take `address_size` and
// `length_size` bytes.
struct FormatInfo {
  int64_t base = 0;
  int address_size = 8;
  int length_size = 8;
};
// Where the superblock starts: the first of 0, 512, 1024, 2048 ... bytes that
// holds HDF5's signature; none in a file of another format. A read that fails
// raises (behind a URL: the request's failure, never taken for "not HDF5").
std::optional<int64_t> find_superblock(const File& file);
// Reads the superblock (at 0, 512, 1024, 2048 ... bytes).
FormatInfo read_format_info(const File& file);

constexpr uint64_t kUndefinedAddress = ~uint64_t{0};

// Message types torch_shards reads.
enum MessageType : uint16_t {
  kDataspaceMessage = 0x0001,
  kDatatypeMessage = 0x0003,
  kOldFillValueMessage = 0x0004,
  kFillValueMessage = 0x0005,
  kLayoutMessage = 0x0008,
  kFilterPipelineMessage = 0x000B,
  kAttributeMessage = 0x000C,
  kContinuationMessage = 0x0010,
  kAttributeInfoMessage = 0x0015,
};

struct Message {
  uint16_t type = 0;
  uint8_t flags = 0;  // bit 1: the message is shared (stored elsewhere)
  std::vector<uint8_t> data;
};

// Every message of the object header at `address`, following continuation
// chunks; version 2 chunks must match their checksums.
std::vector<Message> read_object_header(const File& file, const FormatInfo& format, uint64_t address);

struct Datatype {
  enum Class {
    kFixedPoint = 0,
    kFloat = 1,
    kTime = 2,
    kString = 3,
    kBitfield = 4,
    kOpaque = 5,
    kCompound = 6,
    kReference = 7,
    kEnum = 8,
    kVariableLength = 9,
    kArray = 10
  };
  int type_class = kFixedPoint;
  int version = 1;
  uint32_t bits = 0;  // the class bit field
  uint32_t size = 0;  // bytes per element (a variable-length element: its on-disk descriptor)
  // Fixed point and floating point.
  bool big_endian = false;
  bool is_signed = false;
  uint16_t bit_offset = 0, precision = 0;
  uint8_t exponent_location = 0, exponent_size = 0, mantissa_location = 0, mantissa_size = 0, sign_location = 0;
  uint32_t exponent_bias = 0;
  // Strings (fixed or variable length): padding 0 null-terminated, 1 null-padded, 2 space-padded.
  bool variable_string = false;
  int padding = 0;
  // Compound members, enum members (names and values), the base of enums and variable-length types.
  struct Member {
    std::string name;
    uint32_t offset = 0;
    std::shared_ptr<const Datatype> type;
  };
  std::vector<Member> members;
  std::vector<std::vector<uint8_t>> enum_values;
  std::shared_ptr<const Datatype> base;

  // An integer stored as plain bytes (no padding bits): offset 0, precision 8 * size.
  bool plain_integer() const;
  // An IEEE 754 half, single or double of its size, no padding bits.
  bool ieee_float() const;
  std::string describe() const;  // "32-bit little-endian signed integer", for messages
};
Datatype decode_datatype(const std::vector<uint8_t>& message, const FormatInfo& format);

struct Dataspace {
  enum Kind { kScalar, kSimple, kNull } kind = kSimple;
  std::vector<uint64_t> dims, max_dims;  // max_dims empty when not stored
  uint64_t elements() const;             // throws if the product overflows 64 bits
};
Dataspace decode_dataspace(const std::vector<uint8_t>& message, const FormatInfo& format);

struct Layout {
  enum Kind { kCompact = 0, kContiguous = 1, kChunked = 2, kVirtual = 3 } kind = kContiguous;
  uint64_t address = kUndefinedAddress;  // contiguous: where the data starts
  uint64_t size = 0;                     // contiguous: bytes stored (0 if the message does not say)
  std::vector<uint8_t> compact;          // compact: the data itself
  std::vector<uint64_t> chunk;           // chunked: chunk dimensions (without the element size)
};
Layout decode_layout(const std::vector<uint8_t>& message, const FormatInfo& format);

// For a file behind a URL: fetches the nodes of the version 1 B-tree of a chunked dataset's chunk index
// (root at `root`; `dimensionality`: the dataset's rank + 1) into the file's pages a level at a time, each
// level in one round trip, before libhdf5 walks them one node after another. A read ahead only: it
// stops, saying nothing, at whatever it does not recognise (libhdf5 reads and judges the index itself).
void read_ahead_chunk_btree(const File& file, const FormatInfo& format, uint64_t root, size_t dimensionality);

// Bytes of the fill value defined by a fill value message (old or new), or
// nullopt-like empty vector when none is defined.
std::vector<uint8_t> decode_fill_value(const Message& message);

struct Filter {
  uint16_t id = 0;
  uint16_t flags = 0;
  std::string name;
  std::vector<uint32_t> values;
};
std::vector<Filter> decode_filter_pipeline(const std::vector<uint8_t>& message);

struct Attribute {
  std::string name;
  Datatype type;
  Dataspace space;
  std::vector<uint8_t> data;  // elements * type.size bytes, as stored
};
// Throws std::runtime_error for shared datatypes or dataspaces (committed
// types), which torch_shards does not follow.
Attribute decode_attribute(const std::vector<uint8_t>& message, const FormatInfo& format);
// Whether the object keeps attributes in dense storage (a fractal heap),
// which this module does not read.
bool has_dense_attributes(const std::vector<Message>& messages, const FormatInfo& format);

// Variable-length strings: `count` descriptors (sequence length, heap
// collection address, object index; 4 + address_size + 4 bytes each) looked
// up in their global heap collections.
std::vector<std::string> read_variable_strings(const File& file, const FormatInfo& format, const uint8_t* descriptors,
                                               size_t count);
// Fixed-length strings of `size` bytes, as a datatype's padding says.
std::vector<std::string> read_fixed_strings(const uint8_t* data, size_t count, size_t size, int padding);

// Jenkins' lookup3 hash (hashlittle), HDF5's metadata checksum.
uint32_t lookup3_checksum(const uint8_t* data, size_t size, uint32_t initial = 0);

}  // namespace torch_shards::io::hdf5
