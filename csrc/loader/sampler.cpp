#include "torch_shards/sampler.h"

#include <c10/util/Exception.h>

#include <algorithm>

#include "core/errors.h"
#include "loader/errors.h"
#include "loader/process_group.h"
#include "loader/topology.h"

namespace torch_shards {
namespace {

constexpr const char* kWho = "DistributedSampler";

}  // namespace

DistributedSamplerImpl::DistributedSamplerImpl(int64_t num_rows,
                                               const std::optional<c10::intrusive_ptr<StrategyImpl>>& strategy,
                                               std::optional<int64_t> num_replicas, std::optional<int64_t> rank,
                                               bool shuffle, int64_t seed, bool drop_last,
                                               const c10::intrusive_ptr<c10d::ProcessGroup>& process_group)
    : num_rows_(num_rows),
      strategy_given_(strategy.has_value() && *strategy),
      num_replicas_given_(num_replicas),
      rank_given_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  TORCH_CHECK_VALUE(num_rows >= 1, kWho, ": the dataset is empty (len(dataset) == 0)");
  const Topology topology = resolve_topology(rank, num_replicas, process_group, kWho);
  num_replicas_ = topology.world_size;
  rank_ = topology.rank;
  strategy_ = strategy_given_ ? *strategy
              : shuffle       ? StrategyImpl::block_shuffling(1, std::nullopt)
                              : StrategyImpl::streaming(false, std::nullopt);
  plan_size_ = strategy_->plan_size(num_rows);
  // torch's layout: pad by wrapping around to a multiple of num_replicas, or trim with drop_last.
  num_samples_ = drop_last && plan_size_ % num_replicas_ != 0 ? plan_size_ / num_replicas_
                                                              : (plan_size_ + num_replicas_ - 1) / num_replicas_;
  if (topology.group && num_replicas_ > 1) check_same_on_all_ranks(*topology.group, fingerprint(), kWho);
}

c10::intrusive_ptr<SamplerIteratorImpl> DistributedSamplerImpl::iter() {
  epoch_ = next_epoch_++;
  return c10::make_intrusive<SamplerIteratorImpl>(c10::intrusive_ptr<DistributedSamplerImpl>::reclaim_copy(this),
                                                  epoch_);
}

void DistributedSamplerImpl::set_epoch(int64_t epoch) {
  TORCH_CHECK_VALUE(epoch >= 0, kWho, ": epoch must be >= 0, got ", epoch);
  next_epoch_ = epoch;
  epoch_ = epoch;
}

at::Tensor DistributedSamplerImpl::indices(int64_t epoch, int64_t first, int64_t count) const {
  TORCH_CHECK_VALUE(first >= 0 && count >= 0 && first + count <= num_samples_, kWho, ": indices [", first, ", ",
                    first + count, ") out of range [0, ", num_samples_, ")");
  return strategy_->strided(num_rows_, seed_, epoch, rank_ + first * num_replicas_, num_replicas_, count);
}

std::string DistributedSamplerImpl::fingerprint() const {
  return core::concat("rows: ", num_rows_, "\nstrategy: ", strategy_->describe(), "\nplan entries: ", plan_size_,
                      "\nnum_replicas: ", num_replicas_, "\nseed: ", seed_,
                      "\ndrop_last: ", drop_last_ ? "True" : "False");
}

DistributedSamplerImpl::State DistributedSamplerImpl::state() const {
  c10::Dict<std::string, int64_t> ints;
  ints.insert("shuffle", shuffle_);
  ints.insert("seed", seed_);
  ints.insert("drop_last", drop_last_);
  if (num_replicas_given_) ints.insert("num_replicas", *num_replicas_given_);
  if (rank_given_) ints.insert("rank", *rank_given_);
  ints.insert("next_epoch", next_epoch_);
  std::optional<c10::intrusive_ptr<StrategyImpl>> strategy;
  if (strategy_given_) strategy = strategy_;
  return State{num_rows_, strategy, ints};
}

c10::intrusive_ptr<DistributedSamplerImpl> DistributedSamplerImpl::from_state(const State& state) {
  const auto& [num_rows, strategy, ints] = state;
  const auto optional = [&](const char* key) {
    return ints.contains(key) ? std::optional<int64_t>(ints.at(key)) : std::nullopt;
  };
  auto sampler = c10::make_intrusive<DistributedSamplerImpl>(num_rows, strategy, optional("num_replicas"),
                                                             optional("rank"), ints.at("shuffle") != 0, ints.at("seed"),
                                                             ints.at("drop_last") != 0, nullptr);
  sampler->next_epoch_ = ints.at("next_epoch");
  return sampler;
}

SamplerIteratorImpl::SamplerIteratorImpl(c10::intrusive_ptr<DistributedSamplerImpl> sampler, int64_t epoch)
    : sampler_(std::move(sampler)), epoch_(epoch) {}

std::optional<at::Tensor> SamplerIteratorImpl::next(int64_t max_count) {
  TORCH_CHECK_VALUE(max_count >= 1, kWho, ": max_count must be >= 1, got ", max_count);
  const int64_t remaining = sampler_->num_samples() - position_;
  if (remaining <= 0) return std::nullopt;
  const int64_t count = std::min(max_count, remaining);
  at::Tensor out = sampler_->indices(epoch_, position_, count);
  position_ += count;
  return out;
}

}  // namespace torch_shards
