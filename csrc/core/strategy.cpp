#include "core/strategy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <unordered_map>

#include "core/alias_table.h"
#include "core/errors.h"
#include "core/permutation.h"
#include "core/random.h"

namespace torch_shards::core {
namespace {

// Order-sensitive digest of an array, so that describe() tells apart two
// strategies whose arrays differ without printing the arrays.
template <typename T>
uint64_t digest(const std::vector<T>& values) {
  uint64_t h = mix64(values.size());
  for (const T& value : values) {
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof(T) < sizeof(bits) ? sizeof(T) : sizeof(bits));
    h = mix64(h ^ bits);
  }
  return h;
}

std::string hex(uint64_t value) {
  static const char* digits = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4) out[i] = digits[value & 15];
  return out;
}

std::string describe_optional(const std::optional<int64_t>& value) {
  return value ? std::to_string(*value) : std::string("None");
}

void check_indices(const char* strategy, const std::optional<std::vector<int64_t>>& indices) {
  if (!indices) return;
  check_argument(!indices->empty(), strategy, ": indices must not be empty");
  for (size_t i = 0; i < indices->size(); ++i) {
    check_argument((*indices)[i] >= 0, strategy, ": indices must be >= 0, got indices[", i, "] = ", (*indices)[i]);
  }
  std::vector<int64_t> sorted = *indices;
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  check_argument(dup == sorted.end(), strategy, ": indices must be unique, got row ", dup == sorted.end() ? 0 : *dup,
                 " more than once");
}

void check_block_size(const char* strategy, int64_t block_size) {
  check_argument(block_size >= 1, strategy, ": block_size must be >= 1, got ", block_size);
}

void check_total_size(const char* strategy, const std::optional<int64_t>& total_size) {
  check_argument(!total_size || *total_size >= 1, strategy, ": total_size must be >= 1, got ",
                 describe_optional(total_size));
}

class StreamingPlan : public SamplingPlan {
 public:
  StreamingPlan(RowSubset subset, bool shuffle) : subset_(std::move(subset)), shuffle_(shuffle) {}
  int64_t size() const override { return subset_.size(); }
  bool shuffles_within_fetch() const override { return shuffle_; }
  void fill(uint64_t, int64_t, int64_t begin, int64_t count, int64_t* rows) const override {
    for (int64_t i = 0; i < count; ++i) rows[i] = subset_.row(begin + i);
  }

 private:
  RowSubset subset_;
  bool shuffle_;
};

class BlockShufflingPlan : public SamplingPlan {
 public:
  BlockShufflingPlan(RowSubset subset, int64_t block_size)
      : subset_(std::move(subset)), order_(subset_.size(), block_size) {}
  int64_t size() const override { return subset_.size(); }
  bool shuffles_within_fetch() const override { return true; }
  void fill(uint64_t seed, int64_t epoch, int64_t begin, int64_t count, int64_t* rows) const override {
    order_.fill_positions(derive_key(seed, epoch, Purpose::kBlockOrder), begin, count, rows);
    for (int64_t i = 0; i < count; ++i) rows[i] = subset_.row(rows[i]);
  }

 private:
  RowSubset subset_;
  BlockOrder order_;
};

// Draws with replacement. Draw j belongs to group j / block_size; a group picks
// one block of block_size consecutive subset positions with probability
// proportional to the block's total weight, then each of its draws picks a row
// inside that block proportionally to the row weights. So every draw has
// marginal probability exactly w_row / W while a group's rows stay close on
// disk. Both choices are O(1) alias-table draws.
class WeightedPlan : public SamplingPlan {
 public:
  WeightedPlan(RowSubset subset, const std::vector<double>& weights, int64_t total_size, int64_t block_size)
      : subset_(std::move(subset)), total_size_(total_size), block_size_(block_size) {
    if (block_size_ == 1) {
      blocks_ = AliasTable(weights, static_cast<int64_t>(weights.size()));
      return;
    }
    std::vector<double> block_weights((weights.size() + block_size_ - 1) / block_size_, 0.0);
    for (size_t i = 0; i < weights.size(); ++i) block_weights[i / block_size_] += weights[i];
    blocks_ = AliasTable(block_weights, static_cast<int64_t>(block_weights.size()));
    rows_ = AliasTable(weights, block_size_);
  }
  int64_t size() const override { return total_size_; }
  bool shuffles_within_fetch() const override { return true; }

  void fill(uint64_t seed, int64_t epoch, int64_t begin, int64_t count, int64_t* rows) const override {
    const uint64_t block_key = derive_key(seed, epoch, Purpose::kWeightedBlock);
    const uint64_t row_key = derive_key(seed, epoch, Purpose::kWeightedRow);
    if (block_size_ == 1) {
      fill_rows(block_key, begin, count, rows);
      return;
    }
    int64_t group = -1, block = 0;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t draw = begin + i;
      if (draw / block_size_ != group) {
        group = draw / block_size_;
        block = pick(blocks_, 0, block_key, static_cast<uint64_t>(group));
      }
      rows[i] = subset_.row(pick(rows_, block, row_key, static_cast<uint64_t>(draw)));
    }
  }

 private:
  static int64_t pick(const AliasTable& table, int64_t segment, uint64_t key, uint64_t counter) {
    const auto r = philox4x32(key, counter, 0);
    return table.draw(segment, (uint64_t{r[0]} << 32) | r[1], to_unit_double(r[2], r[3]));
  }

  // One draw per row over a table too large for the caches: draws are
  // independent, so compute a batch of slots first and prefetch them, letting
  // their cache misses overlap.
  void fill_rows(uint64_t key, int64_t begin, int64_t count, int64_t* rows) const {
    constexpr int64_t kBatch = 32;
    uint64_t index_bits[kBatch];
    double units[kBatch];
    for (int64_t first = 0; first < count; first += kBatch) {
      const int64_t n = std::min(kBatch, count - first);
      for (int64_t i = 0; i < n; ++i) {
        const auto r = philox4x32(key, static_cast<uint64_t>(begin + first + i), 0);
        index_bits[i] = (uint64_t{r[0]} << 32) | r[1];
        units[i] = to_unit_double(r[2], r[3]);
        blocks_.prefetch(0, index_bits[i]);
      }
      for (int64_t i = 0; i < n; ++i) rows[first + i] = subset_.row(blocks_.draw(0, index_bits[i], units[i]));
    }
  }

  RowSubset subset_;
  int64_t total_size_;
  int64_t block_size_;
  AliasTable blocks_;  // one item per block (per row when block_size == 1)
  AliasTable rows_;    // rows, one segment per block (unused when block_size == 1)
};

// Draws without replacement: each epoch selects total_size distinct rows by
// Efraimidis-Spirakis keys (exponential clocks -log(u)/w, smallest win), the
// same successive-sampling law as torch.multinomial(replacement=False); the
// selection is visited in block order like BlockShuffling.
class WeightedWithoutReplacementPlan : public SamplingPlan {
 public:
  WeightedWithoutReplacementPlan(RowSubset subset, std::vector<double> weights, int64_t total_size, int64_t block_size)
      : subset_(std::move(subset)),
        weights_(std::move(weights)),
        total_size_(total_size),
        order_(total_size, block_size) {}
  int64_t size() const override { return total_size_; }
  bool shuffles_within_fetch() const override { return true; }

  void fill(uint64_t seed, int64_t epoch, int64_t begin, int64_t count, int64_t* rows) const override {
    const auto selected = selection(seed, epoch);
    order_.fill_positions(derive_key(seed, epoch, Purpose::kBlockOrder), begin, count, rows);
    for (int64_t i = 0; i < count; ++i) rows[i] = subset_.row((*selected)[rows[i]]);
  }

 private:
  std::shared_ptr<const std::vector<int64_t>> selection(uint64_t seed, int64_t epoch) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (selected_ && cached_seed_ == seed && cached_epoch_ == epoch) return selected_;
    const uint64_t key = derive_key(seed, epoch, Purpose::kWithoutReplacement);
    std::vector<std::pair<double, int64_t>> clocks;
    clocks.reserve(weights_.size());
    for (size_t p = 0; p < weights_.size(); ++p) {
      if (weights_[p] <= 0.0) continue;
      const double u = 1.0 - uniform_at(key, p);  // in (0, 1]
      clocks.emplace_back(-std::log(u) / weights_[p], static_cast<int64_t>(p));
    }
    std::nth_element(clocks.begin(), clocks.begin() + (total_size_ - 1), clocks.end());
    auto chosen = std::make_shared<std::vector<int64_t>>();
    chosen->reserve(total_size_);
    for (int64_t i = 0; i < total_size_; ++i) chosen->push_back(clocks[i].second);
    std::sort(chosen->begin(), chosen->end());
    selected_ = std::move(chosen);
    cached_seed_ = seed;
    cached_epoch_ = epoch;
    return selected_;
  }

  RowSubset subset_;
  std::vector<double> weights_;
  int64_t total_size_;
  BlockOrder order_;
  mutable std::mutex mutex_;
  mutable std::shared_ptr<const std::vector<int64_t>> selected_;
  mutable uint64_t cached_seed_ = 0;
  mutable int64_t cached_epoch_ = 0;
};

}  // namespace

RowSubset RowSubset::all(int64_t num_rows) {
  RowSubset subset;
  subset.num_rows_ = num_rows;
  return subset;
}

RowSubset RowSubset::of(std::vector<int64_t> sorted_rows) {
  RowSubset subset;
  subset.all_ = false;
  subset.rows_ = std::move(sorted_rows);
  return subset;
}

BlockOrder::BlockOrder(int64_t size, int64_t block_size) : size_(size), block_size_(block_size) {
  num_blocks_ = (size + block_size - 1) / block_size;
  short_size_ = size - (num_blocks_ - 1) * block_size;
}

std::shared_ptr<const KeyedPermutation> BlockOrder::order(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& kept : recent_) {
    if (kept && kept->key() == key) return kept;
  }
  auto made = std::make_shared<const KeyedPermutation>(static_cast<uint64_t>(num_blocks_), key);
  recent_[next_recent_++ % recent_.size()] = made;
  return made;
}

void BlockOrder::fill_positions(uint64_t key, int64_t begin, int64_t count, int64_t* positions) const {
  const std::shared_ptr<const KeyedPermutation> kept = order(key);
  const KeyedPermutation& order = *kept;
  // Order position of the last block, the only one that may be short.
  const int64_t short_at = static_cast<int64_t>(order.inverse(static_cast<uint64_t>(num_blocks_ - 1)));
  const int64_t short_begin = short_at * block_size_;
  const int64_t short_end = short_begin + short_size_;
  int64_t i = begin;
  const int64_t end = begin + count;
  while (i < end) {
    int64_t slot, offset;
    if (i < short_begin) {
      slot = i / block_size_;
      offset = i % block_size_;
    } else if (i < short_end) {
      slot = short_at;
      offset = i - short_begin;
    } else {
      slot = short_at + 1 + (i - short_end) / block_size_;
      offset = (i - short_end) % block_size_;
    }
    const int64_t block = static_cast<int64_t>(order(static_cast<uint64_t>(slot)));
    const int64_t length = block == num_blocks_ - 1 ? short_size_ : block_size_;
    const int64_t run = std::min(length - offset, end - i);
    const int64_t first = block * block_size_ + offset;
    for (int64_t t = 0; t < run; ++t) positions[i - begin + t] = first + t;
    i += run;
  }
}

Strategy::Strategy(const char* name, std::optional<std::vector<int64_t>> indices)
    : name_(name), indices_(std::move(indices)) {}

std::vector<int64_t> Strategy::subset_order(int64_t num_rows) const {
  const auto& indices = *indices_;
  for (size_t i = 0; i < indices.size(); ++i) {
    check_argument(indices[i] < num_rows, name(), ": indices must be < the number of rows (", num_rows,
                   "), got indices[", i, "] = ", indices[i]);
  }
  std::vector<int64_t> order(indices.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return indices[a] < indices[b]; });
  return order;
}

RowSubset Strategy::subset(int64_t num_rows) const {
  check_argument(num_rows >= 1, name(), ": the source must have at least one row, got ", num_rows);
  if (!indices_) return RowSubset::all(num_rows);
  std::vector<int64_t> rows;
  rows.reserve(indices_->size());
  for (int64_t position : subset_order(num_rows)) rows.push_back((*indices_)[position]);
  return RowSubset::of(std::move(rows));
}

template <typename T>
const std::vector<T>& Strategy::align_to_subset(const std::vector<T>& values, const char* what, int64_t num_rows,
                                                std::vector<T>& storage) const {
  const int64_t count = static_cast<int64_t>(values.size());
  if (!indices_) {
    check_argument(count == num_rows, name(), ": ", what, " must have one entry per row (", num_rows, "), got ", count);
    return values;
  }
  const int64_t num_indices = static_cast<int64_t>(indices_->size());
  check_argument(count == num_rows || count == num_indices, name(), ": ", what, " must have one entry per row (",
                 num_rows, ") or one per entry of indices (", num_indices, "), got ", count);
  storage.clear();
  storage.reserve(indices_->size());
  for (int64_t position : subset_order(num_rows)) {
    storage.push_back(count == num_rows ? values[(*indices_)[position]] : values[position]);
  }
  return storage;
}

template const std::vector<double>& Strategy::align_to_subset(const std::vector<double>&, const char*, int64_t,
                                                              std::vector<double>&) const;
template const std::vector<int64_t>& Strategy::align_to_subset(const std::vector<int64_t>&, const char*, int64_t,
                                                               std::vector<int64_t>&) const;

std::string Strategy::describe_indices() const {
  if (!indices_) return "indices=None";
  return concat("indices=<", indices_->size(), " rows #", hex(digest(*indices_)), ">");
}

Streaming::Streaming(bool shuffle, std::optional<std::vector<int64_t>> indices)
    : Strategy("Streaming", std::move(indices)), shuffle_(shuffle) {
  check_indices(name(), indices_);
}

std::shared_ptr<const SamplingPlan> Streaming::bind(int64_t num_rows) const {
  return std::make_shared<StreamingPlan>(subset(num_rows), shuffle_);
}

std::string Streaming::describe() const {
  return concat("Streaming(shuffle=", shuffle_ ? "True" : "False", ", ", describe_indices(), ")");
}

BlockShuffling::BlockShuffling(int64_t block_size, std::optional<std::vector<int64_t>> indices)
    : Strategy("BlockShuffling", std::move(indices)), block_size_(block_size) {
  check_block_size(name(), block_size_);
  check_indices(name(), indices_);
}

std::shared_ptr<const SamplingPlan> BlockShuffling::bind(int64_t num_rows) const {
  return std::make_shared<BlockShufflingPlan>(subset(num_rows), block_size_);
}

std::string BlockShuffling::describe() const {
  return concat("BlockShuffling(block_size=", block_size_, ", ", describe_indices(), ")");
}

BlockWeightedSampling::BlockWeightedSampling(std::vector<double> weights, std::optional<int64_t> total_size,
                                             int64_t block_size, std::optional<std::vector<int64_t>> indices,
                                             bool replacement)
    : BlockWeightedSampling("BlockWeightedSampling", std::move(weights), total_size, block_size, std::move(indices),
                            replacement) {}

BlockWeightedSampling::BlockWeightedSampling(const char* strategy_name, std::vector<double> weights,
                                             std::optional<int64_t> total_size, int64_t block_size,
                                             std::optional<std::vector<int64_t>> indices, bool replacement)
    : Strategy(strategy_name, std::move(indices)),
      weights_(std::move(weights)),
      total_size_(total_size),
      block_size_(block_size),
      replacement_(replacement) {
  check_block_size(name(), block_size_);
  check_total_size(name(), total_size_);
  check_indices(name(), indices_);
  check_argument(!weights_.empty(), name(), ": weights must not be empty");
  double total = 0.0;
  for (size_t i = 0; i < weights_.size(); ++i) {
    check_argument(std::isfinite(weights_[i]) && weights_[i] >= 0.0, name(),
                   ": weights must be finite and >= 0, got weights[", i, "] = ", weights_[i]);
    total += weights_[i];
  }
  check_argument(total > 0.0, name(), ": weights must not all be zero");
  check_argument(std::isfinite(total), name(), ": the sum of weights overflows, got ", total);
}

std::shared_ptr<const SamplingPlan> BlockWeightedSampling::bind_weights(int64_t num_rows,
                                                                        const std::vector<double>& weights) const {
  RowSubset rows = subset(num_rows);
  int64_t positive = 0;
  double total = 0.0;
  for (double w : weights) {
    positive += w > 0.0;
    total += w;
  }
  check_argument(total > 0.0, name(), ": the weights of the sampled rows must not all be zero");
  const int64_t size = total_size_.value_or(rows.size());
  if (replacement_) return std::make_shared<WeightedPlan>(std::move(rows), weights, size, block_size_);
  check_argument(size <= positive, name(), ": total_size (", size,
                 ") must not exceed the number of rows with positive weight (", positive, ") when replacement=False");
  return std::make_shared<WeightedWithoutReplacementPlan>(std::move(rows), weights, size, block_size_);
}

std::shared_ptr<const SamplingPlan> BlockWeightedSampling::bind(int64_t num_rows) const {
  check_argument(num_rows >= 1, name(), ": the source must have at least one row, got ", num_rows);
  std::vector<double> storage;
  return bind_weights(num_rows, align_to_subset(weights_, "weights", num_rows, storage));
}

std::string BlockWeightedSampling::describe() const {
  return concat("BlockWeightedSampling(weights=<", weights_.size(), " #", hex(digest(weights_)),
                ">, total_size=", describe_optional(total_size_), ", block_size=", block_size_, ", ",
                describe_indices(), ", replacement=", replacement_ ? "True" : "False", ")");
}

ClassBalancedSampling::ClassBalancedSampling(std::vector<int64_t> labels, std::optional<int64_t> total_size,
                                             int64_t block_size, std::optional<std::vector<int64_t>> indices,
                                             double smoothing)
    : BlockWeightedSampling("ClassBalancedSampling", {1.0}, total_size, block_size, std::move(indices), true),
      labels_(std::move(labels)),
      smoothing_(smoothing) {
  check_argument(!labels_.empty(), name(), ": labels must not be empty");
  // -1 is the one code for a missing label (pandas' and anndata's); any other negative code is no class.
  for (size_t i = 0; i < labels_.size(); ++i) {
    check_argument(labels_[i] >= kMissingLabel, name(),
                   ": labels must be class codes >= 0, or -1 for a missing label; got ", labels_[i], " at position ",
                   i);
  }
  check_argument(smoothing >= 0.0 && smoothing <= 1.0, name(), ": smoothing must be in [0, 1], got ", smoothing);
}

std::shared_ptr<const SamplingPlan> ClassBalancedSampling::bind(int64_t num_rows) const {
  check_argument(num_rows >= 1, name(), ": the source must have at least one row, got ", num_rows);
  std::vector<int64_t> storage;
  const std::vector<int64_t>& labels = align_to_subset(labels_, "labels", num_rows, storage);
  // Class sizes: over every row when labels cover the source (scDataset's global balancing: a
  // subset keeps the classes' importance in the whole dataset), else over the subset's rows.
  // Rows whose label is missing (-1) are no class and never drawn.
  const bool global = indices_ && static_cast<int64_t>(labels_.size()) == num_rows;
  std::unordered_map<int64_t, int64_t> sizes;
  int64_t labeled = 0;
  for (int64_t label : global ? labels_ : labels) {
    if (label == kMissingLabel) continue;
    ++sizes[label];
    ++labeled;
  }
  check_argument(labeled > 0, name(), ": every label is missing (-1): there is nothing to draw");
  // Each class is drawn with probability (1 - smoothing) / classes + smoothing * its share of the
  // labeled rows: smoothing 0 balances the classes, 1 keeps their natural frequencies.
  const double classes = static_cast<double>(sizes.size());
  std::unordered_map<int64_t, double> weight_of;
  for (const auto& [label, size] : sizes) {
    const double probability =
        (1.0 - smoothing_) / classes + smoothing_ * static_cast<double>(size) / static_cast<double>(labeled);
    weight_of[label] = probability / static_cast<double>(size);
  }
  std::vector<double> weights(labels.size(), 0.0);
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] != kMissingLabel) weights[i] = weight_of[labels[i]];
  }
  return bind_weights(num_rows, weights);
}

std::string ClassBalancedSampling::describe() const {
  return concat("ClassBalancedSampling(labels=<", labels_.size(), " #", hex(digest(labels_)),
                ">, total_size=", describe_optional(total_size_), ", block_size=", block_size_, ", ",
                describe_indices(), smoothing_ > 0.0 ? concat(", smoothing=", smoothing_) : std::string(), ")");
}

}  // namespace torch_shards::core

namespace torch_shards::core {

struct CustomStrategy::Provided {
  std::mutex mutex;
  std::map<int64_t, std::shared_ptr<const std::vector<int64_t>>> plans;  // a few recent epochs
};

namespace {

class CustomPlan : public SamplingPlan {
 public:
  CustomPlan(std::shared_ptr<const std::vector<int64_t>> fixed,
             std::function<std::shared_ptr<const std::vector<int64_t>>(int64_t)> provided, int64_t size, bool shuffle)
      : fixed_(std::move(fixed)), provided_(std::move(provided)), size_(size), shuffle_(shuffle) {}

  int64_t size() const override { return size_; }
  bool shuffles_within_fetch() const override { return shuffle_; }
  void fill(uint64_t seed, int64_t epoch, int64_t begin, int64_t count, int64_t* rows) const override {
    const auto plan = fixed_ ? fixed_ : provided_(epoch);
    std::copy(plan->begin() + begin, plan->begin() + begin + count, rows);
  }

 private:
  std::shared_ptr<const std::vector<int64_t>> fixed_;
  std::function<std::shared_ptr<const std::vector<int64_t>>(int64_t)> provided_;
  int64_t size_;
  bool shuffle_;
};

}  // namespace

CustomStrategy::CustomStrategy(std::optional<std::vector<int64_t>> fixed, int64_t size, bool shuffle,
                               std::string description)
    : Strategy("CustomStrategy", std::nullopt),
      fixed_(std::move(fixed)),
      size_(fixed_ ? static_cast<int64_t>(fixed_->size()) : size),
      shuffle_(shuffle),
      description_(std::move(description)),
      provided_(std::make_shared<Provided>()) {
  check_argument(size_ >= 1, name(), ": the plan must have at least one entry, got ", size_);
  if (fixed_) {
    for (size_t i = 0; i < fixed_->size(); ++i) {
      check_argument((*fixed_)[i] >= 0, name(), ": the plan's rows must be >= 0, got plan[", i, "] = ", (*fixed_)[i]);
    }
  }
}

std::shared_ptr<const SamplingPlan> CustomStrategy::bind(int64_t num_rows) const {
  check_argument(num_rows >= 1, name(), ": the source must have at least one row, got ", num_rows);
  if (fixed_) {
    for (size_t i = 0; i < fixed_->size(); ++i) {
      check_argument((*fixed_)[i] < num_rows, name(), ": the plan's rows must be < the number of rows (", num_rows,
                     "), got plan[", i, "] = ", (*fixed_)[i]);
    }
    return std::make_shared<CustomPlan>(std::make_shared<const std::vector<int64_t>>(*fixed_), nullptr, size_,
                                        shuffle_);
  }
  const auto provided = provided_;
  return std::make_shared<CustomPlan>(
      nullptr,
      [provided, this_name = std::string(name())](int64_t epoch) {
        std::lock_guard<std::mutex> lock(provided->mutex);
        const auto found = provided->plans.find(epoch);
        check_argument(found != provided->plans.end(), this_name, ": the plan of epoch ", epoch,
                       " was not provided (a plan computed by a function is provided by the Python door before each "
                       "epoch is read)");
        return found->second;
      },
      size_, shuffle_);
}

void CustomStrategy::provide(int64_t epoch, std::vector<int64_t> rows, int64_t num_rows) const {
  check_argument(!fixed_, name(), ": a fixed plan is not provided per epoch");
  check_argument(static_cast<int64_t>(rows.size()) == size_, name(), ": the plan of epoch ", epoch, " has ",
                 rows.size(), " entries, but the plans of this strategy have ", size_,
                 " (every epoch's plan must have as many)");
  for (size_t i = 0; i < rows.size(); ++i) {
    check_argument(rows[i] >= 0 && rows[i] < num_rows, name(), ": the plan of epoch ", epoch, " has rows outside [0, ",
                   num_rows, "): plan[", i, "] = ", rows[i]);
  }
  std::lock_guard<std::mutex> lock(provided_->mutex);
  provided_->plans[epoch] = std::make_shared<const std::vector<int64_t>>(std::move(rows));
  while (provided_->plans.size() > 8) provided_->plans.erase(provided_->plans.begin());  // iterations in flight
}

std::string CustomStrategy::describe() const {
  if (fixed_) {
    return concat("CustomStrategy(plan=<", size_, " #", hex(digest(*fixed_)),
                  ">, shuffle=", shuffle_ ? "True" : "False", ")");
  }
  return concat("CustomStrategy(", description_, ", size=", size_, ", shuffle=", shuffle_ ? "True" : "False", ")");
}

}  // namespace torch_shards::core
