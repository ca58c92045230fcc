#include <torch_shards/sampler.h>

#include <c10/util/Exception.h>

#include <algorithm>

#include "core/epoch_layout.h"
#include "core/errors.h"
#include "core/resume.h"
#include "core/stable_hash.h"
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
  TORCH_CHECK_VALUE(num_rows >= 0, kWho, ": len(dataset) must be >= 0, got ", num_rows);
  // An empty dataset yields nothing, as torch's sampler does; a strategy has nothing to draw from.
  TORCH_CHECK_VALUE(num_rows >= 1 || !strategy_given_, kWho,
                    ": the dataset is empty (len(dataset) == 0): a strategy has nothing to draw from");
  if (rank && num_replicas && *num_replicas >= 1) {  // torch's words, which code written for torch's looks for
    TORCH_CHECK_VALUE(*rank >= 0 && *rank < *num_replicas, kWho, ": Invalid rank ", *rank,
                      ", rank should be in the interval [0, ", *num_replicas - 1, "] (num_replicas=", *num_replicas,
                      ")");
  }
  const Topology topology = resolve_topology(rank, num_replicas, process_group, kWho, "num_replicas");
  num_replicas_ = topology.world_size;
  rank_ = topology.rank;
  if (strategy_given_) {
    // Streaming's and CustomStrategy's shuffle= permutes the rows of a dataset's fetches, which a sampler has none of.
    const auto& kind = (*strategy)->kind();
    const auto& ints = std::get<1>((*strategy)->state());
    TORCH_CHECK_VALUE(
        !((kind == "Streaming" || kind == "CustomStrategy") && ints.contains("shuffle") && ints.at("shuffle") != 0),
        kWho, ": ", (*strategy)->describe(),
        ": shuffle=True permutes rows within the fetches of a ShardedDataset; a sampler has no fetches and would "
        "yield the plan unshuffled. For a sampler, pass shuffle=True without a strategy (a uniform permutation), "
        "BlockShuffling(block_size), or this strategy with shuffle=False");
  }
  strategy_ = strategy_given_ ? *strategy
              : shuffle       ? StrategyImpl::block_shuffling(1, std::nullopt)
                              : StrategyImpl::streaming(false, std::nullopt);
  plan_size_ = num_rows == 0 ? 0 : strategy_->plan_size(num_rows);
  TORCH_CHECK_VALUE(plan_size_ <= core::kMaxPlanSize, kWho, ": the strategy's plan has ", plan_size_,
                    " entries, more than 2**62");  // padded to a multiple of num_replicas, it would overflow
  // torch's layout: pad by wrapping around to a multiple of num_replicas, or trim with drop_last.
  num_samples_ = drop_last && plan_size_ % num_replicas_ != 0 ? plan_size_ / num_replicas_
                                                              : (plan_size_ + num_replicas_ - 1) / num_replicas_;
  topology_source_ = topology.source;
  if (process_group) {
    agree_over_group(*process_group, Claim{rank_, num_replicas_, seed_, true, fingerprint()}, kWho, "num_replicas");
  }
}

c10::intrusive_ptr<SamplerIteratorImpl> DistributedSamplerImpl::iter() {
  if (last_exhausted_) epoch_ = next_epoch_++;  // else: the unfinished epoch again, from its start
  last_exhausted_ = false;
  started_ = true;
  current_offset_ = resume_epoch_ == epoch_ ? resume_offset_ : 0;
  return c10::make_intrusive<SamplerIteratorImpl>(c10::intrusive_ptr<DistributedSamplerImpl>::reclaim_copy(this),
                                                  epoch_, current_offset_);
}

void DistributedSamplerImpl::set_epoch(int64_t epoch) {
  TORCH_CHECK_VALUE(epoch >= 0 && epoch <= core::kMaxEpoch, kWho, ": epoch must be in [0, 2**62], got ", epoch);
  next_epoch_ = epoch;
  epoch_ = epoch;
  last_exhausted_ = true;  // the next iteration is this epoch
}

void DistributedSamplerImpl::finished(int64_t epoch) {
  if (epoch != epoch_) return;
  last_exhausted_ = true;
  if (resume_epoch_ == epoch) resume_epoch_ = -1;
}

int64_t DistributedSamplerImpl::samples_after(int64_t offset) const {
  if (offset == 0) return num_samples_;
  // torch's layout over the plan entries not consumed yet.
  const int64_t left = std::max<int64_t>(plan_size_ - offset, 0);
  return drop_last_ && left % num_replicas_ != 0 ? left / num_replicas_ : (left + num_replicas_ - 1) / num_replicas_;
}

int64_t DistributedSamplerImpl::length() const {
  const int64_t epoch = last_exhausted_ ? next_epoch_ : epoch_;
  return samples_after(resume_epoch_ == epoch ? resume_offset_ : 0);
}

at::Tensor DistributedSamplerImpl::indices(int64_t epoch, int64_t first, int64_t count, int64_t offset) const {
  const int64_t samples = samples_after(offset);
  TORCH_CHECK_VALUE(first >= 0 && count >= 0 && first + count <= samples, kWho, ": indices [", first, ", ",
                    first + count, ") out of range [0, ", samples, ")");
  // Positions past the plan's end wrap around to its start (torch's padding).
  return strategy_->strided(num_rows_, seed_, epoch, offset + rank_ + first * num_replicas_, num_replicas_, count);
}

c10::Dict<std::string, int64_t> DistributedSamplerImpl::state_dict(int64_t consumed) const {
  TORCH_CHECK_VALUE(consumed >= 0, kWho, ".state_dict: consumed must be >= 0, got ", consumed);
  int64_t epoch = next_epoch_, offset = resume_epoch_ == next_epoch_ ? resume_offset_ : 0;
  if (started_ && !last_exhausted_) {
    const int64_t samples = samples_after(current_offset_);
    TORCH_CHECK_VALUE(consumed <= samples, kWho, ".state_dict: consumed ", consumed, " indices but this rank yields ",
                      samples, " in this epoch");
    epoch = epoch_;
    offset = current_offset_ + consumed * num_replicas_;  // every rank consumed as many (lockstep)
    if (consumed == samples || offset >= plan_size_) {
      epoch = epoch_ + 1;
      offset = 0;
    }
  }
  c10::Dict<std::string, int64_t> state;
  state.insert("version", core::kStateVersion);
  state.insert("epoch", epoch);
  state.insert("seed", seed_);
  state.insert("offset", offset);
  state.insert("num_replicas", num_replicas_);
  state.insert("rank", rank_);
  state.insert("num_rows", num_rows_);
  state.insert("plan_size", plan_size_);
  state.insert("strategy_hash", core::stable_hash(strategy_->describe()));
  return state;
}

void DistributedSamplerImpl::load_state_dict(const c10::Dict<std::string, int64_t>& state) {
  const auto entry = [&](const char* key) {
    TORCH_CHECK_VALUE(state.contains(key), kWho, ".load_state_dict: the state has no '", key,
                      "' (is it a DistributedSampler state?)");
    return state.at(key);
  };
  const std::string version_problem = core::state_version_problem(entry("version"));
  TORCH_CHECK_VALUE(version_problem.empty(), kWho, ".load_state_dict: ", version_problem);
  TORCH_CHECK_VALUE(entry("num_rows") == num_rows_, kWho, ".load_state_dict: the state was taken on a dataset of ",
                    entry("num_rows"), " rows, this one has ", num_rows_);
  TORCH_CHECK_VALUE(
      entry("strategy_hash") == core::stable_hash(strategy_->describe()) && entry("plan_size") == plan_size_, kWho,
      ".load_state_dict: the state was taken with another strategy (or shuffle setting) than this "
      "sampler's ",
      strategy_->describe());
  const int64_t epoch = entry("epoch"), offset = entry("offset");
  TORCH_CHECK_VALUE(epoch >= 0 && offset >= 0 && offset <= plan_size_, kWho,
                    ".load_state_dict: epoch must be >= 0 and offset in [0, ", plan_size_, "], got ", epoch, " and ",
                    offset);
  seed_ = entry("seed");
  set_epoch(epoch);
  resume_epoch_ = offset > 0 ? epoch : -1;
  resume_offset_ = offset;
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
  ints.insert("next_epoch", last_exhausted_ ? next_epoch_ : epoch_);
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

SamplerIteratorImpl::SamplerIteratorImpl(c10::intrusive_ptr<DistributedSamplerImpl> sampler, int64_t epoch,
                                         int64_t offset)
    : sampler_(std::move(sampler)), epoch_(epoch), offset_(offset), length_(sampler_->samples_after(offset)) {}

std::optional<at::Tensor> SamplerIteratorImpl::next(int64_t max_count) {
  TORCH_CHECK_VALUE(max_count >= 1, kWho, ": max_count must be >= 1, got ", max_count);
  const int64_t remaining = length_ - position_;
  if (remaining <= 0) {
    sampler_->finished(epoch_);
    return std::nullopt;
  }
  const int64_t count = std::min(max_count, remaining);
  at::Tensor out = sampler_->indices(epoch_, position_, count, offset_);
  position_ += count;
  return out;
}

}  // namespace torch_shards
