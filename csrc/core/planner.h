// The planner joins a bound strategy (what the epoch visits) and the epoch
// layout (who delivers which batch): it answers "which rows, in which order,
// does this worker deliver next?" for any (seed, epoch, rank, worker).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/epoch_layout.h"
#include "core/row_lists.h"
#include "core/strategy.h"

namespace torch_shards::core {

// The rows of the last fetch computed, kept by each caller: consecutive
// tail batches often come from one fetch. Its lists are the thread's kept
// ones (core/row_lists.h): a cursor an epoch, made and dropped on the thread
// that iterates, reuses the last one's memory.
struct FetchCache {
  FetchCache() : rows(take_row_list()), sorted(take_row_list()) {}
  ~FetchCache() {
    keep_row_list(std::move(rows));
    keep_row_list(std::move(sorted));
  }
  FetchCache(FetchCache&&) noexcept = default;
  FetchCache& operator=(FetchCache&&) noexcept = default;
  FetchCache(const FetchCache&) = delete;
  FetchCache& operator=(const FetchCache&) = delete;

  int64_t fetch = -1;
  std::vector<int64_t> rows;
  std::vector<int64_t> sorted;  // rows' positions in ascending row order; empty where not known
};

class Planner {
 public:
  Planner(std::shared_ptr<const SamplingPlan> plan, const LoaderOptions& options, int64_t world_size);

  const SamplingPlan& plan() const { return *plan_; }
  const EpochLayout& layout() const { return layout_; }

  // The rows of fetch f in delivery order: read in ascending order, then (for
  // shuffling strategies) permuted by a permutation keyed by (seed, epoch, f).
  // With `sorted`, a fetch so shuffled also gets the positions of its rows in
  // ascending row order (known from the shuffle: readers then need not sort
  // them again); other fetches leave it empty.
  void fetch_rows(uint64_t seed, int64_t epoch, int64_t fetch, std::vector<int64_t>& rows,
                  std::vector<int64_t>* sorted = nullptr) const;
  // The rows a unit delivers, in delivery order; with `sorted`, their
  // positions in ascending row order where the fetch's are known (else empty).
  void unit_rows(uint64_t seed, int64_t epoch, const WorkUnit& unit, FetchCache& cache, std::vector<int64_t>& rows,
                 std::vector<int64_t>* sorted = nullptr) const;

 private:
  std::shared_ptr<const SamplingPlan> plan_;
  EpochLayout layout_;
};

// Walks the units one worker delivers in one epoch, in order.
class UnitCursor {
 public:
  // The worker's units in a fresh epoch (the planner's layout).
  UnitCursor(std::shared_ptr<const Planner> planner, uint64_t seed, int64_t epoch, int64_t rank, int64_t worker,
             int64_t num_workers);
  // The worker's units in `dealing` (a resumed epoch's), after the first
  // skip_batches batches of its stream (consumed before): those are neither
  // planned nor read.
  UnitCursor(std::shared_ptr<const Planner> planner, std::shared_ptr<const Dealing> dealing, uint64_t seed,
             int64_t epoch, int64_t rank, int64_t worker, int64_t num_workers, int64_t skip_batches);

  const Planner& planner() const { return *planner_; }
  int64_t num_units() const { return num_units_; }
  int64_t position() const { return next_; }
  // Skips units already delivered (e.g. when resuming).
  void skip(int64_t units);
  // The next unit and its rows in delivery order (and, with `sorted`, their
  // positions in ascending row order where known: Planner::unit_rows); false
  // once exhausted.
  bool next(WorkUnit& unit, std::vector<int64_t>& rows, std::vector<int64_t>* sorted = nullptr);
  // The unit next() returns next, without its rows; false once exhausted.
  bool peek(WorkUnit& unit) const;

 private:
  std::shared_ptr<const Planner> planner_;
  std::shared_ptr<const Dealing> dealing_;
  uint64_t seed_;
  int64_t epoch_;
  int64_t rank_;
  int64_t worker_;
  int64_t num_workers_;
  int64_t num_units_;
  int64_t next_ = 0;
  int64_t first_offset_ = 0;  // batches of the next unit consumed before (resuming)
  FetchCache cache_;
};

}  // namespace torch_shards::core
