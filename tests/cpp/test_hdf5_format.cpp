// Native decoding of HDF5 structures (hdf5_format.h): the lookup3 checksum
// against Jenkins' published values; global heap collections, object headers
// and messages built byte by byte here, valid and corrupted: every
// corruption is a std::runtime_error, never a read outside the bytes, a loop
// or an allocation sized by the file. Files written by libhdf5 itself check
// the decoders agree with it (datatypes, dataspaces, attributes, strings,
// scale-offset chunks). Build once with -fsanitize=address,undefined.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/thread_pool.h"
#include "io/array.h"
#include "io/codecs.h"
#include "io/file.h"
#include "io/hdf5_array.h"
#include "io/hdf5_format.h"
#include "io/hdf5_library.h"

namespace torch_shards::io::hdf5 {
namespace {

using Bytes = std::vector<uint8_t>;

// Files are named by this process too: another run of the suites (ctest -j, a second checkout) writes
// the same names at the same time.
std::string temp_path(const std::string& name) {
  return testing::TempDir() + "/" + std::to_string(::getpid()) + "_" + name;
}

std::string write_bytes(const std::string& name, const Bytes& bytes) {
  const std::string path = temp_path(name);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return path;
}

void put(Bytes& bytes, size_t offset, uint64_t value, size_t width) {
  if (bytes.size() < offset + width) bytes.resize(offset + width, 0);
  for (size_t i = 0; i < width; ++i) bytes[offset + i] = static_cast<uint8_t>(value >> (8 * i));
}

const FormatInfo kFormat{0, 8, 8};

TEST(Hdf5Format, Lookup3MatchesJenkinsPublishedValues) {
  const std::string text = "Four score and seven years ago";
  const auto* data = reinterpret_cast<const uint8_t*>(text.data());
  EXPECT_EQ(lookup3_checksum(nullptr, 0, 0), 0xdeadbeefu);
  EXPECT_EQ(lookup3_checksum(nullptr, 0, 0xdeadbeef), 0xbd5b7ddeu);
  EXPECT_EQ(lookup3_checksum(data, text.size(), 0), 0x17770551u);
  EXPECT_EQ(lookup3_checksum(data, text.size(), 1), 0xcd628161u);
}

// A global heap collection at `address` holding `objects` (index, bytes), then free space.
Bytes collection(uint64_t address, const std::vector<std::pair<uint16_t, std::string>>& objects, uint64_t size = 4096) {
  Bytes bytes(address, 0);
  const size_t start = address;
  bytes.resize(start + size, 0);
  std::memcpy(bytes.data() + start, "GCOL", 4);
  bytes[start + 4] = 1;
  put(bytes, start + 8, size, 8);
  size_t position = start + 16;
  for (const auto& [index, data] : objects) {
    put(bytes, position, index, 2);
    put(bytes, position + 2, 1, 2);
    put(bytes, position + 8, data.size(), 8);
    std::memcpy(bytes.data() + position + 16, data.data(), data.size());
    position += 16 + (data.size() + 7) / 8 * 8;
  }
  put(bytes, position, 0, 2);  // free space
  put(bytes, position + 8, start + size - position, 8);
  return bytes;
}

Bytes descriptor(uint32_t length, uint64_t address, uint32_t index) {
  Bytes bytes;
  put(bytes, 0, length, 4);
  put(bytes, 4, address, 8);
  put(bytes, 12, index, 4);
  return bytes;
}

std::vector<std::string> strings_from(const Bytes& file_bytes, const std::vector<Bytes>& descriptors) {
  const File file(write_bytes("heap.bin", file_bytes));
  Bytes all;
  for (const Bytes& d : descriptors) all.insert(all.end(), d.begin(), d.end());
  return read_variable_strings(file, kFormat, all.data(), descriptors.size());
}

TEST(Hdf5Format, TheSuperblockIsFoundWhereItsSignatureIs) {
  const Bytes signature = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  Bytes at_512(2048, 'x');
  std::copy(signature.begin(), signature.end(), at_512.begin() + 512);
  EXPECT_EQ(find_superblock(File(write_bytes("at_512.bin", at_512))), std::optional<int64_t>(512));
  Bytes at_3(2048, 'x');  // not at 0, 512, 1024 ...: no superblock
  std::copy(signature.begin(), signature.end(), at_3.begin() + 3);
  EXPECT_EQ(find_superblock(File(write_bytes("at_3.bin", at_3))), std::nullopt);
  EXPECT_EQ(find_superblock(File(write_bytes("short.bin", Bytes(5, 'x')))), std::nullopt);
  EXPECT_THROW(read_format_info(File(write_bytes("text.bin", Bytes(4096, 'x')))), std::runtime_error);
}

TEST(Hdf5Format, VariableLengthStringsComeFromTheirHeapObjects) {
  const Bytes file = collection(64, {{1, "cell0"}, {2, std::string("gene\0xx", 7)}, {7, ""}});
  // A NUL ends a string and address 0 is a null sequence whatever its length, as in HDF5.
  EXPECT_EQ(strings_from(file, {descriptor(5, 64, 1), descriptor(7, 64, 2), descriptor(0, 64, 7), descriptor(0, 0, 0),
                                descriptor(9, 0, 3)}),
            (std::vector<std::string>{"cell0", "gene", "", "", ""}));
}

TEST(Hdf5Format, CorruptStringReferencesAndCollectionsAreErrors) {
  const Bytes file = collection(64, {{1, "cell0"}, {2, "cell1"}});
  // An index the collection does not hold (HDF5 1.10 reads past its object table).
  EXPECT_THROW(strings_from(file, {descriptor(5, 64, 3)}), std::runtime_error);
  EXPECT_THROW(strings_from(file, {descriptor(5, 64, 70000)}), std::runtime_error);
  // A length that is not the object's.
  EXPECT_THROW(strings_from(file, {descriptor(6, 64, 1)}), std::runtime_error);
  // An address outside the file, or one that is no collection.
  EXPECT_THROW(strings_from(file, {descriptor(5, uint64_t{1} << 48, 1)}), std::runtime_error);
  EXPECT_THROW(strings_from(file, {descriptor(5, 8, 1)}), std::runtime_error);
  // A length 0 string whose address is garbage (only address 0 means "null").
  EXPECT_THROW(strings_from(file, {descriptor(0, 12345, 1)}), std::runtime_error);
  // An object larger than its collection, and a collection larger than the file.
  Bytes big_object = file;
  put(big_object, 64 + 16 + 8, uint64_t{1} << 40, 8);
  EXPECT_THROW(strings_from(big_object, {descriptor(5, 64, 1)}), std::runtime_error);
  Bytes big_collection = file;
  put(big_collection, 64 + 8, uint64_t{1} << 40, 8);
  EXPECT_THROW(strings_from(big_collection, {descriptor(5, 64, 1)}), std::runtime_error);
  // The same index twice.
  EXPECT_THROW(strings_from(collection(64, {{1, "a"}, {1, "b"}}), {descriptor(1, 64, 1)}), std::runtime_error);
}

TEST(Hdf5Format, ZeroSizedHeapObjectsEndInsteadOfLooping) {
  // HDF5 1.10 loops forever on a collection whose objects never advance.
  Bytes file = collection(64, {{1, "x"}});
  for (size_t position = 64 + 16; position + 16 <= 64 + 4096; position += 16) {
    put(file, position, 5, 2);  // index 5, size 0, over and over
    put(file, position + 8, 0, 8);
  }
  EXPECT_THROW(strings_from(file, {descriptor(1, 64, 5)}), std::runtime_error);
}

// A version 1 object header at `address` with the given messages (type, data), in one chunk.
Bytes v1_header(uint64_t address, const std::vector<std::pair<uint16_t, Bytes>>& messages) {
  Bytes bytes(address, 0);
  size_t body = 0;
  for (const auto& [type, data] : messages) body += 8 + (data.size() + 7) / 8 * 8;
  bytes.resize(address + 16 + body, 0);
  bytes[address] = 1;
  put(bytes, address + 2, messages.size(), 2);
  put(bytes, address + 8, body, 4);
  size_t position = address + 16;
  for (const auto& [type, data] : messages) {
    put(bytes, position, type, 2);
    put(bytes, position + 2, (data.size() + 7) / 8 * 8, 2);
    std::memcpy(bytes.data() + position + 8, data.data(), data.size());
    position += 8 + (data.size() + 7) / 8 * 8;
  }
  return bytes;
}

TEST(Hdf5Format, ObjectHeaderMessagesAndContinuationCycles) {
  const Bytes file = v1_header(40, {{kDatatypeMessage, Bytes{0x10, 0, 0, 0, 4, 0, 0, 0, 0, 0, 32, 0}}});
  const File header(write_bytes("header.bin", file));
  const std::vector<Message> messages = read_object_header(header, kFormat, 40);
  ASSERT_EQ(messages.size(), 1u);
  const Datatype type = decode_datatype(messages[0].data, kFormat);
  EXPECT_TRUE(type.plain_integer());
  EXPECT_EQ(type.size, 4u);

  // A continuation pointing back at the chunk it is in: a cycle, not a loop.
  Bytes continuation;
  put(continuation, 0, 40 + 16, 8);
  put(continuation, 8, 16, 8);
  const File cyclic(write_bytes("cycle.bin", v1_header(40, {{kContinuationMessage, continuation}})));
  EXPECT_THROW(read_object_header(cyclic, kFormat, 40), std::runtime_error);
  // A message claiming more bytes than its chunk, and a chunk past the end of the file.
  Bytes overlong = file;
  put(overlong, 40 + 16 + 2, 0xfff0, 2);
  EXPECT_THROW(read_object_header(File(write_bytes("long.bin", overlong)), kFormat, 40), std::runtime_error);
  Bytes huge_chunk = file;
  put(huge_chunk, 40 + 8, 0xfffffff0, 4);
  EXPECT_THROW(read_object_header(File(write_bytes("huge.bin", huge_chunk)), kFormat, 40), std::runtime_error);
  EXPECT_THROW(read_object_header(header, kFormat, 1 << 20), std::runtime_error);
}

TEST(Hdf5Format, TruncatedOrInconsistentMessagesAreErrors) {
  const Bytes int32{0x10, 0x08, 0, 0, 4, 0, 0, 0, 0, 0, 32, 0};
  EXPECT_EQ(decode_datatype(int32, kFormat).is_signed, true);
  for (size_t cut = 0; cut < int32.size(); ++cut) {
    EXPECT_THROW(decode_datatype(Bytes(int32.begin(), int32.begin() + cut), kFormat), std::runtime_error) << cut;
  }
  Bytes wide = int32;
  wide[10] = 200;  // 200 significant bits in 4 bytes
  EXPECT_THROW(decode_datatype(wide, kFormat), std::runtime_error);
  Bytes empty = int32;
  put(empty, 4, 0, 4);  // a 0-byte type
  EXPECT_THROW(decode_datatype(empty, kFormat), std::runtime_error);
  // A dataspace of rank 40, one whose element count overflows, one above its maximum.
  Bytes space{2, 40, 0, 1};
  EXPECT_THROW(decode_dataspace(space, kFormat), std::runtime_error);
  Bytes overflow{2, 2, 0, 1};
  put(overflow, 4, uint64_t{1} << 40, 8);
  put(overflow, 12, uint64_t{1} << 40, 8);
  EXPECT_THROW(decode_dataspace(overflow, kFormat).elements(), std::runtime_error);
  Bytes above{2, 1, 1, 1};
  put(above, 4, 10, 8);
  put(above, 12, 5, 8);
  EXPECT_THROW(decode_dataspace(above, kFormat), std::runtime_error);
  // A filter pipeline with no filters (HDF5 1.10 fails with "memory allocation failed").
  EXPECT_THROW(decode_filter_pipeline(Bytes{2, 0}), std::runtime_error);
  // An attribute whose data is shorter than its dataspace says.
  Bytes attribute{3, 0};
  put(attribute, 2, 2, 2);  // name "a" + NUL
  put(attribute, 4, int32.size(), 2);
  put(attribute, 6, 12, 2);
  attribute.push_back(0);  // name encoding
  attribute.push_back('a');
  attribute.push_back(0);
  attribute.insert(attribute.end(), int32.begin(), int32.end());
  Bytes dims{2, 1, 0, 1};
  put(dims, 4, 1000, 8);
  attribute.insert(attribute.end(), dims.begin(), dims.end());
  attribute.insert(attribute.end(), 16, 0);  // 4 of the 1000 elements
  EXPECT_THROW(decode_attribute(attribute, kFormat), std::runtime_error);
}

// ---- against files written by libhdf5

class LibraryFile : public testing::Test {
 protected:
  void SetUp() override {
    path_ = temp_path("library.h5");
    auto lock = hdf5_lock();
    Hid file(H5Fcreate(path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    const hsize_t dims[1] = {kRows};
    Hid space(H5Screate_simple(1, dims, nullptr), H5Sclose);
    // Scale-offset int32, chunks of 16 (the last one partial), fill value -7 defined.
    Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    const hsize_t chunk[1] = {16};
    H5Pset_chunk(dcpl.get(), 1, chunk);
    const int32_t fill = -7;
    H5Pset_fill_value(dcpl.get(), H5T_NATIVE_INT32, &fill);
    H5Pset_scaleoffset(dcpl.get(), H5Z_SO_INT, H5Z_SO_INT_MINBITS_DEFAULT);
    Hid packed(H5Dcreate2(file.get(), "packed", H5T_STD_I32BE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
               H5Dclose);
    for (int64_t i = 0; i < kRows; ++i) values_.push_back(static_cast<int32_t>(i % 7 == 3 ? -7 : 1000 - 37 * i));
    H5Dwrite(packed.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, values_.data());
    // Variable-length strings with an attribute of each kind beside them.
    Hid string_type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(string_type.get(), H5T_VARIABLE);
    H5Tset_cset(string_type.get(), H5T_CSET_UTF8);
    Hid names(H5Dcreate2(file.get(), "names", string_type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
              H5Dclose);
    std::vector<std::string> text;
    std::vector<const char*> pointers;
    for (int64_t i = 0; i < kRows; ++i) text.push_back(i == 5 ? "" : "name-\xc3\xa9-" + std::to_string(i));
    for (const std::string& value : text) pointers.push_back(value.c_str());
    H5Dwrite(names.get(), string_type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, pointers.data());
    Hid scalar(H5Screate(H5S_SCALAR), H5Sclose);
    Hid attribute(H5Acreate2(names.get(), "encoding-type", string_type.get(), scalar.get(), H5P_DEFAULT, H5P_DEFAULT),
                  H5Aclose);
    const char* encoding = "string-array";
    H5Awrite(attribute.get(), string_type.get(), &encoding);
    strings_ = text;
  }

  static constexpr int64_t kRows = 40;
  std::string path_;
  std::vector<int32_t> values_;
  std::vector<std::string> strings_;
};

TEST_F(LibraryFile, ScaleOffsetChunksDecodeNativelyLikeHdf5) {
  const auto array = open_hdf5_array(path_, "/packed");
  core::ThreadPool pool(2);
  const std::vector<uint8_t> bytes = array->read_range(0, kRows, pool);
  std::vector<int32_t> read(kRows);
  std::memcpy(read.data(), bytes.data(), bytes.size());
  EXPECT_EQ(read, values_);
}

TEST_F(LibraryFile, CorruptScaleOffsetChunksAreReadErrors) {
  hsize_t offset[1] = {0};
  haddr_t address = 0;
  hsize_t size = 0;
  {
    auto lock = hdf5_lock();
    Hid file = open_hdf5_file(path_);
    Hid dataset(H5Dopen2(file.get(), "packed", H5P_DEFAULT), H5Dclose);
    unsigned mask = 0;
    ASSERT_GE(H5Dget_chunk_info_by_coord(dataset.get(), offset, &mask, &address, &size), 0);
  }
  std::ifstream in(path_, std::ios::binary);
  Bytes file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  core::ThreadPool pool(1);
  Bytes too_many_bits = file;
  put(too_many_bits, address, 33, 4);  // minbits above the element's 32 bits
  EXPECT_THROW(open_hdf5_array(write_bytes("minbits.h5", too_many_bits), "/packed")->read_range(0, kRows, pool),
               core::ReadError);
  Bytes all_bits = file;
  put(all_bits, address, 32, 4);  // "stored as is": needs 64 bytes the chunk does not hold
  EXPECT_THROW(open_hdf5_array(write_bytes("allbits.h5", all_bits), "/packed")->read_range(0, kRows, pool),
               core::ReadError);
}

TEST_F(LibraryFile, NativeStringsAndAttributesMatchTheLibrary) {
  const Hdf5NativeFile native = open_hdf5_native(path_);
  auto lock = hdf5_lock();
  Hid file = open_hdf5_file(path_);
  const Hdf5DatasetHeader header =
      read_hdf5_dataset_header(native, hdf5_object_address(file.get(), "/names", "names"), "names");
  ASSERT_EQ(header.type.type_class, Datatype::kVariableLength);
  ASSERT_TRUE(header.type.variable_string);
  const Bytes elements = read_hdf5_elements(file.get(), native, "/names", header, "names");
  EXPECT_EQ(read_variable_strings(*native.file, native.format, elements.data(), kRows), strings_);
  const std::vector<Message> messages =
      read_object_header(*native.file, native.format, hdf5_object_address(file.get(), "/names", "names"));
  bool found = false;
  for (const Message& message : messages) {
    if (message.type != kAttributeMessage) continue;
    const Attribute attribute = decode_attribute(message.data, native.format);
    EXPECT_EQ(attribute.name, "encoding-type");
    EXPECT_EQ(attribute.space.kind, Dataspace::kScalar);
    EXPECT_EQ(read_variable_strings(*native.file, native.format, attribute.data.data(), 1),
              std::vector<std::string>{"string-array"});
    found = true;
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace torch_shards::io::hdf5
