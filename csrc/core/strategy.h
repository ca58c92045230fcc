// Sampling strategies: each maps (number of rows, seed, epoch) to the epoch's
// plan P, a sequence of row indices. P never depends on ranks or workers.
//
// A Strategy holds the user's parameters; bind(num_rows) validates them against
// a source and returns the SamplingPlan, which evaluates any range of P for any
// (seed, epoch) on demand.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/permutation.h"

namespace torch_shards::core {

class SamplingPlan {
 public:
  virtual ~SamplingPlan() = default;
  // L, the number of entries of every epoch's plan.
  virtual int64_t size() const = 0;
  // Whether a fetch's samples are permuted before they are cut into batches.
  virtual bool shuffles_within_fetch() const = 0;
  // rows[i] = P[begin + i] for the epoch (seed, epoch), 0 <= begin, begin + count <= size().
  virtual void fill(uint64_t seed, int64_t epoch, int64_t begin, int64_t count, int64_t* rows) const = 0;
};

// The rows a strategy draws from: all of [0, num_rows), or a sorted subset.
class RowSubset {
 public:
  static RowSubset all(int64_t num_rows);
  static RowSubset of(std::vector<int64_t> sorted_rows);
  int64_t size() const { return all_ ? num_rows_ : static_cast<int64_t>(rows_.size()); }
  int64_t row(int64_t position) const { return all_ ? position : rows_[position]; }

 private:
  bool all_ = true;
  int64_t num_rows_ = 0;
  std::vector<int64_t> rows_;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::shared_ptr<const SamplingPlan> bind(int64_t num_rows) const = 0;
  // A canonical one-line description of the strategy and its parameters
  // (for repr and for cross-rank consistency checks).
  virtual std::string describe() const = 0;
  // The class name users know, used in error messages.
  const char* name() const { return name_; }
  // The optional row subset given by the user, as given.
  const std::optional<std::vector<int64_t>>& indices() const { return indices_; }

 protected:
  Strategy(const char* name, std::optional<std::vector<int64_t>> indices);
  // Positions (into indices) sorted by row, after checking rows against num_rows.
  std::vector<int64_t> subset_order(int64_t num_rows) const;
  RowSubset subset(int64_t num_rows) const;
  std::string describe_indices() const;
  // Values given per row of the source or per entry of indices, aligned with
  // the sorted subset positions: `values` itself without indices, else
  // `storage` filled in that order.
  template <typename T>
  const std::vector<T>& align_to_subset(const std::vector<T>& values, const char* what, int64_t num_rows,
                                        std::vector<T>& storage) const;

  const char* name_;
  std::optional<std::vector<int64_t>> indices_;
};

class Streaming : public Strategy {
 public:
  explicit Streaming(bool shuffle = false, std::optional<std::vector<int64_t>> indices = std::nullopt);
  std::shared_ptr<const SamplingPlan> bind(int64_t num_rows) const override;
  std::string describe() const override;

 private:
  bool shuffle_;
};

class BlockShuffling : public Strategy {
 public:
  explicit BlockShuffling(int64_t block_size = 8, std::optional<std::vector<int64_t>> indices = std::nullopt);
  std::shared_ptr<const SamplingPlan> bind(int64_t num_rows) const override;
  std::string describe() const override;

 private:
  int64_t block_size_;
};

class BlockWeightedSampling : public Strategy {
 public:
  // weights: one per row of the source, or one per entry of indices.
  BlockWeightedSampling(std::vector<double> weights, std::optional<int64_t> total_size = std::nullopt,
                        int64_t block_size = 1, std::optional<std::vector<int64_t>> indices = std::nullopt,
                        bool replacement = true);
  std::shared_ptr<const SamplingPlan> bind(int64_t num_rows) const override;
  std::string describe() const override;

 protected:
  BlockWeightedSampling(const char* name, std::vector<double> weights, std::optional<int64_t> total_size,
                        int64_t block_size, std::optional<std::vector<int64_t>> indices, bool replacement);
  std::shared_ptr<const SamplingPlan> bind_weights(int64_t num_rows, const std::vector<double>& weights) const;

  std::vector<double> weights_;
  std::optional<int64_t> total_size_;
  int64_t block_size_;
  bool replacement_;
};

class ClassBalancedSampling : public BlockWeightedSampling {
 public:
  static constexpr int64_t kMissingLabel = -1;  // pandas' and anndata's code of a missing category

  // labels: one integer class per row of the source (class sizes counted
  // over all rows, even when indices restrict the draws: scDataset's global
  // balancing), or one per entry of indices (sizes counted over those).
  // Rows labeled -1 are never drawn. smoothing in [0, 1] moves each class's
  // probability from 1 / classes (0) to its natural frequency (1).
  ClassBalancedSampling(std::vector<int64_t> labels, std::optional<int64_t> total_size = std::nullopt,
                        int64_t block_size = 1, std::optional<std::vector<int64_t>> indices = std::nullopt,
                        double smoothing = 0.0);
  std::shared_ptr<const SamplingPlan> bind(int64_t num_rows) const override;
  std::string describe() const override;

 private:
  std::vector<int64_t> labels_;
  double smoothing_;
};

// A plan its user computes (scDataset's custom strategies): the same rows
// every epoch (a fixed plan), or each epoch's rows, provided before that
// epoch is read (the Python door calls the user's function). Partitioned and
// read like any other plan; shuffle permutes the rows inside each fetch.
class CustomStrategy : public Strategy {
 public:
  // fixed: the plan of every epoch; else `size` entries provided per epoch.
  // description names the plan in describe() (and so in the ranks' check).
  CustomStrategy(std::optional<std::vector<int64_t>> fixed, int64_t size, bool shuffle, std::string description);
  std::shared_ptr<const SamplingPlan> bind(int64_t num_rows) const override;
  std::string describe() const override;
  // The rows of one epoch (size() entries in [0, num_rows)).
  void provide(int64_t epoch, std::vector<int64_t> rows, int64_t num_rows) const;
  bool fixed() const { return fixed_.has_value(); }

 private:
  struct Provided;
  std::optional<std::vector<int64_t>> fixed_;
  int64_t size_;
  bool shuffle_;
  std::string description_;
  std::shared_ptr<Provided> provided_;
};

// Blocks of consecutive subset positions visited in a keyed pseudo-random
// order; the short final block (if any) is placed like any other block.
// Shared by BlockShuffling and by sampling without replacement.
class BlockOrder {
 public:
  BlockOrder(int64_t size, int64_t block_size);
  // positions[i] = subset position at plan position begin + i.
  void fill_positions(uint64_t key, int64_t begin, int64_t count, int64_t* positions) const;

 private:
  // The blocks' order for a key, kept for the last few keys (a drawn table is
  // made once an epoch, not once a fetch; neighbouring epochs' fetches mix
  // where readers prefetch across the boundary).
  std::shared_ptr<const KeyedPermutation> order(uint64_t key) const;

  int64_t size_;
  int64_t block_size_;
  int64_t num_blocks_;
  int64_t short_size_;  // size of the last block, in [1, block_size]
  mutable std::mutex mutex_;
  mutable std::array<std::shared_ptr<const KeyedPermutation>, 3> recent_;
  mutable size_t next_recent_ = 0;
};

}  // namespace torch_shards::core
