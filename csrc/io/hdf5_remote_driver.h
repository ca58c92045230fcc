// HDF5 files behind URLs: a virtual file driver through which the HDF5
// library reads an object's bytes with ranged requests (File, storage/), so
// that groups, attributes and the datasets HDF5 itself reads work as they do
// for local files. Its reads are metadata, small and repeated (each HDF5 call
// opens the file anew): they go through pages kept per process
// (File::Access::kMetadata, storage/remote_pages.h), so a dataset's open costs
// a few round trips. Chunk and contiguous data are read by torch_shards' own
// readers, not through here.
#pragma once

#include <hdf5.h>

#include <string>

namespace torch_shards::io {

// The file access property list for `path`: H5P_DEFAULT for a local file,
// one selecting the URL driver for a URL (closed by the caller with H5Pclose
// unless H5P_DEFAULT). Hold hdf5_lock().
hid_t hdf5_file_access(const std::string& path);

}  // namespace torch_shards::io
