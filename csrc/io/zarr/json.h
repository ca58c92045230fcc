// The JSON of zarr metadata files: parsing (with the bare NaN / Infinity
// Python's json module writes), reading a node's metadata files, and the
// checks that turn malformed metadata into ReadErrors naming the array.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "io/text.h"

namespace torch_shards::io::zarr {

using json = nlohmann::json;

// The directory of the node at `path` (normalized) in the store.
std::string node_directory(const std::string& store, const std::string& path);

// "(1, 2)", "(3,)": chunk coordinates as Python writes a tuple.
std::string format_coords(const std::vector<int64_t>& coords);

json parse_json(const std::string& text);
// `value` as text that parse_json gives back as it is, NaN and infinities included (which JSON cannot
// hold: the text holds markers for them).
std::string dump_json(json value);

// The JSON object in dir/name, or nullopt if there is no such file.
std::optional<json> read_json_file(const std::string& dir, const std::string& name, const std::string& where);

// The node_type of dir/zarr.json, or "" if there is none (or it is unreadable).
std::string node_type_of(const std::string& dir);
// Whether dir/name (a .zarray or .zgroup) exists; behind a URL, read whole (no HEAD, no listing).
bool has_metadata_file(const std::string& dir, const std::string& name);

// Helpers that turn malformed metadata into ReadErrors naming the array.
class MetadataReader {
 public:
  MetadataReader(std::string where, std::string file) : where_(std::move(where)), file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& message) const {
    throw core::ReadError(core::concat(where_, ": ", file_, ": ", message));
  }
  const std::string& where() const { return where_; }

  const json& member(const json& object, const char* key) const {
    if (!object.is_object() || !object.contains(key)) fail(core::concat("missing \"", key, "\""));
    return object[key];
  }
  std::string string(const json& value, const char* what) const {
    if (!value.is_string()) fail(core::concat("\"", what, "\" is not a string: ", json_text(value)));
    return value.get<std::string>();
  }
  int64_t integer(const json& value, const char* what) const {
    if (!value.is_number_integer()) fail(core::concat("\"", what, "\" is not an integer: ", json_text(value)));
    if (value.is_number_unsigned() &&
        value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail(core::concat("\"", what, "\" is ", value.get<uint64_t>(), ", above 2^63 - 1"));
    }
    return value.get<int64_t>();
  }
  std::vector<int64_t> shape(const json& value, const char* what, int64_t minimum) const {
    if (!value.is_array()) fail(core::concat("\"", what, "\" is not a list: ", json_text(value)));
    std::vector<int64_t> shape;
    for (const json& item : value) {
      shape.push_back(integer(item, what));
      if (shape.back() < minimum)
        fail(core::concat("\"", what, "\" has an entry below ", minimum, ": ", json_text(value)));
    }
    return shape;
  }

 private:
  std::string where_;
  std::string file_;
};

}  // namespace torch_shards::io::zarr
