// A keyed pseudo-random bijection of [0, n) evaluated one element at a time,
// in O(1) memory: the block order of an epoch without materialising it.
#pragma once

#include <array>
#include <cstdint>

namespace torch_shards::core {

// Alternating add-Feistel network over the smallest power-of-two domain that
// holds n, restricted to [0, n) by cycle walking. The domain is split into a
// high half of `high_bits_` and a low half of `low_bits_` bits; each round adds
// a keyed hash of one half to the other modulo its size, so every round (and
// thus the network) is invertible whatever the parity of the bit count. The
// domain is below 2n, so a walk takes fewer than two steps on average.
class FeistelPermutation {
 public:
  static constexpr int kRounds = 6;

  FeistelPermutation(uint64_t n, uint64_t key);

  uint64_t size() const { return n_; }
  // The element at position x of the permuted order.
  uint64_t operator()(uint64_t x) const;
  // The position of element y: inverse(operator()(x)) == x.
  uint64_t inverse(uint64_t y) const;

 private:
  uint64_t encrypt(uint64_t x) const;
  uint64_t decrypt(uint64_t y) const;
  uint64_t round_value(int round, uint64_t half) const;

  uint64_t n_;
  int low_bits_ = 0;
  int high_bits_ = 0;
  uint64_t low_mask_ = 0;
  uint64_t high_mask_ = 0;
  std::array<uint64_t, kRounds> round_keys_{};
};

}  // namespace torch_shards::core
