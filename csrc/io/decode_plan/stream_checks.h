// Structural checks of the compressed streams a device decoder is handed
// (issue 49). A GPU decoder may trust a stream's own lengths and offsets:
// nvCOMP's Zstd decoder faulted the GPU (an illegal memory access, which
// loses the process's CUDA context) on a frame whose block headers were
// overwritten. So the planner checks each piece on the host first and leaves
// a chunk with a piece that fails to the host decoder, which reports it (or
// decodes it, if it was only unusual).
//
//   LZ4: the block parsed whole, copying nothing: every literal run within the
//        input, every match within what was written, exactly out_size bytes
//        produced (about the cost of reading the compressed bytes once).
//   Zstd: the frame header and every block header walked: no dictionary, a
//        recorded content size equal to out_size, block types and sizes that
//        fit the frame, which ends exactly after its last block (and checksum).
//        What is inside a compressed block is the decoder's to check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace torch_shards::io::decode_plan {

// "" when the raw LZ4 block (as blosc stores them) decodes within bounds to exactly out_size bytes, else why not.
std::string check_lz4_block(const uint8_t* in, size_t size, size_t out_size);

// "" when the single zstd frame's structure fits `size` bytes and out_size decoded bytes, else why not.
std::string check_zstd_frame(const uint8_t* in, size_t size, size_t out_size);

}  // namespace torch_shards::io::decode_plan
