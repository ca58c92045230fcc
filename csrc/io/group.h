// A group of named arrays and subgroups with attributes: an HDF5 group or a
// zarr (v2 or v3) group. AnnData's layout is read through this interface, so
// .h5ad files and AnnData zarr stores share one reader.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/array.h"

namespace torch_shards::io {

class Group {
 public:
  virtual ~Group() = default;
  virtual std::string file() const = 0;  // the file or store
  virtual std::string path() const = 0;  // "/" or "/obs" ...
  std::string where() const { return file() + ":" + path(); }
  std::string child_path(const std::string& name) const { return path() == "/" ? "/" + name : path() + "/" + name; }

  // Names of the arrays and groups directly inside, sorted.
  virtual std::vector<std::string> children() const = 0;
  virtual bool has_group(const std::string& name) const = 0;
  virtual bool has_array(const std::string& name) const = 0;
  // An array of strings (any string type), which array() cannot open.
  virtual bool has_string_array(const std::string& name) const = 0;
  // Throw ReadError naming the file and the missing path.
  virtual std::shared_ptr<const Group> group(const std::string& name) const = 0;
  virtual std::shared_ptr<const Array> array(const std::string& name) const = 0;

  // Attributes as a JSON object: strings, numbers, booleans and 1-D arrays of
  // them (HDF5 attributes are converted; zarr attributes are JSON already).
  virtual nlohmann::json attributes() const = 0;
  virtual nlohmann::json array_attributes(const std::string& name) const = 0;

  // A 1-D array of strings (fixed or variable length; HDF5 or zarr encodings).
  virtual std::vector<std::string> read_strings(const std::string& name) const = 0;
  // How many strings read_strings would return, from the array's metadata only (a dataframe's length
  // at open, without reading its millions of names).
  virtual int64_t string_array_length(const std::string& name) const = 0;
};

}  // namespace torch_shards::io
