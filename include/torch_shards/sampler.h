// DistributedSampler: torch's DistributedSampler layout (the epoch's plan
// padded by wrapping around, or trimmed with drop_last, to a multiple of
// num_replicas; rank r takes every num_replicas-th entry from position r)
// over any strategy's plan, evaluated in chunks with memory flat in the
// number of rows. Without a strategy the plan is range(N) (shuffle=false,
// identical to torch's) or a keyed pseudo-random permutation (shuffle=true).
//
// For map-style C++ datasets it is a torch::data sampler:
//   auto loader = torch::data::make_data_loader(dataset.map(torch::data::transforms::Stack<>()),
//                                               torch_shards::DistributedSampler(dataset.size().value()),
//                                               torch::data::DataLoaderOptions(64));
// every loop over the loader (every reset()) starts the next epoch.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/data/samplers/base.h>
#include <torch/serialize/archive.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdint>
#include <optional>
#include <vector>

#include "torch_shards/export.h"
#include "torch_shards/handle.h"
#include "torch_shards/strategy.h"

namespace torch_shards {

class SamplerIteratorImpl;

// The arguments of DistributedSampler, with torch's names and defaults.
struct SamplerOptions {
  std::optional<int64_t> num_replicas{};  // default: process_group, else WORLD_SIZE, else 1
  std::optional<int64_t> rank{};          // default: process_group, else RANK, else 0
  bool shuffle = true;
  int64_t seed = 0;
  bool drop_last = false;
  std::optional<Strategy> strategy{};  // any strategy's plan instead of range / permutation
  c10::intrusive_ptr<c10d::ProcessGroup> process_group{};
};

// torch.classes.torch_shards.DistributedSampler.
class TORCH_SHARDS_API DistributedSamplerImpl : public torch::CustomClassHolder {
 public:
  DistributedSamplerImpl(int64_t num_rows, const std::optional<c10::intrusive_ptr<StrategyImpl>>& strategy,
                         std::optional<int64_t> num_replicas, std::optional<int64_t> rank, bool shuffle, int64_t seed,
                         bool drop_last, const c10::intrusive_ptr<c10d::ProcessGroup>& process_group);

  // Starts the next epoch (or the pinned one).
  c10::intrusive_ptr<SamplerIteratorImpl> iter();
  void set_epoch(int64_t epoch);
  // The epoch of the current (or last) iteration.
  int64_t epoch() const { return epoch_; }

  int64_t num_rows() const { return num_rows_; }
  int64_t num_replicas() const { return num_replicas_; }
  int64_t rank() const { return rank_; }
  bool shuffle() const { return shuffle_; }
  int64_t seed() const { return seed_; }
  bool drop_last() const { return drop_last_; }
  // Indices this rank yields per epoch, and all ranks together (after padding).
  int64_t num_samples() const { return num_samples_; }
  int64_t total_size() const { return num_samples_ * num_replicas_; }
  int64_t plan_size() const { return plan_size_; }
  const c10::intrusive_ptr<StrategyImpl>& strategy() const { return strategy_; }
  // This rank's indices of an epoch from position `first`, at most `count` of them.
  at::Tensor indices(int64_t epoch, int64_t first, int64_t count) const;
  std::string fingerprint() const;

  using State = std::tuple<int64_t, std::optional<c10::intrusive_ptr<StrategyImpl>>, c10::Dict<std::string, int64_t>>;
  State state() const;
  static c10::intrusive_ptr<DistributedSamplerImpl> from_state(const State& state);

 private:
  int64_t num_rows_;
  bool strategy_given_;
  c10::intrusive_ptr<StrategyImpl> strategy_;
  std::optional<int64_t> num_replicas_given_, rank_given_;
  int64_t num_replicas_ = 1, rank_ = 0;
  bool shuffle_;
  int64_t seed_;
  bool drop_last_;
  int64_t plan_size_ = 0;
  int64_t num_samples_ = 0;
  int64_t epoch_ = 0;
  int64_t next_epoch_ = 0;
};

// torch.classes.torch_shards.SamplerIterator: one epoch of one rank's indices.
class TORCH_SHARDS_API SamplerIteratorImpl : public torch::CustomClassHolder {
 public:
  SamplerIteratorImpl(c10::intrusive_ptr<DistributedSamplerImpl> sampler, int64_t epoch);
  // The next indices (at most max_count, int64), or nullopt at the end.
  std::optional<at::Tensor> next(int64_t max_count);
  int64_t epoch() const { return epoch_; }
  int64_t position() const { return position_; }

 private:
  c10::intrusive_ptr<DistributedSamplerImpl> sampler_;
  int64_t epoch_;
  int64_t position_ = 0;
};

// A torch::data sampler (torch::data::make_data_loader) over DistributedSamplerImpl.
class DistributedSampler : public torch::data::samplers::Sampler<std::vector<size_t>> {
 public:
  explicit DistributedSampler(size_t size, const SamplerOptions& options = {})
      : options_(options), impl_(make(static_cast<int64_t>(size))) {}

  // Starts the next epoch (torch::data's DataLoader calls it at every begin()).
  void reset(std::optional<size_t> new_size = std::nullopt) override {
    if (new_size && static_cast<int64_t>(*new_size) != impl_->num_rows()) {
      const int64_t next_epoch = impl_->epoch() + (iterator_ ? 1 : 0);
      impl_ = make(static_cast<int64_t>(*new_size));
      impl_->set_epoch(next_epoch);
    }
    iterator_ = impl_->iter();
  }

  std::optional<std::vector<size_t>> next(size_t batch_size) override {
    if (!iterator_) iterator_ = impl_->iter();
    const std::optional<at::Tensor> chunk = iterator_->next(static_cast<int64_t>(batch_size));
    if (!chunk) return std::nullopt;
    const int64_t* data = chunk->data_ptr<int64_t>();
    return std::vector<size_t>(data, data + chunk->numel());
  }

  void save(torch::serialize::OutputArchive& archive) const override {
    archive.write("epoch", at::scalar_tensor(impl_->epoch(), at::kLong), /*is_buffer=*/true);
    archive.write("seed", at::scalar_tensor(impl_->seed(), at::kLong), /*is_buffer=*/true);
  }

  void load(torch::serialize::InputArchive& archive) override {
    at::Tensor epoch, seed;
    archive.read("epoch", epoch, /*is_buffer=*/true);
    archive.read("seed", seed, /*is_buffer=*/true);
    TORCH_CHECK_VALUE(seed.item<int64_t>() == impl_->seed(), "DistributedSampler: the archive was saved with seed ",
                      seed.item<int64_t>(), ", this sampler has seed ", impl_->seed());
    impl_->set_epoch(epoch.item<int64_t>());
    iterator_.reset();
  }

  void set_epoch(int64_t epoch) { impl_->set_epoch(epoch); }
  int64_t epoch() const { return impl_->epoch(); }
  // Indices per epoch on this rank.
  size_t size() const { return static_cast<size_t>(impl_->num_samples()); }
  const c10::intrusive_ptr<DistributedSamplerImpl>& native() const { return impl_; }

 private:
  c10::intrusive_ptr<DistributedSamplerImpl> make(int64_t size) const {
    std::optional<c10::intrusive_ptr<StrategyImpl>> strategy;
    if (options_.strategy) strategy = options_.strategy->native();
    return c10::make_intrusive<DistributedSamplerImpl>(size, strategy, options_.num_replicas, options_.rank,
                                                       options_.shuffle, options_.seed, options_.drop_last,
                                                       options_.process_group);
  }

  SamplerOptions options_;
  c10::intrusive_ptr<DistributedSamplerImpl> impl_;
  c10::intrusive_ptr<SamplerIteratorImpl> iterator_;
};

}  // namespace torch_shards
