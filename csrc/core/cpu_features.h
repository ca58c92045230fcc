// What the CPU running the library has, asked once. The library is built for
// baseline x86-64; its few hot loops that gain from wider vectors also have a
// version compiled for AVX2 or AVX-512 (`__attribute__((target(...)))`),
// taken where these say the CPU has it. TORCH_SHARDS_CPU_DISPATCH is defined
// where such versions can be built (x86-64, GCC or clang).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#define TORCH_SHARDS_CPU_DISPATCH 1

namespace torch_shards::core {

inline bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

inline bool cpu_has_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

// SSE4.2's crc32 instruction (CRC-32C).
inline bool cpu_has_sse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}

}  // namespace torch_shards::core
#endif
