#include "core/streaming_copy.h"

#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#define TORCH_SHARDS_STREAMING_STORES 1
#endif

namespace torch_shards::core {

void streaming_copy(void* dst, const void* src, size_t bytes) {
#ifdef TORCH_SHARDS_STREAMING_STORES
  constexpr size_t kLine = 16;  // one SSE2 store
  auto* out = static_cast<uint8_t*>(dst);
  const auto* in = static_cast<const uint8_t*>(src);
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
