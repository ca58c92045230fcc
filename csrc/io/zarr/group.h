// zarr groups (v2 .zgroup, v3 zarr.json) as io::Group: children, attributes
// and string arrays, so AnnData zarr stores read like .h5ad files.
#pragma once

#include <memory>
#include <string>

#include "io/group.h"

namespace torch_shards::io {

// The group at `path` ("/" for the store's root) of the zarr store directory
// `store`. Throws ReadError naming the store and the path if it is not a group.
std::shared_ptr<const Group> open_zarr_group(const std::string& store, const std::string& path = "/");

}  // namespace torch_shards::io
