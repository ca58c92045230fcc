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

#include <torch_shards/export.h>
#include <torch_shards/handle.h>
#include <torch_shards/strategy.h>

namespace torch_shards {

class SamplerIteratorImpl;

// The arguments of DistributedSampler, with torch's names and defaults.
struct SamplerOptions {
  std::optional<int64_t> num_replicas{};  // default: process_group, else WORLD_SIZE, else 1
  std::optional<int64_t> rank{};          // default: process_group, else RANK, else 0 (only if num_replicas is 1)
  bool shuffle = true;                    // without strategy: a keyed permutation (true) or range(N) (false)
  int64_t seed = 0;                       // the same on every replica
  bool drop_last = false;                 // trim the plan to a multiple of num_replicas instead of padding it
  std::optional<Strategy> strategy{};     // any strategy's plan instead of range / permutation
  // The group the ranks check, at construction, that they sample the same rows, strategy and seed over
  // (null: none).
  c10::intrusive_ptr<c10d::ProcessGroup> process_group{};
};

// torch.classes.torch_shards.DistributedSampler.
class TORCH_SHARDS_API DistributedSamplerImpl : public torch::CustomClassHolder {
 public:
  // The arguments of SamplerOptions, for num_rows rows; c10::ValueError for a bad one, or for ranks that
  // disagree over process_group.
  DistributedSamplerImpl(int64_t num_rows, const std::optional<c10::intrusive_ptr<StrategyImpl>>& strategy,
                         std::optional<int64_t> num_replicas, std::optional<int64_t> rank, bool shuffle, int64_t seed,
                         bool drop_last, const c10::intrusive_ptr<c10d::ProcessGroup>& process_group);

  // Starts an iteration: the next epoch (or the pinned one) once the last
  // iteration was exhausted, else that iteration's epoch again from its
  // start (a loop broken out of, or a StatefulDataLoader restoring, does not
  // skip an epoch).
  c10::intrusive_ptr<SamplerIteratorImpl> iter();
  // Pins the epoch of the next iteration; later ones count on from it.
  void set_epoch(int64_t epoch);
  // The epoch of the current (or last) iteration.
  int64_t epoch() const { return epoch_; }
  // Indices this rank yields in the next iteration (a loaded checkpoint's rest, or a whole epoch).
  int64_t length() const;

  // A checkpoint (a few integers): epoch, seed and offset, the plan entries
  // all ranks consumed so far this epoch, and what must not change (rows,
  // plan_size, drop_last, strategy_hash). consumed: the indices this rank's
  // loop consumed in the current iteration.
  c10::Dict<std::string, int64_t> state_dict(int64_t consumed) const;
  // Resumes from a checkpoint on any number of replicas: the next iteration
  // yields the plan entries not consumed yet, in torch's layout over them.
  void load_state_dict(const c10::Dict<std::string, int64_t>& state);
  // Called by an iterator that reached the end of its epoch.
  void finished(int64_t epoch);

  // The arguments as resolved (num_replicas and rank from the group or the environment when not given;
  // the seed a loaded checkpoint's).
  // @{
  int64_t num_rows() const { return num_rows_; }
  int64_t num_replicas() const { return num_replicas_; }
  int64_t rank() const { return rank_; }
  bool shuffle() const { return shuffle_; }
  int64_t seed() const { return seed_; }
  bool drop_last() const { return drop_last_; }
  // @}
  // Indices this rank yields per epoch, and all ranks together (after padding).
  // @{
  int64_t num_samples() const { return num_samples_; }
  int64_t total_size() const { return num_samples_ * num_replicas_; }
  // @}
  // Plan entries per epoch (before padding or trimming).
  int64_t plan_size() const { return plan_size_; }
  // The strategy whose plan is sampled (without one given: range or a permutation).
  const c10::intrusive_ptr<StrategyImpl>& strategy() const { return strategy_; }
  // Where rank and num_replicas came from: "explicit", "group", "environment" or "default".
  const std::string& topology_source() const { return topology_source_; }
  // This rank's indices of an epoch whose first `offset` plan entries were
  // consumed before, from its position `first`, at most `count` of them.
  at::Tensor indices(int64_t epoch, int64_t first, int64_t count, int64_t offset = 0) const;
  // Indices this rank yields in an epoch after the first `offset` plan entries.
  int64_t samples_after(int64_t offset) const;
  // What the ranks must agree on, one "key: value" line each (rows, strategy, plan entries, ...).
  std::string fingerprint() const;

  // Pickling (TorchScript): the rows, the strategy given, and the arguments as given with the next epoch.
  using State = std::tuple<int64_t, std::optional<c10::intrusive_ptr<StrategyImpl>>, c10::Dict<std::string, int64_t>>;
  // This sampler's State.
  State state() const;
  // A sampler rebuilt from a State (without a process group).
  static c10::intrusive_ptr<DistributedSamplerImpl> from_state(const State& state);

 private:
  int64_t num_rows_;
  bool strategy_given_;
  c10::intrusive_ptr<StrategyImpl> strategy_;
  std::optional<int64_t> num_replicas_given_, rank_given_;
  int64_t num_replicas_ = 1, rank_ = 0;
  std::string topology_source_;
  bool shuffle_;
  int64_t seed_;
  bool drop_last_;
  int64_t plan_size_ = 0;
  int64_t num_samples_ = 0;
  int64_t epoch_ = 0;
  int64_t next_epoch_ = 0;
  bool last_exhausted_ = true;  // the last iteration reached its end (or none started)
  bool started_ = false;
  int64_t current_offset_ = 0;  // of the current (or last) iteration
  int64_t resume_epoch_ = -1;   // a loaded checkpoint's epoch and offset
  int64_t resume_offset_ = 0;
};

// torch.classes.torch_shards.SamplerIterator: one epoch of one rank's indices.
class TORCH_SHARDS_API SamplerIteratorImpl : public torch::CustomClassHolder {
 public:
  // Made by DistributedSamplerImpl::iter(): epoch's indices after its first `offset` plan entries.
  SamplerIteratorImpl(c10::intrusive_ptr<DistributedSamplerImpl> sampler, int64_t epoch, int64_t offset);
  // The next indices (at most max_count, int64), or nullopt at the end.
  std::optional<at::Tensor> next(int64_t max_count);
  // The epoch this iterator yields.
  int64_t epoch() const { return epoch_; }
  // Indices yielded so far.
  int64_t position() const { return position_; }
  // Indices this iterator yields in all.
  int64_t length() const { return length_; }

 private:
  c10::intrusive_ptr<DistributedSamplerImpl> sampler_;
  int64_t epoch_;
  int64_t offset_;
  int64_t length_;
  int64_t position_ = 0;
};

// A torch::data sampler (torch::data::make_data_loader) over DistributedSamplerImpl.
class DistributedSampler : public torch::data::samplers::Sampler<std::vector<size_t>> {
 public:
  // A sampler of `size` rows; c10::ValueError for a bad option.
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
    returned_ = 0;
  }

  // The next indices of this rank (at most batch_size), or nullopt at the end of the epoch.
  std::optional<std::vector<size_t>> next(size_t batch_size) override {
    if (!iterator_) reset();
    const std::optional<at::Tensor> chunk = iterator_->next(static_cast<int64_t>(batch_size));
    if (!chunk) return std::nullopt;
    const int64_t* data = chunk->data_ptr<int64_t>();
    returned_ += chunk->numel();
    return std::vector<size_t>(data, data + chunk->numel());
  }

  // The checkpoint (DistributedSamplerImpl::state_dict) after the indices returned so far.
  c10::Dict<std::string, int64_t> state_dict() const { return impl_->state_dict(iterator_ ? returned_ : 0); }
  // Resumes from state_dict() (DistributedSamplerImpl::load_state_dict): the next reset() starts there.
  void load_state_dict(const c10::Dict<std::string, int64_t>& state) {
    impl_->load_state_dict(state);
    iterator_.reset();
  }

  // Writes state_dict() to a torch::serialize archive (one int64 scalar per key).
  void save(torch::serialize::OutputArchive& archive) const override {
    for (const auto& item : state_dict()) {
      archive.write(item.key(), at::scalar_tensor(item.value(), at::kLong), /*is_buffer=*/true);
    }
  }

  // Reads what save() wrote and resumes from it (load_state_dict).
  void load(torch::serialize::InputArchive& archive) override {
    c10::Dict<std::string, int64_t> state;
    for (const std::string& key : archive.keys()) {
      at::Tensor value;
      archive.read(key, value, /*is_buffer=*/true);
      state.insert(key, value.item<int64_t>());
    }
    load_state_dict(state);
  }

  // Pins the epoch of the next reset(); later ones count on from it.
  void set_epoch(int64_t epoch) { impl_->set_epoch(epoch); }
  // The epoch of the current (or last) iteration.
  int64_t epoch() const { return impl_->epoch(); }
  // Indices per epoch on this rank.
  size_t size() const { return static_cast<size_t>(impl_->num_samples()); }
  // The script object (torch.classes.torch_shards.DistributedSampler).
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
  int64_t returned_ = 0;  // indices next() returned in the current iteration
};

}  // namespace torch_shards
