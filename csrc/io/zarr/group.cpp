#include "io/zarr/group.h"

#include <algorithm>

#include "core/errors.h"
#include "io/file.h"
#include "io/zarr/array.h"
#include "io/zarr/consolidated.h"

namespace torch_shards::io {

using core::concat;
using core::ReadError;

namespace {

class ZarrGroup : public Group {
 public:
  ZarrGroup(std::string store, std::string path) : store_(std::move(store)), path_(std::move(path)) {}

  std::string file() const override { return store_; }
  std::string path() const override { return path_; }

  std::vector<std::string> children() const override {
    std::vector<std::string> names;
    std::vector<std::pair<std::string, bool>> entries;
    try {
      entries = list_directory(directory());
    } catch (const ReadError& error) {
      throw ReadError(concat(where(), ": cannot list the group: ", error.what()));
    }
    for (const auto& [name, is_dir] : entries) {
      if (name.empty() || name[0] == '.' || !is_dir) continue;  // .zarray, .zattrs ... and hidden directories
      const std::string dir = directory() + "/" + name;
      if (is_zarr_array(dir) || is_zarr_group(dir)) names.push_back(name);
    }
    return names;
  }

  bool has_group(const std::string& name) const override { return is_zarr_group(child_directory(name)); }
  bool has_array(const std::string& name) const override { return is_zarr_array(child_directory(name)); }
  bool has_string_array(const std::string& name) const override {
    return has_array(name) && is_zarr_string_array(store_, child_path(name));
  }

  std::shared_ptr<const Group> group(const std::string& name) const override {
    if (!has_group(name)) throw ReadError(concat(store_, ":", child_path(name), ": no such group"));
    return std::make_shared<ZarrGroup>(store_, normalize_zarr_path(child_path(name)));
  }

  std::shared_ptr<const Array> array(const std::string& name) const override {
    require_array(name);
    return open_zarr_array(store_, child_path(name));
  }

  nlohmann::json attributes() const override { return read_zarr_attributes(store_, path_); }

  nlohmann::json array_attributes(const std::string& name) const override {
    require_array(name);
    return read_zarr_attributes(store_, child_path(name));
  }

  std::vector<std::string> read_strings(const std::string& name) const override {
    require_array(name);
    return read_zarr_strings(store_, child_path(name));
  }

  int64_t string_array_length(const std::string& name) const override {
    require_array(name);
    return zarr_string_array_length(store_, child_path(name));
  }

 private:
  std::string directory() const { return path_ == "/" ? store_ : store_ + path_; }

  std::string child_directory(const std::string& name) const {
    // Names may reach deeper ("obs/cell_type"); "." and ".." parts are refused.
    core::check_argument(!name.empty() && normalize_zarr_path(name) != "/", where(), ": invalid child name '", name,
                         "'");
    return directory() + normalize_zarr_path(name);
  }

  void require_array(const std::string& name) const {
    if (!has_array(name)) throw ReadError(concat(store_, ":", child_path(name), ": no such array"));
  }

  std::string store_;
  std::string path_;
};

}  // namespace

std::shared_ptr<const Group> open_zarr_group(const std::string& store, const std::string& path) {
  const std::string normalized = normalize_zarr_path(path);
  const std::string dir = normalized == "/" ? store : store + normalized;
  if (normalized == "/") {
    list_store(store);  // behind URLs: what opening it asks for, learnt at once
    zarr::learn_consolidated_metadata(store);
  }
  if (!is_zarr_group(dir)) {
    throw ReadError(concat(store, ":", normalized, ": not a zarr group (no .zgroup, or zarr.json of a group)"));
  }
  return std::make_shared<ZarrGroup>(store, normalized);
}

}  // namespace torch_shards::io
