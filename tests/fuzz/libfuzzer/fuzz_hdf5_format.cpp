// libFuzzer target: the native HDF5 decoders (object headers, datatype,
// dataspace, layout, fill value, filter pipeline and attribute messages,
// global heap strings). Input: the bytes of a "file" (superblock-less: 8-byte
// addresses and lengths); an object header is read at address 0 and every
// message is decoded; the input is also decoded directly as each message
// type, and its first bytes as string descriptors into the file. Only
// std::runtime_error may come out.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "io/file.h"
#include "io/hdf5_format.h"

using namespace torch_shards::io;

namespace {

const std::string& scratch_file() {
  static const std::string path =
      (std::filesystem::temp_directory_path() / ("fuzz_hdf5_" + std::to_string(::getpid()) + ".bin")).string();
  return path;
}

template <typename Decode>
void quietly(Decode decode) {
  try {
    decode();
  } catch (const std::runtime_error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    std::ofstream out(scratch_file(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  const File file(scratch_file());
  const hdf5::FormatInfo format{0, 8, 8};
  const std::vector<uint8_t> bytes(data, data + size);
  quietly([&] {
    for (const hdf5::Message& message : hdf5::read_object_header(file, format, 0)) {
      quietly([&] { hdf5::decode_datatype(message.data, format); });
      quietly([&] { hdf5::decode_dataspace(message.data, format).elements(); });
      quietly([&] { hdf5::decode_layout(message.data, format); });
      quietly([&] { hdf5::decode_fill_value(message); });
      quietly([&] { hdf5::decode_filter_pipeline(message.data); });
      quietly([&] { hdf5::decode_attribute(message.data, format); });
    }
  });
  quietly([&] { hdf5::decode_datatype(bytes, format); });
  quietly([&] { hdf5::decode_dataspace(bytes, format).elements(); });
  quietly([&] { hdf5::decode_layout(bytes, format); });
  quietly([&] { hdf5::decode_filter_pipeline(bytes); });
  quietly([&] { hdf5::decode_attribute(bytes, format); });
  quietly([&] {
    const hdf5::Attribute attribute = hdf5::decode_attribute(bytes, format);
    if (attribute.type.type_class == hdf5::Datatype::kVariableLength) {
      hdf5::read_variable_strings(file, format, attribute.data.data(), attribute.data.size() / attribute.type.size);
    }
  });
  quietly([&] { hdf5::read_variable_strings(file, format, data, size / 16); });
  quietly([&] { hdf5::read_format_info(file); });
  return 0;
}
