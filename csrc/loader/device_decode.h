// A DecodePlan (csrc/io/decode_plan) executed on the device its output lives
// on, with torch ops (issue 49, decode_on="device"): the compressed pieces
// uploaded once, decompressed there (CUDA: nvCOMP's batched decompressors;
// CPU: the CPU codecs, which is how the tests run every step but nvCOMP's on
// any machine), blosc blocks unshuffled, fill and host-decoded chunks placed,
// rows copied to the output and the post-steps applied, all on the current
// stream. No CUDA compiler: torch's tensors, copies and streams do the rest.
//
// The output is bit for bit what execute_on_cpu (and so Array::read) writes.
// Wrapper checksums inside pieces (zlib's Adler-32, gzip's CRC-32) are checked
// on the CPU only; a piece nvCOMP cannot decompress to its size is an error
// naming the chunk, found when the executor reads the statuses back.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "io/decode_plan/decode_plan.h"
#include "io/decode_plan/nvcomp_library.h"

namespace torch_shards {

// What one execute_plan did, for benchmarks and tests.
struct DeviceDecodeStats {
  int64_t pieces = 0;          // decompressed (copies of stored pieces included)
  int64_t uploaded_bytes = 0;  // host to device: compressed pieces and host-decoded chunks
  int64_t operations = 0;      // device operations launched (fills, unshuffles, moves, post-steps)
  int64_t host_chunks = 0;     // decoded on the host (codecs the device does not decode)
  // Where the time went, in microseconds of the calling thread: packing and uploading what the device
  // reads, enqueueing the device's work, waiting for it to end (the statuses read back).
  int64_t prepare_us = 0, enqueue_us = 0, wait_us = 0;
};

// Writes the plan's output_bytes into `out` (a contiguous uint8 tensor of at
// least output_bytes, on a CUDA device or the CPU) as execute_on_cpu would.
// On CUDA `nvcomp` must be loaded (load_nvcomp); on the CPU it is unused.
// Returns after the device finished (the statuses are read back); throws
// core::ReadError naming the chunk for a piece that does not decompress.
// With a pool, its threads pack the pieces for the upload (CUDA) or decompress them (CPU).
DeviceDecodeStats execute_plan(const io::decode_plan::DecodePlan& plan, const at::Tensor& out,
                               const io::decode_plan::NvcompLibrary* nvcomp, core::ThreadPool* pool = nullptr);

// One move of bytes inside or between uint8 tensors: src [from, + size) to dst [to, + size).
struct ByteMove {
  uint64_t from = 0, to = 0, size = 0;
};

// Applies the moves (no two writing the same byte) with a handful of
// device operations whatever their number: few moves one by one, many as one
// gather in the widest unit (up to 8 bytes) every offset and size allows.
// Returns the number of operations launched.
int64_t move_bytes(const at::Tensor& src, const at::Tensor& dst, const std::vector<ByteMove>& moves);

}  // namespace torch_shards
