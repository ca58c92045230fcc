// The objects torch knows as torch.classes.torch_shards.*: thin holders over
// the core, shared by Python, TorchScript and C++ LibTorch users.
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../core/planner.h"
#include "../core/strategy.h"
#include "../core/thread_pool.h"
#include "../io/anndata.h"
#include "epoch_reader.h"
#include "source.h"

namespace torch_shards {

// torch.classes.torch_shards.Strategy: built by the torch_shards::streaming,
// ::block_shuffling, ::block_weighted_sampling, ::class_balanced_sampling ops.
class Strategy : public torch::CustomClassHolder {
 public:
  explicit Strategy(std::shared_ptr<const core::Strategy> strategy) : strategy_(std::move(strategy)) {}
  const std::shared_ptr<const core::Strategy>& get() const { return strategy_; }
  std::string describe() const { return strategy_->describe(); }
  // Number of plan entries for a source of num_rows rows.
  int64_t plan_size(int64_t num_rows) const;
  // The whole plan P of one epoch (for inspection and tests: O(L) memory).
  at::Tensor plan(int64_t num_rows, int64_t seed, int64_t epoch) const;
  // DistributedSampler layout: out[j] = P[(start + j * step) mod L], j < count.
  at::Tensor strided(int64_t num_rows, int64_t seed, int64_t epoch, int64_t start, int64_t step, int64_t count) const;

 private:
  std::shared_ptr<const core::SamplingPlan> bound(int64_t num_rows) const;

  std::shared_ptr<const core::Strategy> strategy_;
  // The last binding, reused while num_rows stays the same.
  mutable std::shared_ptr<const core::SamplingPlan> bound_;
  mutable int64_t bound_rows_ = -1;
};

// torch.classes.torch_shards.Source: built by torch_shards::tensor_source and
// the file source ops.
class Source : public torch::CustomClassHolder {
 public:
  explicit Source(std::shared_ptr<const sources::Source> source) : source_(std::move(source)) {}
  const std::shared_ptr<const sources::Source>& get() const { return source_; }
  int64_t num_rows() const { return source_->num_rows(); }
  std::vector<std::string> field_names() const { return source_->field_names(); }
  // One line per field: "X: Float[2000] (sparse CSR)".
  std::vector<std::string> field_specs() const;
  std::string describe() const { return source_->describe(); }
  // Reads rows (any order, repeats allowed) with num_threads threads.
  sources::Batch read(const at::Tensor& rows, int64_t num_threads) const;

 private:
  std::shared_ptr<const sources::Source> source_;
};

// torch.classes.torch_shards.ShardedDataset: one rank's view of a source read
// through a strategy. Iteration state lives in EpochReader.
class ShardedDataset : public torch::CustomClassHolder {
 public:
  ShardedDataset(c10::intrusive_ptr<Source> source, c10::intrusive_ptr<Strategy> strategy, int64_t batch_size,
                 int64_t fetch_factor, bool drop_last, const std::string& even_batches, int64_t seed, int64_t rank,
                 int64_t world_size);

  int64_t seed() const { return static_cast<int64_t>(seed_); }
  int64_t rank() const { return rank_; }
  int64_t world_size() const { return planner_->layout().world_size(); }
  int64_t batch_size() const { return planner_->layout().batch_size(); }
  int64_t plan_size() const { return planner_->layout().plan_size(); }
  int64_t num_global_batches() const { return planner_->layout().num_global_batches(); }
  // Batches this rank delivers per epoch, all workers together.
  int64_t num_batches() const { return planner_->layout().rank_batches(rank_); }
  int64_t worker_batches(int64_t worker, int64_t num_workers) const;
  // Rows of fetch f of an epoch, in delivery order.
  at::Tensor fetch_rows(int64_t epoch, int64_t fetch) const;
  std::string describe() const;
  // What this rank is about to read, one "key: value" line per property that
  // must agree across ranks (rows, source and files, strategy, loader
  // arguments, world size, seed).
  std::string fingerprint() const;
  // All-gathers the fingerprints over the named process group and throws on
  // every rank, naming the first difference, if any rank disagrees.
  void check_consistency(const std::string& group_name) const;
  // One worker's pass over one epoch.
  c10::intrusive_ptr<EpochReader> reader(int64_t epoch, int64_t worker, int64_t num_workers,
                                         const ReaderOptions& options) const;

  const std::shared_ptr<const sources::Source>& source() const { return source_; }
  const std::shared_ptr<const core::Planner>& planner() const { return planner_; }

 private:
  std::shared_ptr<const sources::Source> source_;
  std::string strategy_description_;
  std::shared_ptr<const core::Planner> planner_;
  core::LoaderOptions options_;
  uint64_t seed_;
  int64_t rank_;
};

// torch.classes.torch_shards.AnnData: an opened .h5ad file or AnnData zarr
// store, for lookups (names, categories) and for making sources.
class AnnData : public torch::CustomClassHolder {
 public:
  explicit AnnData(std::shared_ptr<const io::AnnDataStore> store) : store_(std::move(store)) {}
  int64_t n_obs() const { return store_->n_obs(); }
  int64_t n_vars() const { return store_->n_vars(); }
  std::vector<std::string> obs_names() const { return store_->obs_names(); }
  std::vector<std::string> var_names() const { return store_->var_names(); }
  std::vector<std::string> obs_columns() const { return store_->obs_columns(); }
  // The categories of a categorical obs column, as a JSON array.
  std::string categories_json(const std::string& column) const;
  c10::intrusive_ptr<Source> source(const std::vector<std::string>& obs, const std::optional<std::string>& layer,
                                    bool dense) const;

 private:
  std::shared_ptr<const io::AnnDataStore> store_;
};

}  // namespace torch_shards
