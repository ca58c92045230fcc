// HDF5 datasets as Arrays, read without HDF5's global lock where the layout
// allows:
// - contiguous datasets: pread at the dataset's file offset;
// - chunked datasets whose filters are shuffle, deflate, blosc (32001) or
//   zstd (32015): chunk addresses are tabulated once at open, then chunks are
//   pread and decoded on the thread pool;
// - anything else (other filters, compact or virtual layouts, external
//   storage): HDF5's own read path, serialised under the library lock.
#pragma once

#include <hdf5.h>

#include <memory>
#include <string>

#include "array.h"

namespace torch_shards::io {

// Opens dataset `path` of HDF5 file `file`; throws ReadError naming both.
std::shared_ptr<const Array> open_hdf5_array(const std::string& file, const std::string& path);
// The same with the file already open (the caller holds hdf5_lock()).
std::shared_ptr<const Array> open_hdf5_array(hid_t file_id, const std::string& file, const std::string& path);

}  // namespace torch_shards::io
