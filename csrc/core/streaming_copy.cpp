#include "core/streaming_copy.h"

#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define TORCH_SHARDS_STREAMING_STORES 1
#endif
#include "core/cpu_features.h"

namespace torch_shards::core {

#ifdef TORCH_SHARDS_CPU_DISPATCH
namespace {

// Whole 64-byte lines, one load and one store each (built for baseline
// x86-64, used where the CPU has AVX-512, for a source as line-aligned as the
// destination): 4% faster than four 16-byte stores a line for rows of 8000
// bytes from cache on one core, but 20% slower than those when every load
// straddles two lines.
__attribute__((target("avx512f"))) void stream_lines_avx512(uint8_t* out, const uint8_t* in, size_t lines) {
  for (size_t i = 0; i < lines; ++i) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(out + 64 * i), _mm512_loadu_si512(in + 64 * i));
  }
}

}  // namespace
#endif

void streaming_copy(void* dst, const void* src, size_t bytes) {
#ifdef TORCH_SHARDS_STREAMING_STORES
  auto* out = static_cast<uint8_t*>(dst);
  const auto* in = static_cast<const uint8_t*>(src);
#ifdef TORCH_SHARDS_CPU_DISPATCH
  constexpr size_t kWholeLine = 64;
  const bool line_aligned = (reinterpret_cast<uintptr_t>(out) - reinterpret_cast<uintptr_t>(in)) % kWholeLine == 0;
  if (bytes >= 4 * kWholeLine && line_aligned && cpu_has_avx512()) {
    const size_t head = (kWholeLine - reinterpret_cast<uintptr_t>(out) % kWholeLine) % kWholeLine;
    std::memcpy(out, in, head);
    const size_t lines = (bytes - head) / kWholeLine;
    stream_lines_avx512(out + head, in + head, lines);
    const size_t done = head + lines * kWholeLine;
    std::memcpy(out + done, in + done, bytes - done);
    return;
  }
#endif
  constexpr size_t kLine = 16;  // one SSE2 store
  if (bytes < 4 * kLine) {
    std::memcpy(out, in, bytes);
    return;
  }
  const size_t head = (kLine - reinterpret_cast<uintptr_t>(out) % kLine) % kLine;
  std::memcpy(out, in, head);
  out += head;
  in += head;
  bytes -= head;
  const size_t body = bytes / kLine;
  auto* lines = reinterpret_cast<__m128i*>(out);
  const auto* sources = reinterpret_cast<const __m128i*>(in);
  size_t i = 0;
  for (; i + 4 <= body; i += 4) {
    const __m128i a = _mm_loadu_si128(sources + i), b = _mm_loadu_si128(sources + i + 1);
    const __m128i c = _mm_loadu_si128(sources + i + 2), d = _mm_loadu_si128(sources + i + 3);
    _mm_stream_si128(lines + i, a);
    _mm_stream_si128(lines + i + 1, b);
    _mm_stream_si128(lines + i + 2, c);
    _mm_stream_si128(lines + i + 3, d);
  }
  for (; i < body; ++i) _mm_stream_si128(lines + i, _mm_loadu_si128(sources + i));
  std::memcpy(out + body * kLine, in + body * kLine, bytes - body * kLine);
#else
  std::memcpy(dst, src, bytes);
#endif
}

void streaming_fence() {
#ifdef TORCH_SHARDS_STREAMING_STORES
  _mm_sfence();
#endif
}

}  // namespace torch_shards::core
