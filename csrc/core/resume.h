// Resuming an interrupted epoch, exactly once, on any topology.
//
// An epoch's global batches do not depend on the topology, and the dealing of
// them is deterministic, so the batches consumed so far follow from a few
// numbers: the topologies the epoch ran on, in order, and how many batches
// each rank's loop consumed on each (the segments). Global batch g is batch
// g % fetch_factor of fetch g / fetch_factor.
//
// A rank's loop consumes its workers' batches in DataLoader's order: one from
// each worker in turn, skipping workers that have none left (in-process
// iteration is one worker). So the consumed batches of a segment are a prefix
// of every worker's stream of units.
//
// Resuming on the topology of the last segment continues every worker's
// stream after what it delivered (exactly the batches an uninterrupted epoch
// would have delivered next). With the same ranks but another number of
// workers, every rank keeps what it had left and deals it to its new workers.
// With another number of ranks, the batches not consumed yet are dealt (in
// global order, by contiguous ranges, so reads stay local) evenly to the new
// ranks, then their workers, and the ranks are evened as even_batches says.
// Padding batches, being repeats, are never counted as consumed: their
// originals stay to be delivered. So how many batches a rank delivers from
// here on never depends on its number of workers.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/dealing.h"
#include "core/epoch_layout.h"

namespace torch_shards::core {

// The version of the checkpoints the dataset and the sampler write: 2 since
// epochs of up to 2**16 blocks visit them in uniformly drawn orders
// (KeyedPermutation), not in a Feistel network's.
constexpr int64_t kStateVersion = 2;
// Why a state of `version` cannot be resumed here; empty when it can.
std::string state_version_problem(int64_t version);

struct ResumeSegment {
  int64_t world_size = 1;
  int64_t num_workers = 1;        // DataLoader workers per rank; 1 for in-process iteration
  std::vector<int64_t> consumed;  // batches each rank consumed: one value (ranks in lockstep) or one per rank

  int64_t consumed_by(int64_t rank) const;
  bool same_topology(int64_t world, int64_t workers) const { return world_size == world && num_workers == workers; }
};

// How a DataLoader's loop that consumed `consumed` batches of one rank took
// them from its workers, which had worker_batches[w] batches each: one from
// each worker in turn, skipping exhausted workers. Throws InvalidArgument if
// consumed exceeds their sum.
std::vector<int64_t> split_among_workers(const std::vector<int64_t>& worker_batches, int64_t consumed);

// A set of global batches: sorted, disjoint, non-empty [begin, end) ranges.
class BatchSet {
 public:
  static BatchSet all(int64_t count);
  // Removes the given ranges (any order, may overlap).
  void remove(std::vector<std::pair<int64_t, int64_t>> ranges);
  int64_t size() const { return size_; }
  const std::vector<std::pair<int64_t, int64_t>>& ranges() const { return ranges_; }

 private:
  std::vector<std::pair<int64_t, int64_t>> ranges_;
  int64_t size_ = 0;
};

// The remaining batches of an epoch dealt to a new topology: rank r gets the
// r-th of world_size contiguous, near-equal ranges of the set (in global
// order), cut into units at fetch boundaries; even_batches then pads short
// ranks with a repeat of the first remaining batch, or drops the surplus
// batch of long ranks.
class RemainingLayout : public Dealing {
 public:
  RemainingLayout(BatchSet remaining, int64_t fetch_factor, int64_t world_size, EvenBatches even_batches);

  int64_t world_size() const override { return world_size_; }
  int64_t rank_batches(int64_t rank) const override;
  int64_t rank_units(int64_t rank) const override { return static_cast<int64_t>(units_of(rank).size()); }
  WorkUnit rank_unit(int64_t rank, int64_t unit) const override { return units_of(rank).at(unit); }

 private:
  // Computed when first asked for (a process needs its own rank's).
  const std::vector<WorkUnit>& units_of(int64_t rank) const;

  BatchSet remaining_;
  int64_t fetch_factor_;
  int64_t world_size_;
  EvenBatches even_batches_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<int64_t, std::vector<WorkUnit>> units_;
};

// What every rank of an earlier dealing had left (its workers' streams after
// what they delivered), each rank's units dealt again to a new number of
// workers. Units are in global order.
class RankRemainingLayout : public Dealing {
 public:
  // skips[rank][worker]: batches at the head of each worker's stream in `base` already delivered.
  RankRemainingLayout(std::shared_ptr<const Dealing> base, int64_t num_workers,
                      std::vector<std::vector<int64_t>> skips);

  int64_t world_size() const override { return base_->world_size(); }
  int64_t rank_batches(int64_t rank) const override;
  int64_t rank_units(int64_t rank) const override { return static_cast<int64_t>(units_of(rank).size()); }
  WorkUnit rank_unit(int64_t rank, int64_t unit) const override { return units_of(rank).at(unit); }

 private:
  const std::vector<WorkUnit>& units_of(int64_t rank) const;

  std::shared_ptr<const Dealing> base_;
  int64_t num_workers_;
  std::vector<std::vector<int64_t>> skips_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<int64_t, std::vector<WorkUnit>> units_;
};

// What a resumed epoch deals, on the topology resuming it.
class Resumption {
 public:
  // The epoch of `plan_size` entries cut as `options` say; segments: as
  // saved (the first one ran the fresh epoch on its topology);
  // (world_size, num_workers): the topology resuming now.
  Resumption(int64_t plan_size, const LoaderOptions& options, const std::vector<ResumeSegment>& segments,
             int64_t world_size, int64_t num_workers);
  Resumption(const EpochLayout& layout, const std::vector<ResumeSegment>& segments, int64_t world_size,
             int64_t num_workers)
      : Resumption(layout.plan_size(), layout.options(), segments, world_size, num_workers) {}

  // The dealing the resumed segment continues or starts.
  const Dealing& dealing() const { return *dealing_; }
  // Batches at the head of a worker's stream in dealing() that were consumed before.
  int64_t skip(int64_t rank, int64_t worker) const;
  // Batches a rank, and one of its workers, deliver from here on.
  int64_t rank_batches(int64_t rank) const;
  int64_t worker_batches(int64_t rank, int64_t worker) const;
  // Global batches not consumed yet, padding aside.
  int64_t remaining() const { return remaining_.size(); }
  // The segments with consecutive ones on one topology merged wherever one
  // segment leaves every worker where they did (always with one worker per
  // rank, and a segment that consumed nothing): resumed from, they deal what
  // the segments do. Each interruption of an epoch adds a segment, and a
  // state's segments share a bounded region with DataLoader workers.
  const std::vector<ResumeSegment>& compacted_segments() const { return compacted_; }

 private:
  std::shared_ptr<const EpochLayout> fresh_;  // the epoch on the first segment's topology
  int64_t world_size_, num_workers_;
  BatchSet remaining_;
  std::shared_ptr<const Dealing> dealing_;
  std::vector<std::vector<int64_t>> skips_;  // [rank][worker]; empty: nothing to skip
  std::vector<ResumeSegment> compacted_;
};

}  // namespace torch_shards::core
