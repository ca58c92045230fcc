// Walker's alias method (Vose's construction): O(1) weighted draws from a
// fixed set of weights, with each item's probability w_i / W up to rounding.
// Built in a fixed order from IEEE doubles, so every platform builds (and
// draws from) the same table.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace torch_shards::core {

class AliasTable {
 public:
  AliasTable() = default;
  // Tables for consecutive segments of weights: segment s covers
  // [s * segment_size, min((s + 1) * segment_size, n)) and draws stay inside
  // it. segment_size >= n gives one table over all items. Weights must be
  // finite and >= 0; a segment of zero total weight can never be drawn from.
  AliasTable(const std::vector<double>& weights, int64_t segment_size);

  // An item of segment s (absolute index), from 64 + 53 random bits.
  int64_t draw(int64_t segment, uint64_t index_bits, double unit) const {
    const int64_t slot = slot_of(segment, index_bits);
    const Slot& entry = slots_[slot];
    return unit < entry.threshold ? slot : segment * segment_size_ + entry.alias;
  }

  // Brings the slot draw(segment, index_bits, ...) will read towards the cache.
  void prefetch(int64_t segment, uint64_t index_bits) const {
    __builtin_prefetch(&slots_[slot_of(segment, index_bits)]);
  }

  int64_t size() const { return size_; }

 private:
  // A uniform slot of the segment from 64 random bits (multiply-high).
  int64_t slot_of(int64_t segment, uint64_t index_bits) const {
    const int64_t begin = segment * segment_size_;
    const int64_t length = std::min<int64_t>(segment_size_, size_ - begin);
    return begin + static_cast<int64_t>((static_cast<unsigned __int128>(index_bits) * length) >> 64);
  }

  // One cache line fetch per draw: both halves of a slot side by side.
  struct Slot {
    double threshold;  // keep the slot's own item with this probability
    int64_t alias;     // else take this item (offset inside the segment)
  };

  void build_segment(const double* weights, int64_t begin, int64_t length, std::vector<int64_t>& small,
                     std::vector<int64_t>& large);

  int64_t size_ = 0;
  int64_t segment_size_ = 1;
  std::vector<Slot> slots_;
};

}  // namespace torch_shards::core
