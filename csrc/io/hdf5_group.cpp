#include "io/hdf5_group.h"

#include <algorithm>
#include <cstring>

#include "core/errors.h"
#include "io/file.h"
#include "io/hdf5_array.h"
#include "io/hdf5_format.h"
#include "io/hdf5_library.h"
#include "io/text.h"

namespace torch_shards::io {

using core::concat;
using core::ReadError;
using hdf5::Datatype;
using nlohmann::json;

namespace {

// Strings read from a file become JSON and Python str: they must be UTF-8.
void require_utf8(const std::vector<std::string>& values, const std::string& where) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!is_valid_utf8(values[i])) {
      throw ReadError(concat(where, ": string ", i, " is not valid UTF-8: \"", printable(values[i]), "\""));
    }
  }
}

// The strings of a string datatype's elements (fixed or variable length).
std::vector<std::string> decode_strings(const Hdf5NativeFile& native, const Datatype& type, const uint8_t* data,
                                        size_t count, const std::string& where) {
  std::vector<std::string> values;
  try {
    if (type.type_class == Datatype::kVariableLength && type.variable_string) {
      values = hdf5::read_variable_strings(*native.file, native.format, data, count);
    } else {
      values = hdf5::read_fixed_strings(data, count, type.size, type.padding);
    }
  } catch (const ReadError&) {
    throw;
  } catch (const std::runtime_error& error) {
    throw ReadError(concat(where, ": corrupt strings: ", error.what()));
  }
  require_utf8(values, where);
  return values;
}

bool is_string_type(const Datatype& type) {
  return type.type_class == Datatype::kString || (type.type_class == Datatype::kVariableLength && type.variable_string);
}

// One element of a numeric attribute as JSON, or null for a type torch_shards does not read.
json number_value(const Datatype& type, const uint8_t* element) {
  const Datatype& integer = type.type_class == Datatype::kEnum ? *type.base : type;
  if (integer.type_class == Datatype::kFixedPoint && integer.plain_integer()) {
    uint64_t bits = 0;
    for (size_t i = 0; i < integer.size; ++i) {
      const size_t byte = integer.big_endian ? integer.size - 1 - i : i;
      bits |= static_cast<uint64_t>(element[byte]) << (8 * i);
    }
    if (type.type_class == Datatype::kEnum) return bits != 0;  // h5py's bool enum; other enums are rare in attributes
    if (integer.is_signed && integer.size < 8 && (bits >> (8 * integer.size - 1)) & 1) {
      bits |= ~uint64_t{0} << (8 * integer.size);  // sign-extend
    }
    if (integer.is_signed) return static_cast<int64_t>(bits);
    return bits;
  }
  if (type.type_class == Datatype::kFloat && type.ieee_float() && (type.size == 4 || type.size == 8)) {
    uint8_t bytes[8];
    for (size_t i = 0; i < type.size; ++i) bytes[i] = element[type.big_endian ? type.size - 1 - i : i];
    if (type.size == 4) {
      float value;
      std::memcpy(&value, bytes, 4);
      return static_cast<double>(value);
    }
    double value;
    std::memcpy(&value, bytes, 8);
    return value;
  }
  return nullptr;
}

json attribute_value(const Hdf5NativeFile& native, const hdf5::Attribute& attribute, const std::string& where) {
  const uint64_t count = attribute.space.elements();
  json values = json::array();
  if (is_string_type(attribute.type)) {
    for (auto& value : decode_strings(native, attribute.type, attribute.data.data(), count, where)) {
      values.push_back(std::move(value));
    }
  } else {
    for (uint64_t i = 0; i < count; ++i) {
      json value = number_value(attribute.type, attribute.data.data() + i * attribute.type.size);
      if (value.is_null()) return nullptr;  // references, compounds...: not needed by any layout we read
      values.push_back(std::move(value));
    }
  }
  if (attribute.space.kind == hdf5::Dataspace::kScalar) return values.empty() ? json(nullptr) : values[0];
  if (attribute.space.kind == hdf5::Dataspace::kNull) return nullptr;
  return values;
}

// ---- libhdf5 fallback for attributes in dense storage (fractal heaps),
// which the native decoder does not read.

void reclaim_strings(hid_t memory_type, hid_t space, void* buffer) {
#if H5_VERSION_GE(1, 12, 0)
  H5Treclaim(memory_type, space, H5P_DEFAULT, buffer);
#else
  H5Dvlen_reclaim(memory_type, space, H5P_DEFAULT, buffer);
#endif
}

json library_attribute_value(hid_t attribute, const std::string& where) {
  Hid type(H5Aget_type(attribute), H5Tclose);
  Hid space(H5Aget_space(attribute), H5Sclose);
  const bool scalar = H5Sget_simple_extent_ndims(space.get()) == 0;
  const hssize_t count = H5Sget_simple_extent_npoints(space.get());
  if (count < 0 || count > (1 << 20)) return nullptr;
  const H5T_class_t type_class = H5Tget_class(type.get());
  json values = json::array();
  if (type_class == H5T_STRING) {
    std::vector<std::string> strings;
    if (H5Tis_variable_str(type.get()) > 0) {
      Hid memory_type(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(memory_type.get(), H5T_VARIABLE);
      std::vector<char*> pointers(static_cast<size_t>(count), nullptr);
      if (H5Aread(attribute, memory_type.get(), pointers.data()) < 0) {
        throw ReadError(concat(where, ": cannot read strings: ", hdf5_error_detail()));
      }
      for (char* pointer : pointers) strings.emplace_back(pointer == nullptr ? "" : pointer);
      reclaim_strings(memory_type.get(), space.get(), pointers.data());
    } else {
      const size_t size = H5Tget_size(type.get());
      if (size == 0 || size > (1 << 20)) return nullptr;
      std::vector<uint8_t> buffer(static_cast<size_t>(count) * size);
      if (H5Aread(attribute, type.get(), buffer.data()) < 0) {
        throw ReadError(concat(where, ": cannot read strings: ", hdf5_error_detail()));
      }
      strings = hdf5::read_fixed_strings(buffer.data(), static_cast<size_t>(count), size,
                                         H5Tget_strpad(type.get()) == H5T_STR_SPACEPAD ? 2 : 0);
    }
    require_utf8(strings, where);
    for (auto& value : strings) values.push_back(std::move(value));
  } else if (type_class == H5T_INTEGER || type_class == H5T_ENUM) {
    std::vector<int64_t> numbers(static_cast<size_t>(count));
    if (count > 0 && H5Aread(attribute, H5T_NATIVE_INT64, numbers.data()) < 0) {
      H5Eclear2(H5E_DEFAULT);
      return nullptr;
    }
    const bool boolean = type_class == H5T_ENUM;
    for (int64_t number : numbers) boolean ? values.push_back(number != 0) : values.push_back(number);
  } else if (type_class == H5T_FLOAT) {
    std::vector<double> numbers(static_cast<size_t>(count));
    if (count > 0 && H5Aread(attribute, H5T_NATIVE_DOUBLE, numbers.data()) < 0) {
      H5Eclear2(H5E_DEFAULT);
      return nullptr;
    }
    for (double number : numbers) values.push_back(number);
  } else {
    return nullptr;
  }
  if (scalar) return values.empty() ? json(nullptr) : values[0];
  return values;
}

herr_t collect_attribute(hid_t location, const char* name, const H5A_info_t*, void* data) {
  auto* context = static_cast<std::pair<json*, const std::string*>*>(data);
  Hid attribute(H5Aopen(location, name, H5P_DEFAULT), H5Aclose);
  if (attribute.valid() && is_valid_utf8(name)) {
    (*context->first)[name] = library_attribute_value(attribute.get(), *context->second + "@" + printable(name));
  }
  return 0;
}

herr_t collect_name(hid_t, const char* name, const H5L_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->push_back(name);
  return 0;
}

class Hdf5Group : public Group {
 public:
  Hdf5Group(std::string file, std::string path) : file_(std::move(file)), path_(std::move(path)) {}

  std::string file() const override { return file_; }
  std::string path() const override { return path_; }

  std::vector<std::string> children() const override {
    auto lock = hdf5_lock();
    Hid file = open_hdf5_file(file_);
    Hid group(H5Gopen2(file.get(), path_.c_str(), H5P_DEFAULT), H5Gclose);
    if (!group.valid()) throw ReadError(concat(where(), ": cannot open group: ", hdf5_error_detail()));
    std::vector<std::string> names;
    H5Literate(group.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_name, &names);
    std::sort(names.begin(), names.end());
    require_utf8(names, where() + " (its member names)");
    return names;
  }

  bool has_group(const std::string& name) const override { return child_type(name) == H5O_TYPE_GROUP; }
  bool has_array(const std::string& name) const override { return child_type(name) == H5O_TYPE_DATASET; }

  // The datatype decoded natively, as read_strings does.
  bool has_string_array(const std::string& name) const override {
    const std::string path = child_path(name);
    const std::string where = file_ + ":" + path;
    auto lock = hdf5_lock();
    Hid file = open_hdf5_file(file_);
    if (hdf5_object_type(file.get(), path) != H5O_TYPE_DATASET) return false;
    const Hdf5DatasetHeader header =
        read_hdf5_dataset_header(native_file(), hdf5_object_address(file.get(), path, where), where);
    return is_string_type(header.type);
  }

  std::shared_ptr<const Group> group(const std::string& name) const override {
    if (!has_group(name)) throw ReadError(concat(file_, ":", child_path(name), ": no such group"));
    return std::make_shared<Hdf5Group>(file_, child_path(name));
  }

  std::shared_ptr<const Array> array(const std::string& name) const override {
    auto lock = hdf5_lock();
    Hid file = open_hdf5_file(file_);
    return open_hdf5_array(file.get(), file_, child_path(name));
  }

  json attributes() const override { return attributes_of(path_); }
  json array_attributes(const std::string& name) const override { return attributes_of(child_path(name)); }

  // The string values of a dataset, decoded natively: libhdf5 1.10 follows
  // variable-length string references into the global heap unchecked.
  std::vector<std::string> read_strings(const std::string& name) const override {
    const std::string path = child_path(name);
    const std::string where = file_ + ":" + path;
    auto lock = hdf5_lock();
    Hid file = open_hdf5_file(file_);
    const Hdf5NativeFile native = native_file();
    const Hdf5DatasetHeader header = string_array_header(file.get(), native, path, where);
    const std::vector<uint8_t> elements = read_hdf5_elements(file.get(), native, path, header, where);
    return decode_strings(native, header.type, elements.data(), elements.size() / header.type.size, where);
  }

  int64_t string_array_length(const std::string& name) const override {
    const std::string path = child_path(name);
    const std::string where = file_ + ":" + path;
    auto lock = hdf5_lock();
    Hid file = open_hdf5_file(file_);
    const Hdf5DatasetHeader header = string_array_header(file.get(), native_file(), path, where);
    return header.space.dims.empty() ? 1 : static_cast<int64_t>(header.space.dims[0]);
  }

 private:
  // The header of the 1-D (or scalar) string dataset at `path`; ReadError for anything else. Under hdf5_lock.
  static Hdf5DatasetHeader string_array_header(hid_t file, const Hdf5NativeFile& native, const std::string& path,
                                               const std::string& where) {
    if (hdf5_object_type(file, path) != H5O_TYPE_DATASET) throw ReadError(concat(where, ": no such dataset"));
    Hdf5DatasetHeader header = read_hdf5_dataset_header(native, hdf5_object_address(file, path, where), where);
    if (!is_string_type(header.type)) throw ReadError(concat(where, ": is not an array of strings"));
    if (header.space.dims.size() > 1) {
      throw ReadError(
          concat(where, ": string arrays must be 1-D, this one has ", header.space.dims.size(), " dimensions"));
    }
    return header;
  }

  H5O_type_t child_type(const std::string& name) const {
    auto lock = hdf5_lock();
    Hid file = open_hdf5_file(file_);
    return hdf5_object_type(file.get(), child_path(name));
  }

  // Opened per call (open and fstat; the mapping on first read), like the
  // libhdf5 handle beside it: nothing to lock, nothing to cross a fork.
  Hdf5NativeFile native_file() const { return open_hdf5_native(file_); }

  // Attribute messages decoded natively from the object header; attributes
  // in dense storage (more than 8 on objects of files written with
  // libver >= v18) through libhdf5.
  json attributes_of(const std::string& path) const {
    const std::string where = file_ + ":" + path;
    auto lock = hdf5_lock();
    Hid file = open_hdf5_file(file_);
    if (hdf5_object_type(file.get(), path) == H5O_TYPE_UNKNOWN) throw ReadError(concat(where, ": no such object"));
    const Hdf5NativeFile native = native_file();
    std::vector<hdf5::Message> messages;
    try {
      messages = hdf5::read_object_header(*native.file, native.format, hdf5_object_address(file.get(), path, where));
    } catch (const std::runtime_error& error) {
      throw ReadError(concat(where, ": corrupt object header: ", error.what()));
    }
    json attributes = json::object();
    bool dense = false;
    try {
      dense = hdf5::has_dense_attributes(messages, native.format);
    } catch (const std::runtime_error& error) {
      throw ReadError(concat(where, ": corrupt attribute info: ", error.what()));
    }
    if (dense) {
      Hid object(H5Oopen(file.get(), path.c_str(), H5P_DEFAULT), H5Oclose);
      std::pair<json*, const std::string*> context{&attributes, &where};
      hsize_t index = 0;
      H5Aiterate2(object.get(), H5_INDEX_NAME, H5_ITER_INC, &index, collect_attribute, &context);
    }
    for (const hdf5::Message& message : messages) {
      if (message.type != hdf5::kAttributeMessage) continue;
      hdf5::Attribute attribute;
      try {
        attribute = hdf5::decode_attribute(message.data, native.format);
      } catch (const std::runtime_error& error) {
        throw ReadError(concat(where, ": corrupt attribute: ", error.what()));
      }
      if (!is_valid_utf8(attribute.name)) {
        throw ReadError(
            concat(where, ": an attribute name that is not valid UTF-8: \"", printable(attribute.name), "\""));
      }
      if (attributes.contains(attribute.name)) {
        throw ReadError(concat(where, ": two attributes named '", attribute.name, "'"));
      }
      attributes[attribute.name] = attribute_value(native, attribute, where + "@" + attribute.name);
    }
    return attributes;
  }

  std::string file_;
  std::string path_;
};

}  // namespace

bool is_hdf5_file(const std::string& path) {
  if (!file_exists(path) || is_directory(path)) return false;
  auto lock = hdf5_lock();
  return is_hdf5_signature(path);
}

std::shared_ptr<const Group> open_hdf5_group(const std::string& file, const std::string& path) {
  auto lock = hdf5_lock();
  Hid file_id = open_hdf5_file(file);
  if (hdf5_object_type(file_id.get(), path) != H5O_TYPE_GROUP) {
    throw ReadError(concat(file, ":", path, ": no such group"));
  }
  return std::make_shared<Hdf5Group>(file, path);
}

}  // namespace torch_shards::io
