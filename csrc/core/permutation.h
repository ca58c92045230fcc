// Keyed pseudo-random bijections of [0, n): the block order of an epoch.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

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

// The order an epoch visits its blocks in. Up to kTableLimit elements it is
// drawn whole (Fisher-Yates from a keyed counter-based stream: every order
// equally likely) and held as a table of at most 256 KB; beyond, a
// FeistelPermutation evaluated element by element, in O(1) memory. A Feistel
// network over a few bits reaches only some orders, and unevenly (over 8
// elements, a block followed its neighbour 1.3 times an epoch instead of
// 0.875); over 17 bits and more its orders pass the same tests.
class KeyedPermutation {
 public:
  static constexpr uint64_t kTableLimit = uint64_t{1} << 16;

  KeyedPermutation(uint64_t n, uint64_t key);

  uint64_t size() const { return n_; }
  uint64_t key() const { return key_; }
  uint64_t operator()(uint64_t x) const { return order_.empty() ? feistel_(x) : order_[x]; }
  uint64_t inverse(uint64_t y) const { return order_.empty() ? feistel_.inverse(y) : position_[y]; }

 private:
  uint64_t n_;
  uint64_t key_;
  FeistelPermutation feistel_;
  std::vector<uint16_t> order_, position_;  // the drawn order and its inverse, when n <= kTableLimit
};

}  // namespace torch_shards::core
