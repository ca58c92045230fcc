// The C libraries csrc/io reads with, as this process runs them: for bug
// reports (torch_shards::build_info(), python -m torch_shards info).
#pragma once

#include <string>
#include <vector>

namespace torch_shards::io {

struct LibraryVersion {
  std::string name;      // "hdf5", "blosc", "lz4", "zstd", "zlib"
  std::string version;   // as the library reports it at run time
  std::string location;  // the file its code was loaded from (libtorch_shards.so itself when bundled)
  std::string detail;    // what it can do here: hdf5's szip filter, blosc's compressors ("" if nothing)
};

std::vector<LibraryVersion> library_versions();

}  // namespace torch_shards::io
