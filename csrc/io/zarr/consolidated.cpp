#include "io/zarr/consolidated.h"

#include <map>
#include <optional>
#include <vector>

#include "core/errors.h"
#include "io/file.h"
#include "io/storage/remote_paths.h"
#include "io/storage/storage_options.h"
#include "io/storage/url.h"
#include "io/zarr/json.h"

namespace torch_shards::io::zarr {

using core::concat;

namespace {

using Files = std::map<std::string, std::vector<uint8_t>>;

// Arrays whose metadata files are stamped together as their store opens, at most (each array opened
// later stamps its metadata file: a store rewritten while read is refused); a store with more (an
// AnnData uns of thousands) has each stamped as it is opened.
constexpr size_t kStampedTogether = 256;

struct Consolidated {
  Files files;
  std::vector<std::string> arrays;  // the arrays' metadata files, relative to the root
};

std::vector<uint8_t> bytes_of(const json& value) {
  const std::string text = dump_json(value);
  return std::vector<uint8_t>(text.begin(), text.end());
}

[[noreturn]] void malformed(const std::string& file, const std::string& why) {
  throw core::MetadataError(concat(file, ": consolidated metadata ", why,
                                   " (storage option consolidated=False reads each node's own metadata)"));
}

json parsed(const std::string& file, const std::vector<uint8_t>& bytes) {
  try {
    return parse_json(std::string(bytes.begin(), bytes.end()));
  } catch (const json::exception& error) {
    malformed(file, concat("is not JSON: ", printable(error.what())));
  }
}

// A node's path in consolidated metadata, relative to the store's root: no empty, "." or ".." part.
bool well_formed(const std::string& path) {
  if (path.empty() || path.front() == '/' || path.back() == '/') return false;
  for (size_t begin = 0; begin <= path.size();) {
    size_t end = path.find('/', begin);
    if (end == std::string::npos) end = path.size();
    const std::string part = path.substr(begin, end - begin);
    if (part.empty() || part == "." || part == "..") return false;
    begin = end + 1;
  }
  return true;
}

// zarr v3: a group's consolidated_metadata {"kind": "inline", "metadata": {path: node's zarr.json}}, its
// nodes' paths relative to the group at `prefix` ("" for the root, else "a/b/"); false when it has none.
// zarr-python writes every node below the root there, each group's own left empty; one a writer nested in
// a group's entry is taken too.
bool add_v3_nodes(const std::string& file, const json& group, const std::string& prefix, Consolidated& out) {
  const auto found = group.find("consolidated_metadata");
  if (found == group.end() || found->is_null()) return false;
  if (!found->is_object()) malformed(file, "is not a JSON object");
  const auto kind = found->find("kind");
  if (kind != found->end() && *kind != "inline") malformed(file, concat("of kind ", kind->dump(), " (not inline)"));
  const auto metadata = found->find("metadata");
  if (metadata == found->end() || !metadata->is_object()) malformed(file, "has no metadata object");
  for (const auto& [name, node] : metadata->items()) {
    const std::string path = prefix + name;
    if (!well_formed(name)) malformed(file, concat("names a node ", json(path).dump()));
    if (!node.is_object()) malformed(file, concat("of ", path, " is not a JSON object"));
    out.files[path + "/zarr.json"] = bytes_of(node);
    const auto type = node.find("node_type");
    if (type != node.end() && *type == "array") out.arrays.push_back(path + "/zarr.json");
    if (type != node.end() && *type == "group") add_v3_nodes(file, node, path + "/", out);
  }
  return true;
}

// zarr v2: .zmetadata {"zarr_consolidated_format": 1, "metadata": {"path/.zarray": {...}, ".zgroup": ...}}.
Consolidated v2_files(const std::string& file, const json& root) {
  const auto format = root.find("zarr_consolidated_format");
  if (format != root.end() && *format != 1) malformed(file, concat("of format ", format->dump(), " (not 1)"));
  const auto metadata = root.find("metadata");
  if (metadata == root.end() || !metadata->is_object()) malformed(file, "has no metadata object");
  Consolidated out;
  for (const auto& [key, value] : metadata->items()) {
    const size_t slash = key.rfind('/');
    const std::string name = slash == std::string::npos ? key : key.substr(slash + 1);
    if (name != ".zarray" && name != ".zgroup" && name != ".zattrs") continue;  // (other keys: not metadata)
    if (slash != std::string::npos && !well_formed(key.substr(0, slash))) {
      malformed(file, concat("names a node ", json(key).dump()));
    }
    if (!value.is_object()) malformed(file, concat("of ", key, " is not a JSON object"));
    out.files[key] = bytes_of(value);
    if (name == ".zarray") out.arrays.push_back(key);
  }
  return out;
}

}  // namespace

void learn_consolidated_metadata(const std::string& store) {
  if (!storage::is_url(store) || !storage::storage_options_for(store).consolidated) return;
  if (storage::consolidated_metadata_learnt(store)) return;  // (a probe, then the opening of its root group)
  const std::string root_file = store + "/zarr.json";
  std::optional<Consolidated> consolidated;
  if (const std::optional<std::vector<uint8_t>> root = read_whole_file_if_exists(root_file)) {
    json value;
    try {
      value = parse_json(std::string(root->begin(), root->end()));
    } catch (const json::exception&) {
      return;  // not a node: opening it says why
    }
    if (!value.is_object()) return;
    consolidated.emplace();
    if (!add_v3_nodes(root_file, value, "", *consolidated)) return;
  } else {
    const std::string file = store + "/.zmetadata";
    const std::optional<std::vector<uint8_t>> read = read_whole_file_if_exists(file);
    if (!read) return;
    const json value = parsed(file, *read);
    if (!value.is_object()) malformed(file, "is not a JSON object");
    consolidated = v2_files(file, value);
  }
  if (!consolidated) return;
  storage::learn_consolidated_metadata(store, std::move(consolidated->files));
  if (consolidated->arrays.size() <= kStampedTogether) {
    std::vector<std::string> urls;
    for (const std::string& path : consolidated->arrays) urls.push_back(store + "/" + path);
    storage::stat_remote_together(urls);
  }
}

}  // namespace torch_shards::io::zarr
