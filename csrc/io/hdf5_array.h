// HDF5 datasets as Arrays, read without HDF5's global lock where the layout
// allows:
// - contiguous datasets: pread at the dataset's file offset;
// - chunked datasets whose filters are shuffle, deflate, lzf (32000), blosc
//   (32001) or zstd (32015): chunk addresses are tabulated once at open, then chunks are
//   pread and decoded on the thread pool;
// - anything else (other filters, compact or virtual layouts, external
//   storage): HDF5's own read path, serialised under the library lock.
//
// Before libhdf5 opens a dataset, its object header is decoded natively
// (hdf5_format.h) and checked: datatype, dataspace, layout, fill value and
// filter pipeline, each against the others and the file's size. HDF5 1.10
// allocates and converts from these messages unchecked.
#pragma once

#include <hdf5.h>

#include <memory>
#include <string>
#include <vector>

#include "io/array.h"
#include "io/hdf5_format.h"

namespace torch_shards::io {

// A file opened for native decoding alongside libhdf5.
struct Hdf5NativeFile {
  std::shared_ptr<const File> file;
  hdf5::FormatInfo format;
};
Hdf5NativeFile open_hdf5_native(const std::string& path);

// The messages of a dataset's object header torch_shards uses, decoded and
// checked against each other (throws ReadError naming `where`).
struct Hdf5DatasetHeader {
  hdf5::Datatype type;
  hdf5::Dataspace space;
  hdf5::Layout layout;
  std::vector<uint8_t> fill;  // one element, as stored; empty if none is defined
  std::vector<hdf5::Filter> filters;
  bool external = false;  // data in external files
};
Hdf5DatasetHeader read_hdf5_dataset_header(const Hdf5NativeFile& native, uint64_t address, const std::string& where);

// Opens dataset `path` of HDF5 file `file`; throws ReadError naming both.
std::shared_ptr<const Array> open_hdf5_array(const std::string& file, const std::string& path);
// The same with the file already open (the caller holds hdf5_lock()).
std::shared_ptr<const Array> open_hdf5_array(hid_t file_id, const std::string& file, const std::string& path);

// The stored bytes of every element of the dataset at `path` (whose header
// is `header`), in C order: from its compact or contiguous data, or its
// chunks decoded natively. Every element must be stored (no chunk left to
// the fill value): for the string arrays this reads, a dataset that is not
// fully written is corrupt. The caller holds hdf5_lock().
std::vector<uint8_t> read_hdf5_elements(hid_t file_id, const Hdf5NativeFile& native, const std::string& path,
                                        const Hdf5DatasetHeader& header, const std::string& where);

}  // namespace torch_shards::io
