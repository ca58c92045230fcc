// Strategies: the order of rows in an epoch. A strategy maps (number of rows,
// seed, epoch) to the epoch's plan, a sequence of row indices that never
// depends on ranks or workers and is identical on every platform.
//
//   torch_shards::Streaming(/*shuffle=*/false)
//   torch_shards::BlockShuffling(64)
//   torch_shards::BlockWeightedSampling(weights, {.total_size = 10000, .block_size = 4})
//   torch_shards::ClassBalancedSampling(labels, {.block_size = 2})
//
// `indices` restricts any strategy to a set of rows, visited in ascending row
// order; weights and labels have one entry per row or one per entry of indices.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>

#include <torch_shards/export.h>
#include <torch_shards/handle.h>

namespace torch_shards {

namespace core {
class Strategy;
class SamplingPlan;
}  // namespace core

class SourceImpl;

// What a strategy is made from and pickles to: its kind ("Streaming",
// "BlockShuffling", "BlockWeightedSampling", "ClassBalancedSampling",
// "CustomStrategy"), its integer parameters (an absent optional is an absent
// key), its tensors (real numbers as 0-d tensors) and its text parameters.
using StrategyState = std::tuple<std::string, c10::Dict<std::string, int64_t>, c10::Dict<std::string, at::Tensor>,
                                 c10::Dict<std::string, std::string>>;

// torch.classes.torch_shards.Strategy.
class TORCH_SHARDS_API StrategyImpl : public torch::CustomClassHolder {
 public:
  // Checks the parameters (c10::ValueError naming the one at fault).
  explicit StrategyImpl(StrategyState state);

  // The strategies, with the Python door's arguments (torch_shards.Streaming, BlockShuffling, ...; an absent
  // optional is Python's None); c10::ValueError naming a bad argument.
  // @{
  static c10::intrusive_ptr<StrategyImpl> streaming(bool shuffle, const std::optional<at::Tensor>& indices);
  static c10::intrusive_ptr<StrategyImpl> block_shuffling(int64_t block_size, const std::optional<at::Tensor>& indices);
  static c10::intrusive_ptr<StrategyImpl> block_weighted_sampling(const at::Tensor& weights,
                                                                  std::optional<int64_t> total_size, int64_t block_size,
                                                                  const std::optional<at::Tensor>& indices,
                                                                  bool replacement);
  // @}
  // labels, or label_key: a field of the dataset's source (for AnnData, any obs column) read when
  // a dataset is made with the strategy.
  static c10::intrusive_ptr<StrategyImpl> class_balanced_sampling(const std::optional<at::Tensor>& labels,
                                                                  std::optional<int64_t> total_size, int64_t block_size,
                                                                  const std::optional<at::Tensor>& indices,
                                                                  double smoothing,
                                                                  const std::optional<std::string>& label_key);
  // A fixed plan (the rows of every epoch), or `size` rows provided per epoch with provide().
  static c10::intrusive_ptr<StrategyImpl> custom_strategy(const std::optional<at::Tensor>& plan,
                                                          std::optional<int64_t> size, bool shuffle,
                                                          const std::string& description);

  // What the strategy is made from and pickles to.
  const StrategyState& state() const { return state_; }
  // "Streaming", "BlockShuffling", "BlockWeightedSampling", "ClassBalancedSampling" or "CustomStrategy".
  const std::string& kind() const { return std::get<0>(state_); }
  // The strategy and its parameters, as Python's repr() shows it: "BlockShuffling(block_size=8, indices=None)".
  std::string describe() const;
  // Plan entries per epoch for a source of num_rows rows.
  int64_t plan_size(int64_t num_rows) const;
  // The whole plan of one epoch (O(plan size) memory: for inspection and tests).
  at::Tensor plan(int64_t num_rows, int64_t seed, int64_t epoch) const;
  // out[j] = plan[(start + j * step) mod plan size], j < count: the DistributedSampler's layout.
  at::Tensor strided(int64_t num_rows, int64_t seed, int64_t epoch, int64_t start, int64_t step, int64_t count) const;

  // The strategy bound to a number of rows (cached for the last num_rows).
  std::shared_ptr<const core::SamplingPlan> bind(int64_t num_rows) const;
  // This strategy with what it reads from a dataset's source (label_key) read from `source`; itself if nothing.
  c10::intrusive_ptr<StrategyImpl> resolved_for(const SourceImpl& source) const;
  // CustomStrategy with a function: the plan of one epoch, before that epoch is read.
  void provide(int64_t epoch, const at::Tensor& rows, int64_t num_rows) const;

 private:
  StrategyState state_;
  std::shared_ptr<const core::Strategy> strategy_;
  mutable std::mutex binding_mutex_;
  mutable std::shared_ptr<const core::SamplingPlan> bound_;
  mutable int64_t bound_rows_ = -1;
};

class TORCH_SHARDS_API Strategy : public Handle<StrategyImpl> {
 public:
  using Handle::Handle;
};

// Rows in order; shuffle=true permutes the samples inside each fetch.
class TORCH_SHARDS_API Streaming : public Strategy {
 public:
  // indices: the rows to visit (distinct, >= 0), in ascending order; nullopt: every row.
  explicit Streaming(bool shuffle = false, const std::optional<at::Tensor>& indices = std::nullopt);
};

// Contiguous blocks of block_size rows in a new pseudo-random order each epoch.
class TORCH_SHARDS_API BlockShuffling : public Strategy {
 public:
  // block_size >= 1; indices as for Streaming. c10::ValueError for a bad argument.
  explicit BlockShuffling(int64_t block_size = 8, const std::optional<at::Tensor>& indices = std::nullopt);
};

struct BlockWeightedSamplingOptions {
  std::optional<int64_t> total_size{};  // draws per epoch (default: the rows sampled from)
  int64_t block_size = 1;
  std::optional<at::Tensor> indices{};
  bool replacement = true;
};

// total_size draws with probability proportional to weights.
class TORCH_SHARDS_API BlockWeightedSampling : public Strategy {
 public:
  // weights: 1-D, finite, >= 0, not all zero; one per row or one per entry of options.indices.
  explicit BlockWeightedSampling(const at::Tensor& weights, const BlockWeightedSamplingOptions& options = {});
};

struct ClassBalancedSamplingOptions {
  std::optional<int64_t> total_size{};
  int64_t block_size = 1;
  std::optional<at::Tensor> indices{};
  double smoothing = 0.0;  // 0: every class equally often; 1: natural frequencies
};

// Weights inversely proportional to class frequency (labels: int64 class codes, -1 for missing).
class TORCH_SHARDS_API ClassBalancedSampling : public Strategy {
 public:
  // labels: 1-D int64 codes >= 0 (-1: missing), one per row or one per entry of options.indices.
  explicit ClassBalancedSampling(const at::Tensor& labels, const ClassBalancedSamplingOptions& options = {});
  // Labels read from the dataset's source: a field, or an AnnData obs column.
  explicit ClassBalancedSampling(const std::string& label_key, const ClassBalancedSamplingOptions& options = {});
};

// A plan the user computed: the same rows every epoch.
class TORCH_SHARDS_API CustomStrategy : public Strategy {
 public:
  // plan: 1-D int64 row indices (at least one, repeats allowed); shuffle: permute them inside each fetch.
  explicit CustomStrategy(const at::Tensor& plan, bool shuffle = false);
};

}  // namespace torch_shards
