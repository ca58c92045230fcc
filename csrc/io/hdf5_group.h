// HDF5 groups as io::Group: children, attributes (as JSON) and string arrays.
#pragma once

#include <memory>
#include <string>

#include "io/group.h"

namespace torch_shards::io {

bool is_hdf5_file(const std::string& path);
// Throws ReadError if the file cannot be opened or path is not a group.
std::shared_ptr<const Group> open_hdf5_group(const std::string& file, const std::string& path = "/");

}  // namespace torch_shards::io
