// Copies into memory that is written once and read much later: a fetch's
// output (tens of MB, past the caches) that the consumer reads only after the
// reader has moved on. Ordinary stores first read every destination cache
// line from memory (to own it) and later write it back; non-temporal stores
// write whole lines straight to memory, a third less memory traffic, and
// leave the caches to the data being read.
//
// Non-temporal stores are weakly ordered: the thread that made them calls
// streaming_fence() before another thread may read what they wrote (at the end
// of each parallel task). Other architectures copy with memcpy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace torch_shards::core {

// Whether a read writing rows of `row_bytes` into an output of
// `output_bytes` (a unit or piece, as allocated: 64-byte aligned) writes them
// with non-temporal stores. The output must be one of 8 MB or more (by the
// time it is read, more than a typical last-level cache share has been
// written after it) or one that `crosses` to another process (a DataLoader
// worker's slabs, recycled after tens of MB, long out of the caches:
// ordinary stores read each line from memory first). And its rows must fill
// whole 64-byte lines, or be of 4 KB or more: a row of another size shares
// its first and last lines with its neighbours, which then take both kinds
// of stores. TensorSource rows of 100, 200, 516 and 1028 bytes read 1.7-4x
// slower streamed, rows of 4100 and 8004 bytes 5-15% faster
// (benchmarks/NOTES.md).
inline bool streams(size_t output_bytes, size_t row_bytes, bool crosses = false) {
  const bool fills_lines = row_bytes % 64 == 0 || row_bytes >= (size_t{4} << 10);
  return fills_lines && (crosses || output_bytes >= (size_t{8} << 20));
}

// Copies `bytes` from src to dst, non-temporally where the architecture
// allows (any alignment; the unaligned edges are copied normally). Fastest
// when src lies as far from a 64-byte line's start as dst does: a source
// staged for the copy is placed so (line_aligned_like).
void streaming_copy(void* dst, const void* src, size_t bytes);

// Where in `buffer` (at least 64 bytes longer than what it stages) to stage
// what will be copied to `dst`: the first address from `buffer` as far from a
// 64-byte line's start as dst.
inline uint8_t* line_aligned_like(uint8_t* buffer, const void* dst) {
  constexpr uintptr_t kLine = 64;
  const uintptr_t want = reinterpret_cast<uintptr_t>(dst) % kLine, have = reinterpret_cast<uintptr_t>(buffer) % kLine;
  return buffer + (want + kLine - have) % kLine;
}

// Makes this thread's non-temporal stores visible to other threads.
void streaming_fence();

// memcpy, or streaming_copy when `streaming`.
inline void copy_bytes(void* dst, const void* src, size_t bytes, bool streaming) {
  if (streaming) {
    streaming_copy(dst, src, bytes);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

}  // namespace torch_shards::core
