// nvCOMP, the GPU decompressors of decode_on="device" (issue 49), loaded at
// run time with dlopen from the nvidia-libnvcomp-cu13 / -cu12 wheels (the
// torch_shards[gpu] extra) or the loader's path: never needed to build, and
// never loaded unless asked for. Only the C API's batched decompression is
// used (LZ4 raw blocks, Zstd frames, raw Deflate), on device buffers a
// DecodePlan describes; this file resolves the functions and does not call
// them (no CUDA here: a stream is an opaque pointer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace torch_shards::io::decode_plan {

// No usable nvCOMP: the message says what was tried and which wheel to install.
class NvcompNotFound : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

using NvcompStatus = int;  // nvcompStatus_t: 0 is nvcompSuccess
using CudaStream = void*;  // cudaStream_t

// Per-call options of nvCOMP 5's decompressors (nvcompBatched<X>DecompressOpts_t,
// 64 bytes, all zero for the defaults), passed by value; nvCOMP 4 has none.
struct NvcompDecompressOptions {
  alignas(8) unsigned char bytes[64] = {};
};

// The signatures of nvCOMP's public C headers (nvcomp/lz4.h, zstd.h, deflate.h):
// nvCOMP 4.x, and 5.x, which adds the options before the statuses.
using NvcompDecompressAsync4 = NvcompStatus (*)(const void* const* device_compressed_ptrs,
                                                const size_t* device_compressed_bytes,
                                                const size_t* device_uncompressed_buffer_bytes,
                                                size_t* device_actual_uncompressed_bytes, size_t num_chunks,
                                                void* device_temp, size_t temp_bytes,
                                                void* const* device_uncompressed_ptrs, NvcompStatus* device_statuses,
                                                CudaStream stream);
using NvcompDecompressAsync5 = NvcompStatus (*)(const void* const* device_compressed_ptrs,
                                                const size_t* device_compressed_bytes,
                                                const size_t* device_uncompressed_buffer_bytes,
                                                size_t* device_actual_uncompressed_bytes, size_t num_chunks,
                                                void* device_temp, size_t temp_bytes,
                                                void* const* device_uncompressed_ptrs, NvcompDecompressOptions options,
                                                NvcompStatus* device_statuses, CudaStream stream);
// nvcompBatched<X>DecompressGetTempSizeEx (4.x): temp bytes for a batch.
using NvcompDecompressTempSizeEx = NvcompStatus (*)(size_t num_chunks, size_t max_uncompressed_chunk_bytes,
                                                    size_t* temp_bytes, size_t max_total_uncompressed_bytes);

// One format's batched decompressor.
struct NvcompDecompressor {
  void* decompress_async = nullptr;  // nvcompBatched<X>DecompressAsync: NvcompDecompressAsync4 or 5 by major
  void* temp_size = nullptr;         // the first of the GetTempSize functions found
  std::string temp_size_name;        // which one (its signature differs between versions)
};

struct NvcompLibrary {
  std::string location;  // the file loaded
  int major = 0;         // the soname's version (4, 5), 0 if it has none
  NvcompDecompressor lz4, zstd, deflate;
  const char* (*status_string)(NvcompStatus) = nullptr;  // nvcompGetStatusString, where it exists
};

// The files tried, in order: $TORCH_SHARDS_NVCOMP_LIBRARY if set; every
// libnvcomp.so.* in the wheels' folders under each of `search_dirs` (the
// Python door passes site-packages and sys.path: nvidia/nvcomp/lib64,
// nvidia/nvcomp/lib, nvidia/cu13/lib, nvidia/cu12/lib, ...), newest major
// first; then libnvcomp.so.5, .so.4 and libnvcomp.so on the loader's path.
std::vector<std::string> nvcomp_candidates(const std::vector<std::string>& search_dirs);

// The library, loaded from the first candidate that opens and has the three
// decompressors; throws NvcompNotFound naming what was tried and the wheel
// to install otherwise. Loaded libraries stay loaded (dlopen's own count).
NvcompLibrary load_nvcomp(const std::vector<std::string>& search_dirs);

// What NvcompNotFound says after the list of what was tried.
extern const char* const kNvcompInstallHint;

}  // namespace torch_shards::io::decode_plan
