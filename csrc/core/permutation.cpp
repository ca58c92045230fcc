#include "core/permutation.h"

#include <numeric>

#include "core/random.h"

namespace torch_shards::core {

FeistelPermutation::FeistelPermutation(uint64_t n, uint64_t key) : n_(n) {
  int bits = 0;
  while (bits < 64 && (uint64_t{1} << bits) < n) ++bits;
  high_bits_ = bits / 2;
  low_bits_ = bits - high_bits_;
  low_mask_ = low_bits_ == 64 ? ~uint64_t{0} : (uint64_t{1} << low_bits_) - 1;
  high_mask_ = (uint64_t{1} << high_bits_) - 1;
  uint64_t k = key;
  for (auto& round_key : round_keys_) {
    k = mix64(k + 0x9e3779b97f4a7c15ULL);
    round_key = k;
  }
}

uint64_t FeistelPermutation::round_value(int round, uint64_t half) const { return mix64(half ^ round_keys_[round]); }

uint64_t FeistelPermutation::encrypt(uint64_t x) const {
  uint64_t high = x >> low_bits_;
  uint64_t low = x & low_mask_;
  for (int r = 0; r < kRounds; ++r) {
    if (r % 2 == 0) {
      low = (low + round_value(r, high)) & low_mask_;
    } else {
      high = (high + round_value(r, low)) & high_mask_;
    }
  }
  return (high << low_bits_) | low;
}

uint64_t FeistelPermutation::decrypt(uint64_t y) const {
  uint64_t high = y >> low_bits_;
  uint64_t low = y & low_mask_;
  for (int r = kRounds - 1; r >= 0; --r) {
    if (r % 2 == 0) {
      low = (low - round_value(r, high)) & low_mask_;
    } else {
      high = (high - round_value(r, low)) & high_mask_;
    }
  }
  return (high << low_bits_) | low;
}

uint64_t FeistelPermutation::operator()(uint64_t x) const {
  if (n_ <= 1) return x;
  uint64_t y = encrypt(x);
  while (y >= n_) y = encrypt(y);
  return y;
}

uint64_t FeistelPermutation::inverse(uint64_t y) const {
  if (n_ <= 1) return y;
  uint64_t x = decrypt(y);
  while (x >= n_) x = decrypt(x);
  return x;
}

KeyedPermutation::KeyedPermutation(uint64_t n, uint64_t key) : n_(n), key_(key), feistel_(n, key) {
  if (n <= 1 || n > kTableLimit) return;
  order_.resize(n);
  std::iota(order_.begin(), order_.end(), uint16_t{0});
  SplitMixStream stream(key);
  for (uint64_t i = n - 1; i > 0; --i) {
    std::swap(order_[i], order_[stream.bounded(static_cast<uint32_t>(i + 1))]);
  }
  position_.resize(n);
  for (uint64_t x = 0; x < n; ++x) position_[order_[x]] = static_cast<uint16_t>(x);
}

}  // namespace torch_shards::core
