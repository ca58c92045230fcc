// nvCOMP, the GPU decompressors of decode_on="device" (issue 49), loaded at
// run time with dlopen from the nvidia-libnvcomp-cu13 / -cu12 wheels (the
// torch_shards[gpu] extra) or the loader's path: never needed to build, and
// never loaded unless asked for. Only the C API's batched decompression is
// used (LZ4 raw blocks, Zstd frames, raw Deflate), on device buffers a
// DecodePlan describes; this file resolves the functions and calls none that
// needs a GPU (no CUDA here: a stream is an opaque pointer).
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

// nvCOMP 5 and later: each decompressor takes its options by value
// (nvcompBatched{LZ4,Zstd,Deflate}DecompressOpts_t: 64 bytes of 4-byte
// fields and reserved bytes; all zero is the default: backend DEFAULT, no
// bitshuffle).
struct NvcompDecompressOptions {
  alignas(4) unsigned char bytes[64] = {};
};
static_assert(sizeof(NvcompDecompressOptions) == 64);

// The C signatures, as nvCOMP 6.0's public headers (nvcomp/lz4.h, zstd.h,
// deflate.h, the nvidia-libnvcomp-cu13 6.0.0.12 wheel) declare them for all
// three formats: the options before the statuses, and a temp size asked
// with the options and a stream.
using NvcompDecompressAsync = NvcompStatus (*)(const void* const* device_compressed_ptrs,
                                               const size_t* device_compressed_bytes,
                                               const size_t* device_uncompressed_buffer_bytes,
                                               size_t* device_actual_uncompressed_bytes, size_t num_chunks,
                                               void* device_temp, size_t temp_bytes,
                                               void* const* device_uncompressed_ptrs, NvcompDecompressOptions options,
                                               NvcompStatus* device_statuses, CudaStream stream);
using NvcompDecompressTempSize = NvcompStatus (*)(size_t num_chunks, size_t max_uncompressed_chunk_bytes,
                                                  NvcompDecompressOptions options, size_t* temp_bytes,
                                                  size_t max_total_uncompressed_bytes, CudaStream stream);
// nvCOMP 4.x: no options.
using NvcompDecompressAsyncV4 = NvcompStatus (*)(const void* const* device_compressed_ptrs,
                                                 const size_t* device_compressed_bytes,
                                                 const size_t* device_uncompressed_buffer_bytes,
                                                 size_t* device_actual_uncompressed_bytes, size_t num_chunks,
                                                 void* device_temp, size_t temp_bytes,
                                                 void* const* device_uncompressed_ptrs, NvcompStatus* device_statuses,
                                                 CudaStream stream);
using NvcompDecompressTempSizeV4 = NvcompStatus (*)(size_t num_chunks, size_t max_uncompressed_chunk_bytes,
                                                    size_t* temp_bytes, size_t max_total_uncompressed_bytes);

// One format's batched decompressor.
struct NvcompDecompressor {
  // nvcompBatched<X>DecompressAsync and the temp size function: NvcompDecompressAsync and
  // nvcompBatched<X>DecompressGetTempSize (nvCOMP 5 and later), else NvcompDecompressAsyncV4 and
  // nvcompBatched<X>DecompressGetTempSizeEx.
  void* decompress_async = nullptr;
  void* temp_size = nullptr;
};

struct NvcompLibrary {
  std::string location;  // the file loaded
  int major = 0;         // 6 for nvCOMP 6.0.0 (nvcompGetProperties, else the soname)
  uint32_t version = 0;  // nvcompGetProperties: major * 1000 + minor * 100 + patch; 0 if unknown
  bool with_options() const { return major >= 5; }
  NvcompDecompressor lz4, zstd, deflate;
  const char* (*status_string)(NvcompStatus) = nullptr;  // nvcompGetStatusString
};

// The files tried, in order: $TORCH_SHARDS_NVCOMP_LIBRARY if set; every
// libnvcomp.so.* in the wheels' folders under each of `search_dirs` (the
// Python door passes site-packages and sys.path: nvidia/libnvcomp/lib64 in
// the nvidia-libnvcomp-cu13 / -cu12 wheels, and the layouts of other NVIDIA
// wheels), newest major first; then libnvcomp.so.6, .so.5, .so.4 and
// libnvcomp.so on the loader's path.
std::vector<std::string> nvcomp_candidates(const std::vector<std::string>& search_dirs);

// The library, loaded from the first candidate that opens and has the three
// decompressors; throws NvcompNotFound naming what was tried and the wheel
// to install otherwise. A loaded library stays loaded. Needs no GPU.
NvcompLibrary load_nvcomp(const std::vector<std::string>& search_dirs);

// What NvcompNotFound says after the list of what was tried.
extern const char* const kNvcompInstallHint;

}  // namespace torch_shards::io::decode_plan
