#pragma once

#include <string>

#include <torch_shards/export.h>

namespace torch_shards {

// The library's version, "major.minor.patch".
TORCH_SHARDS_API const char* version();

// What this build is and what it runs with, as a JSON object: what a bug report needs.
//   version                 torch_shards' version
//   torch                   the torch release it was compiled against ("2.13.0")
//   bundled_dependencies    true for the wheel: HDF5, c-blosc, lz4, zstd, zlib and libaec are linked in
//   libraries               [{name, version, location (the file loaded), detail}] for hdf5, blosc, lz4,
//                           zstd, zlib, as the process runs them
//   compiler                the compiler that built it
//   cpu                     {architecture, features: the vector extensions detected at run time}
// `python -m torch_shards info` prints it.
TORCH_SHARDS_API std::string build_info();

}  // namespace torch_shards
