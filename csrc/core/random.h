// Counter-based random numbers: every value is a pure function of
// (key, stream, counter), so a plan position can be evaluated in any order, on
// any rank, on any platform, with no generator state to carry around.
#pragma once

#include <array>
#include <cstdint>

namespace torch_shards::core {

// SplitMix64's finaliser: a cheap, well-mixed 64-bit bijection.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// What a random stream is used for; part of every derived key so that two
// uses of the same (seed, epoch) never share numbers.
enum class Purpose : uint64_t {
  kBlockOrder = 1,
  kFetchShuffle = 2,
  kWeightedBlock = 3,
  kWeightedRow = 4,
  kWithoutReplacement = 5,
  kSamplerOrder = 6,
};

inline uint64_t derive_key(uint64_t seed, int64_t epoch, Purpose purpose, uint64_t extra = 0) {
  uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ULL);
  h = mix64(h ^ static_cast<uint64_t>(epoch));
  h = mix64(h ^ static_cast<uint64_t>(purpose));
  return mix64(h ^ extra);
}

// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
inline std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_lo, uint64_t counter_hi) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * c0;
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {c0, c1, c2, c3};
}

// 53 random bits as a double in [0, 1).
inline double to_unit_double(uint32_t a, uint32_t b) {
  const uint64_t bits = ((uint64_t{a} << 32) | b) >> 11;
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);
}

// The counter-th uniform double of a stream.
inline double uniform_at(uint64_t key, uint64_t counter) {
  const auto r = philox4x32(key, counter, 0);
  return to_unit_double(r[0], r[1]);
}

// Uniform integer in [0, range), range >= 1, without modulo bias (Lemire,
// "Fast random integer generation in an interval"), from any stream with
// next_u32().
template <typename Stream>
uint32_t bounded_u32(Stream& stream, uint32_t range) {
  uint64_t m = uint64_t{stream.next_u32()} * range;
  uint32_t low = static_cast<uint32_t>(m);
  if (low < range) {
    const uint32_t threshold = static_cast<uint32_t>(-range) % range;
    while (low < threshold) {
      m = uint64_t{stream.next_u32()} * range;
      low = static_cast<uint32_t>(m);
    }
  }
  return static_cast<uint32_t>(m >> 32);
}

// Sequential reader over one Philox stream.
class PhiloxStream {
 public:
  explicit PhiloxStream(uint64_t key, uint64_t stream = 0) : key_(key), stream_(stream) {}

  uint32_t next_u32() {
    if (used_ == 4) {
      block_ = philox4x32(key_, counter_++, stream_);
      used_ = 0;
    }
    return block_[used_++];
  }
  uint32_t bounded(uint32_t range) { return bounded_u32(*this, range); }

 private:
  uint64_t key_;
  uint64_t stream_;
  uint64_t counter_ = 0;
  std::array<uint32_t, 4> block_{};
  int used_ = 4;
};

// SplitMix64 as a sequential stream: for long in-order uses of one key (a
// fetch's shuffle), five times cheaper per value than Philox.
class SplitMixStream {
 public:
  explicit SplitMixStream(uint64_t key) : state_(key) {}

  uint32_t next_u32() {
    if (!have_low_) {
      state_ += 0x9e3779b97f4a7c15ULL;
      word_ = mix64(state_);
      have_low_ = true;
      return static_cast<uint32_t>(word_ >> 32);
    }
    have_low_ = false;
    return static_cast<uint32_t>(word_);
  }
  uint32_t bounded(uint32_t range) { return bounded_u32(*this, range); }

 private:
  uint64_t state_;
  uint64_t word_ = 0;
  bool have_low_ = false;
};

}  // namespace torch_shards::core
