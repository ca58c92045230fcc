#include "core/alias_table.h"

#include <algorithm>

namespace torch_shards::core {

AliasTable::AliasTable(const std::vector<double>& weights, int64_t segment_size)
    : size_(static_cast<int64_t>(weights.size())), segment_size_(std::max<int64_t>(1, segment_size)) {
  slots_.resize(weights.size());
  std::vector<int64_t> small, large;
  for (int64_t begin = 0; begin < size_; begin += segment_size_) {
    build_segment(weights.data(), begin, std::min(segment_size_, size_ - begin), small, large);
  }
}

void AliasTable::build_segment(const double* weights, int64_t begin, int64_t length, std::vector<int64_t>& small,
                               std::vector<int64_t>& large) {
  double total = 0.0;
  for (int64_t i = 0; i < length; ++i) total += weights[begin + i];
  // A threshold first holds its item's weight scaled to a mean of 1, and
  // becomes the keep-probability as items are paired (in place).
  Slot* slot = slots_.data() + begin;
  small.clear();
  large.clear();
  int64_t positive = -1;
  for (int64_t i = length - 1; i >= 0; --i) {
    slot[i].threshold = total > 0.0 ? weights[begin + i] * static_cast<double>(length) / total : 0.0;
    slot[i].alias = i;
    if (weights[begin + i] > 0.0) positive = i;
    (slot[i].threshold < 1.0 ? small : large).push_back(i);
  }
  while (!small.empty() && !large.empty()) {
    const int64_t lesser = small.back();
    small.pop_back();
    const int64_t greater = large.back();
    large.pop_back();
    slot[lesser].alias = greater;
    slot[greater].threshold = (slot[greater].threshold + slot[lesser].threshold) - 1.0;
    (slot[greater].threshold < 1.0 ? small : large).push_back(greater);
  }
  // Leftovers differ from 1 only by rounding: they keep themselves, except a
  // zero-weight item, which must never be drawn.
  for (int64_t i : large) slot[i].threshold = 1.0;
  for (int64_t i : small) {
    if (weights[begin + i] > 0.0 || positive < 0) {
      slot[i].threshold = 1.0;
    } else {
      slot[i].threshold = 0.0;
      slot[i].alias = positive;
    }
  }
}

}  // namespace torch_shards::core
