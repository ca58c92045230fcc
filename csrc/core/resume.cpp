#include "core/resume.h"

#include "core/epoch_state.h"

#include <algorithm>
#include <tuple>

#include "core/errors.h"

namespace torch_shards::core {

int64_t ResumeSegment::consumed_by(int64_t rank) const {
  check_argument(consumed.size() == 1 || static_cast<int64_t>(consumed.size()) == world_size,
                 "a resume segment needs one consumed count (ranks in lockstep) or one per rank (", world_size,
                 "), got ", consumed.size());
  return consumed.size() == 1 ? consumed[0] : consumed[static_cast<size_t>(rank)];
}

std::string state_version_problem(int64_t version) {
  if (version == kStateVersion) return "";
  if (version == 1) {
    return "the state was written by an earlier torch_shards (state version 1), which visited shuffled blocks in "
           "other orders: resuming its epoch here would repeat some rows and skip others. Resume it with the version "
           "that wrote it, or start this version at the next epoch";
  }
  return concat("unknown state version ", version, " (this torch_shards reads version ", kStateVersion, ")");
}

std::vector<int64_t> split_among_workers(const std::vector<int64_t>& worker_batches, int64_t consumed) {
  int64_t total = 0, longest = 0;
  for (int64_t batches : worker_batches) {
    total += batches;
    longest = std::max(longest, batches);
  }
  check_argument(consumed >= 0 && consumed <= total, "consumed batches must be in [0, ", total, "], got ", consumed);
  const auto taken_in = [&](int64_t rounds) {
    int64_t taken = 0;
    for (int64_t batches : worker_batches) taken += std::min(batches, rounds);
    return taken;
  };
  // The most full rounds (one batch from every worker with any left) within `consumed`.
  int64_t low = 0, high = longest;
  while (low < high) {
    const int64_t middle = low + (high - low + 1) / 2;
    if (taken_in(middle) <= consumed) {
      low = middle;
    } else {
      high = middle - 1;
    }
  }
  std::vector<int64_t> out;
  int64_t rest = consumed - taken_in(low);
  for (int64_t batches : worker_batches) {
    int64_t taken = std::min(batches, low);
    if (rest > 0 && batches > low) {
      ++taken;
      --rest;
    }
    out.push_back(taken);
  }
  return out;
}

BatchSet BatchSet::all(int64_t count) {
  BatchSet set;
  if (count > 0) set.ranges_.emplace_back(0, count);
  set.size_ = std::max<int64_t>(count, 0);
  return set;
}

void BatchSet::remove(std::vector<std::pair<int64_t, int64_t>> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<int64_t, int64_t>> kept;
  size_t next = 0;  // first removal range that may still overlap
  for (auto [begin, end] : ranges_) {
    while (next < ranges.size() && ranges[next].second <= begin) ++next;
    for (size_t r = next; r < ranges.size() && ranges[r].first < end; ++r) {
      if (ranges[r].first > begin) kept.emplace_back(begin, ranges[r].first);
      begin = std::max(begin, ranges[r].second);
      if (begin >= end) break;
    }
    if (begin < end) kept.emplace_back(begin, end);
  }
  ranges_ = std::move(kept);
  size_ = 0;
  for (const auto& [begin, end] : ranges_) size_ += end - begin;
}

RemainingLayout::RemainingLayout(BatchSet remaining, int64_t fetch_factor, int64_t world_size, EvenBatches even_batches)
    : remaining_(std::move(remaining)),
      fetch_factor_(fetch_factor),
      world_size_(world_size),
      even_batches_(even_batches) {
  check_argument(world_size >= 1, "world_size must be >= 1, got ", world_size);
  check_argument(fetch_factor >= 1, "fetch_factor must be >= 1, got ", fetch_factor);
}

int64_t RemainingLayout::rank_batches(int64_t rank) const {
  const int64_t total = remaining_.size(), share = total / world_size_, extra = total % world_size_;
  switch (even_batches_) {
    case EvenBatches::kPad:
      return share + (extra > 0 ? 1 : 0);
    case EvenBatches::kDrop:
      return share;
    case EvenBatches::kNone:
      return share + (rank < extra ? 1 : 0);
  }
  return 0;
}

const std::vector<WorkUnit>& RemainingLayout::units_of(int64_t rank) const {
  check_argument(rank >= 0 && rank < world_size_, "rank must be in [0, world_size=", world_size_, "), got ", rank);
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = units_.find(rank);
  if (found != units_.end()) return found->second;
  const int64_t total = remaining_.size(), share = total / world_size_, extra = total % world_size_;
  const int64_t first = rank * share + std::min(rank, extra);
  int64_t count = share + (rank < extra ? 1 : 0);
  if (even_batches_ == EvenBatches::kDrop) count = share;  // the surplus batch of a long rank is dropped
  std::vector<WorkUnit> units;
  int64_t skip = first;
  for (auto [begin, end] : remaining_.ranges()) {
    if (count == 0) break;
    if (skip >= end - begin) {
      skip -= end - begin;
      continue;
    }
    begin += skip;
    skip = 0;
    while (begin < end && count > 0) {
      // A unit: consecutive batches of one fetch.
      const int64_t fetch = begin / fetch_factor_, fetch_end = (fetch + 1) * fetch_factor_;
      const int64_t take = std::min({end, fetch_end, begin + count}) - begin;
      units.push_back(WorkUnit{fetch, begin - fetch * fetch_factor_, take, false});
      begin += take;
      count -= take;
    }
  }
  if (even_batches_ == EvenBatches::kPad && extra > 0 && rank >= extra) {
    const int64_t repeat = remaining_.ranges().front().first;  // the first remaining batch
    units.push_back(WorkUnit{repeat / fetch_factor_, repeat % fetch_factor_, 1, true});
  }
  return units_.emplace(rank, std::move(units)).first->second;
}

RankRemainingLayout::RankRemainingLayout(std::shared_ptr<const Dealing> base, int64_t num_workers,
                                         std::vector<std::vector<int64_t>> skips)
    : base_(std::move(base)), num_workers_(num_workers), skips_(std::move(skips)) {}

int64_t RankRemainingLayout::rank_batches(int64_t rank) const {
  int64_t batches = 0;
  for (const WorkUnit& unit : units_of(rank)) batches += unit.num_batches;
  return batches;
}

const std::vector<WorkUnit>& RankRemainingLayout::units_of(int64_t rank) const {
  check_argument(rank >= 0 && rank < world_size(), "rank must be in [0, world_size=", world_size(), "), got ", rank);
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = units_.find(rank);
  if (found != units_.end()) return found->second;
  std::vector<WorkUnit> units;
  for (int64_t w = 0; w < num_workers_; ++w) {
    int64_t skip = skips_[rank][w];
    for (int64_t i = 0, count = base_->worker_units(rank, w, num_workers_); i < count; ++i) {
      WorkUnit unit = base_->worker_unit(rank, w, num_workers_, i);
      const int64_t passed = std::min(skip, unit.num_batches);
      skip -= passed;
      unit.first_batch += passed;
      unit.num_batches -= passed;
      if (unit.num_batches > 0) units.push_back(unit);
    }
  }
  std::stable_sort(units.begin(), units.end(), [](const WorkUnit& a, const WorkUnit& b) {
    return std::tie(a.padding, a.fetch, a.first_batch) < std::tie(b.padding, b.fetch, b.first_batch);
  });  // padding last, as in every dealing
  return units_.emplace(rank, std::move(units)).first->second;
}

namespace {

using Skips = std::vector<std::vector<int64_t>>;  // [rank][worker]: batches delivered from each worker's stream

// The real batches (padding aside) at the head of every worker's stream.
std::vector<std::pair<int64_t, int64_t>> delivered_batches(const Dealing& dealing, int64_t num_workers,
                                                           const Skips& skips, int64_t fetch_factor) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t rank = 0; rank < dealing.world_size(); ++rank) {
    for (int64_t w = 0; w < num_workers; ++w) {
      int64_t left = skips[rank][w];
      for (int64_t i = 0; left > 0; ++i) {
        const WorkUnit unit = dealing.worker_unit(rank, w, num_workers, i);
        const int64_t take = std::min(left, unit.num_batches);
        const int64_t first = unit.fetch * fetch_factor + unit.first_batch;
        if (!unit.padding) out.emplace_back(first, first + take);
        left -= take;
      }
    }
  }
  return out;
}

// A segment of `consumed` per rank; one count when every rank consumed as many.
ResumeSegment lockstep_segment(int64_t world_size, int64_t num_workers, std::vector<int64_t> consumed) {
  if (std::all_of(consumed.begin(), consumed.end(), [&](int64_t count) { return count == consumed.front(); })) {
    consumed.resize(1);
  }
  return ResumeSegment{world_size, num_workers, std::move(consumed)};
}

}  // namespace

Resumption::Resumption(int64_t plan_size, const LoaderOptions& options, const std::vector<ResumeSegment>& segments,
                       int64_t world_size, int64_t num_workers)
    : fresh_(std::make_shared<const EpochLayout>(plan_size, options,
                                                 segments.empty() ? world_size : segments.front().world_size)),
      world_size_(world_size),
      num_workers_(num_workers),
      remaining_(BatchSet::all(fresh_->num_global_batches())) {
  check_argument(world_size >= 1, "world_size must be >= 1, got ", world_size);
  check_argument(num_workers >= 1, "num_workers must be >= 1, got ", num_workers);
  const int64_t fetch_factor = options.fetch_factor;
  // The dealing that follows a run on (world, workers) that left `skips`, for the next topology.
  const auto next_dealing = [&](const std::shared_ptr<const Dealing>& base, int64_t world, int64_t workers,
                                const Skips& skips, int64_t next_world) -> std::shared_ptr<const Dealing> {
    if (base && world == next_world) return std::make_shared<RankRemainingLayout>(base, workers, skips);
    return std::make_shared<RemainingLayout>(remaining_, fetch_factor, next_world, options.even_batches);
  };
  std::shared_ptr<const Dealing> base = fresh_;  // the fresh epoch's dealing
  int64_t world = 0, workers = 0;
  Skips skips;
  for (size_t start = 0; start < segments.size();) {
    // A run: consecutive segments on one topology, continuing one dealing.
    const int64_t run_world = segments[start].world_size, run_workers = segments[start].num_workers;
    check_argument(run_world >= 1 && run_world <= kMaxWorldSize && run_workers >= 1 && run_workers <= kMaxWorkers,
                   "a resume segment needs world_size in [1, 2**20] and num_workers in [1, 256], got ", run_world,
                   " and ", run_workers);
    if (start > 0) base = next_dealing(base, world, workers, skips, run_world);
    world = run_world;
    workers = run_workers;
    skips.assign(static_cast<size_t>(world), std::vector<int64_t>(static_cast<size_t>(workers), 0));
    // The run's segments merged where one segment leaves every worker where
    // the two did: `merged` consumed per rank from the workers' places at
    // its start (`merged_from`).
    std::vector<int64_t> merged;
    Skips merged_from;
    size_t end = start;
    for (; end < segments.size() && segments[end].same_topology(world, workers); ++end) {
      const Skips before = skips;
      bool mergeable = end > start;
      for (int64_t rank = 0; rank < world; ++rank) {
        std::vector<int64_t> left(static_cast<size_t>(workers));
        int64_t available = 0;
        for (int64_t w = 0; w < workers; ++w) {
          left[w] = base->worker_batches(rank, w, workers) - skips[rank][w];
          available += left[w];
        }
        const int64_t consumed = segments[end].consumed_by(rank);
        check_argument(consumed >= 0 && consumed <= available, "rank ", rank, " of ", world, " consumed ", consumed,
                       " batches, but had only ", available, " left in that part of the epoch");
        const std::vector<int64_t> taken = split_among_workers(left, consumed);
        for (int64_t w = 0; w < workers; ++w) skips[rank][w] += taken[w];
        if (!mergeable || consumed == 0) continue;
        // One loop consuming both from the merged segment's start: the same batches from every worker?
        std::vector<int64_t> from_start(static_cast<size_t>(workers));
        for (int64_t w = 0; w < workers; ++w)
          from_start[w] = base->worker_batches(rank, w, workers) - merged_from[rank][w];
        const std::vector<int64_t> both = split_among_workers(from_start, merged[rank] + consumed);
        for (int64_t w = 0; w < workers && mergeable; ++w) mergeable = both[w] == skips[rank][w] - merged_from[rank][w];
      }
      if (!mergeable) {
        if (!merged.empty()) compacted_.push_back(lockstep_segment(world, workers, merged));
        merged.assign(static_cast<size_t>(world), 0);
        merged_from = before;
      }
      for (int64_t rank = 0; rank < world; ++rank) merged[rank] += segments[end].consumed_by(rank);
    }
    compacted_.push_back(lockstep_segment(world, workers, merged));
    remaining_.remove(delivered_batches(*base, workers, skips, fetch_factor));
    start = end;
  }
  if (segments.empty()) {
    dealing_ = base;
  } else if (world == world_size && workers == num_workers) {
    dealing_ = base;  // the same topology: every worker goes on with its own stream
    skips_ = std::move(skips);
  } else {
    dealing_ = next_dealing(base, world, workers, skips, world_size);
  }
}

int64_t Resumption::skip(int64_t rank, int64_t worker) const {
  check_argument(rank >= 0 && rank < world_size_ && worker >= 0 && worker < num_workers_, "rank ", rank, " or worker ",
                 worker, " out of range for ", world_size_, " ranks of ", num_workers_, " workers");
  return skips_.empty() ? 0 : skips_[rank][worker];
}

int64_t Resumption::worker_batches(int64_t rank, int64_t worker) const {
  return dealing_->worker_batches(rank, worker, num_workers_) - skip(rank, worker);
}

int64_t Resumption::rank_batches(int64_t rank) const {
  int64_t batches = 0;
  for (int64_t w = 0; w < num_workers_; ++w) batches += worker_batches(rank, w);
  return batches;
}

}  // namespace torch_shards::core
