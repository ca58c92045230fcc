#include "core/planner.h"

#include <algorithm>
#include <utility>

#include "core/errors.h"
#include "core/radix_sort.h"
#include "core/random.h"

namespace torch_shards::core {

Planner::Planner(std::shared_ptr<const SamplingPlan> plan, const LoaderOptions& options, int64_t world_size)
    : plan_(std::move(plan)), layout_(plan_->size(), options, world_size) {}

void Planner::fetch_rows(uint64_t seed, int64_t epoch, int64_t fetch, std::vector<int64_t>& rows,
                         std::vector<int64_t>* sorted) const {
  const int64_t count = layout_.fetch_rows(fetch);
  rows.resize(static_cast<size_t>(count));
  if (sorted != nullptr) sorted->clear();
  plan_->fill(seed, epoch, layout_.fetch_begin(fetch), count, rows.data());
  if (!plan_->shuffles_within_fetch()) return;
  thread_local std::vector<int64_t> scratch;
  sort_rows(rows, scratch);
  // Fisher-Yates on a stream keyed by (seed, epoch, fetch): identical on every platform.
  SplitMixStream stream(derive_key(seed, epoch, Purpose::kFetchShuffle, static_cast<uint64_t>(fetch)));
  if (sorted == nullptr) {
    for (int64_t i = count - 1; i > 0; --i) {
      const int64_t j = stream.bounded(static_cast<uint32_t>(i + 1));
      std::swap(rows[i], rows[j]);
    }
    return;
  }
  // The same swaps on the sorted rows' ranks (scratch): position p then holds
  // the rank of its row, so p is the rank-th position in row order.
  scratch.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) scratch[i] = i;
  for (int64_t i = count - 1; i > 0; --i) {
    const int64_t j = stream.bounded(static_cast<uint32_t>(i + 1));
    std::swap(scratch[i], scratch[j]);
  }
  sorted->resize(static_cast<size_t>(count));
  std::vector<int64_t>& ranks = scratch;
  for (int64_t p = 0; p < count; ++p) (*sorted)[ranks[p]] = p;
  for (int64_t p = 0; p < count; ++p) ranks[p] = rows[ranks[p]];  // the sorted rows, shuffled
  rows.swap(ranks);
}

void Planner::unit_rows(uint64_t seed, int64_t epoch, const WorkUnit& unit, FetchCache& cache,
                        std::vector<int64_t>& rows, std::vector<int64_t>* sorted) const {
  if (unit.fetch != cache.fetch) {
    cache.fetch = -1;  // until it holds the fetch (fetch_rows may throw)
    fetch_rows(seed, epoch, unit.fetch, cache.rows, &cache.sorted);
    cache.fetch = unit.fetch;
  }
  const int64_t begin = unit.first_batch * layout_.batch_size();
  const int64_t end =
      std::min<int64_t>(begin + unit.num_batches * layout_.batch_size(), static_cast<int64_t>(cache.rows.size()));
  rows.assign(cache.rows.begin() + begin, cache.rows.begin() + end);
  if (sorted != nullptr) positions_within(cache.sorted, begin, end, *sorted);
}

UnitCursor::UnitCursor(std::shared_ptr<const Planner> planner, uint64_t seed, int64_t epoch, int64_t rank,
                       int64_t worker, int64_t num_workers)
    : UnitCursor(planner, std::shared_ptr<const Dealing>(planner, &planner->layout()), seed, epoch, rank, worker,
                 num_workers, 0) {}

UnitCursor::UnitCursor(std::shared_ptr<const Planner> planner, std::shared_ptr<const Dealing> dealing, uint64_t seed,
                       int64_t epoch, int64_t rank, int64_t worker, int64_t num_workers, int64_t skip_batches)
    : planner_(std::move(planner)),
      dealing_(std::move(dealing)),
      seed_(seed),
      epoch_(epoch),
      rank_(rank),
      worker_(worker),
      num_workers_(num_workers) {
  const int64_t world_size = dealing_->world_size();
  check_argument(rank >= 0 && rank < world_size, "rank must be in [0, world_size=", world_size, "), got ", rank);
  check_argument(num_workers >= 1, "num_workers must be >= 1, got ", num_workers);
  check_argument(worker >= 0 && worker < num_workers, "worker must be in [0, num_workers=", num_workers, "), got ",
                 worker);
  check_argument(skip_batches >= 0, "cannot skip a negative number of batches, got ", skip_batches);
  num_units_ = dealing_->worker_units(rank, worker, num_workers);
  // Whole units consumed before are passed over; a partly consumed one starts after its consumed batches.
  while (skip_batches > 0 && next_ < num_units_) {
    const int64_t batches = dealing_->worker_unit(rank_, worker_, num_workers_, next_).num_batches;
    if (skip_batches < batches) {
      first_offset_ = skip_batches;
      break;
    }
    skip_batches -= batches;
    ++next_;
  }
  check_argument(next_ < num_units_ || skip_batches == 0, "worker ", worker, " of rank ", rank,
                 " cannot skip more batches than it delivers");
}

void UnitCursor::skip(int64_t units) {
  check_argument(units >= 0, "cannot skip a negative number of units, got ", units);
  next_ = std::min(num_units_, next_ + units);
  if (units > 0) first_offset_ = 0;
}

bool UnitCursor::peek(WorkUnit& unit) const {
  if (next_ >= num_units_) return false;
  unit = dealing_->worker_unit(rank_, worker_, num_workers_, next_);
  unit.first_batch += first_offset_;
  unit.num_batches -= first_offset_;
  return true;
}

bool UnitCursor::next(WorkUnit& unit, std::vector<int64_t>& rows, std::vector<int64_t>* sorted) {
  if (!peek(unit)) return false;
  ++next_;
  first_offset_ = 0;
  planner_->unit_rows(seed_, epoch_, unit, cache_, rows, sorted);
  return true;
}

}  // namespace torch_shards::core
