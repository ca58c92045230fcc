#include "hdf5_group.h"

#include <algorithm>

#include "../core/errors.h"
#include "file.h"
#include "hdf5_array.h"
#include "hdf5_library.h"

namespace torch_shards::io {

using core::concat;
using core::ReadError;
using nlohmann::json;

namespace {

H5O_type_t object_type(hid_t file, const std::string& path) {
  if (!hdf5_path_exists(file, path)) return H5O_TYPE_UNKNOWN;
  H5O_info_t info;
  if (H5Oget_info_by_name2(file, path.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0) {
    H5Eclear2(H5E_DEFAULT);
    return H5O_TYPE_UNKNOWN;
  }
  return info.type;
}

void reclaim_strings(hid_t memory_type, hid_t space, void* buffer) {
#if H5_VERSION_GE(1, 12, 0)
  H5Treclaim(memory_type, space, H5P_DEFAULT, buffer);
#else
  H5Dvlen_reclaim(memory_type, space, H5P_DEFAULT, buffer);
#endif
}

// Reads the string values of a dataset or attribute (fixed or variable length).
template <typename ReadFunction>
std::vector<std::string> read_string_values(hid_t type, hid_t space, const ReadFunction& read,
                                            const std::string& where) {
  const hssize_t count = H5Sget_simple_extent_npoints(space);
  std::vector<std::string> values;
  if (count <= 0) return values;
  if (H5Tis_variable_str(type) > 0) {
    Hid memory_type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(memory_type.get(), H5T_VARIABLE);
    H5Tset_cset(memory_type.get(), H5Tget_cset(type));
    std::vector<char*> pointers(static_cast<size_t>(count), nullptr);
    if (read(memory_type.get(), pointers.data()) < 0) {
      throw ReadError(concat(where, ": cannot read strings: ", hdf5_error_detail()));
    }
    for (char* pointer : pointers) values.emplace_back(pointer == nullptr ? "" : pointer);
    reclaim_strings(memory_type.get(), space, pointers.data());
    return values;
  }
  const size_t size = H5Tget_size(type);
  std::vector<char> buffer(static_cast<size_t>(count) * size);
  if (read(type, buffer.data()) < 0) throw ReadError(concat(where, ": cannot read strings: ", hdf5_error_detail()));
  for (hssize_t i = 0; i < count; ++i) {
    std::string value(buffer.data() + i * size, size);
    value.erase(std::find(value.begin(), value.end(), '\0'), value.end());
    if (H5Tget_strpad(type) == H5T_STR_SPACEPAD) value.erase(value.find_last_not_of(' ') + 1);
    values.push_back(std::move(value));
  }
  return values;
}

json attribute_value(hid_t attribute, const std::string& where) {
  Hid type(H5Aget_type(attribute), H5Tclose);
  Hid space(H5Aget_space(attribute), H5Sclose);
  const bool scalar = H5Sget_simple_extent_ndims(space.get()) == 0;
  const hssize_t count = H5Sget_simple_extent_npoints(space.get());
  const H5T_class_t type_class = H5Tget_class(type.get());
  json values = json::array();
  if (type_class == H5T_STRING) {
    const auto read = [&](hid_t memory_type, void* buffer) { return H5Aread(attribute, memory_type, buffer); };
    for (auto& value : read_string_values(type.get(), space.get(), read, where)) values.push_back(value);
  } else if (type_class == H5T_INTEGER || type_class == H5T_ENUM) {
    std::vector<int64_t> numbers(static_cast<size_t>(std::max<hssize_t>(count, 0)));
    if (count > 0 && H5Aread(attribute, H5T_NATIVE_INT64, numbers.data()) < 0) {
      H5Eclear2(H5E_DEFAULT);
      return nullptr;
    }
    const bool boolean = type_class == H5T_ENUM;
    for (int64_t number : numbers) boolean ? values.push_back(number != 0) : values.push_back(number);
  } else if (type_class == H5T_FLOAT) {
    std::vector<double> numbers(static_cast<size_t>(std::max<hssize_t>(count, 0)));
    if (count > 0 && H5Aread(attribute, H5T_NATIVE_DOUBLE, numbers.data()) < 0) {
      H5Eclear2(H5E_DEFAULT);
      return nullptr;
    }
    for (double number : numbers) values.push_back(number);
  } else {
    return nullptr;  // references, compounds...: not needed by any layout we read
  }
  if (scalar) return values.empty() ? json(nullptr) : values[0];
  return values;
}

herr_t collect_attribute(hid_t location, const char* name, const H5A_info_t*, void* data) {
  auto* context = static_cast<std::pair<json*, const std::string*>*>(data);
  Hid attribute(H5Aopen(location, name, H5P_DEFAULT), H5Aclose);
  if (attribute.valid()) (*context->first)[name] = attribute_value(attribute.get(), *context->second + "@" + name);
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
    return names;
  }

  bool has_group(const std::string& name) const override { return child_type(name) == H5O_TYPE_GROUP; }
  bool has_array(const std::string& name) const override { return child_type(name) == H5O_TYPE_DATASET; }

  bool has_string_array(const std::string& name) const override {
    const std::string path = child_path(name);
    auto lock = hdf5_lock();
    Hid file = open_hdf5_file(file_);
    if (object_type(file.get(), path) != H5O_TYPE_DATASET) return false;
    Hid dataset(H5Dopen2(file.get(), path.c_str(), H5P_DEFAULT), H5Dclose);
    if (!dataset.valid()) throw ReadError(concat(file_, ":", path, ": cannot open dataset: ", hdf5_error_detail()));
    Hid type(H5Dget_type(dataset.get()), H5Tclose);
    return H5Tget_class(type.get()) == H5T_STRING;
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

  std::vector<std::string> read_strings(const std::string& name) const override {
    const std::string path = child_path(name);
    const std::string where = file_ + ":" + path;
    auto lock = hdf5_lock();
    Hid file = open_hdf5_file(file_);
    if (object_type(file.get(), path) != H5O_TYPE_DATASET) throw ReadError(concat(where, ": no such dataset"));
    Hid dataset(H5Dopen2(file.get(), path.c_str(), H5P_DEFAULT), H5Dclose);
    Hid type(H5Dget_type(dataset.get()), H5Tclose);
    if (H5Tget_class(type.get()) != H5T_STRING) throw ReadError(concat(where, ": is not an array of strings"));
    Hid space(H5Dget_space(dataset.get()), H5Sclose);
    const auto read = [&](hid_t memory_type, void* buffer) {
      return H5Dread(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer);
    };
    return read_string_values(type.get(), space.get(), read, where);
  }

 private:
  H5O_type_t child_type(const std::string& name) const {
    auto lock = hdf5_lock();
    Hid file = open_hdf5_file(file_);
    return object_type(file.get(), child_path(name));
  }

  json attributes_of(const std::string& path) const {
    const std::string where = file_ + ":" + path;
    auto lock = hdf5_lock();
    Hid file = open_hdf5_file(file_);
    if (object_type(file.get(), path) == H5O_TYPE_UNKNOWN) throw ReadError(concat(where, ": no such object"));
    Hid object(H5Oopen(file.get(), path.c_str(), H5P_DEFAULT), H5Oclose);
    json attributes = json::object();
    std::pair<json*, const std::string*> context{&attributes, &where};
    hsize_t index = 0;
    H5Aiterate2(object.get(), H5_INDEX_NAME, H5_ITER_INC, &index, collect_attribute, &context);
    return attributes;
  }

  std::string file_;
  std::string path_;
};

}  // namespace

bool is_hdf5_file(const std::string& path) {
  if (!file_exists(path) || is_directory(path)) return false;
  auto lock = hdf5_lock();
  const htri_t result = H5Fis_hdf5(path.c_str());
  H5Eclear2(H5E_DEFAULT);
  return result > 0;
}

std::shared_ptr<const Group> open_hdf5_group(const std::string& file, const std::string& path) {
  auto lock = hdf5_lock();
  Hid file_id = open_hdf5_file(file);
  if (object_type(file_id.get(), path) != H5O_TYPE_GROUP) throw ReadError(concat(file, ":", path, ": no such group"));
  return std::make_shared<Hdf5Group>(file, path);
}

}  // namespace torch_shards::io
