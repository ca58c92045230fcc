// Runs a DecodePlan with the CPU's codecs (lz4 raw blocks, zstd, raw
// deflate) and unshuffles in software: the reference a device executor is
// checked against, and what the tests compare, bit for bit, with the reader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "io/decode_plan/decode_plan.h"

namespace torch_shards::io::decode_plan {

// c-blosc's bit unshuffle of one block of `size` bytes of elements of
// `typesize` bytes: bit k of byte j of element i is bit i % 8 of byte
// (8 j + k) * n / 8 + i / 8 of `in`, for the first n elements (a multiple of
// 8); the bytes after them are copied as they are.
void bit_unshuffle(const uint8_t* in, size_t size, size_t typesize, uint8_t* out);

// Decompresses one piece (its input_size bytes at `in`) into `out` (its
// output_size bytes) and checks its wrapper's checksum. Throws
// core::ReadError naming the chunk when it does not decode to its size or the
// checksum differs.
void decode_piece(const DecodePlan& plan, const Piece& piece, const uint8_t* in, uint8_t* out);

// Decodes the stored bytes of a kHost chunk (plan.chunks[chunk]) with the
// plan's host decoder into `out` (chunk_bytes). Throws core::ReadError naming the chunk.
void decode_host_chunk(const DecodePlan& plan, uint32_t chunk, uint8_t* out);

// Writes the plan's output_bytes to `out`, as Array::read would write the
// segments the plan was made for (bytes no segment writes are left as they
// are). Throws std::runtime_error naming the chunk for a piece that does not
// decompress to its size or whose wrapper's checksum differs.
void execute_on_cpu(const DecodePlan& plan, uint8_t* out);

}  // namespace torch_shards::io::decode_plan
