#include "planner.h"

#include <algorithm>
#include <utility>

#include "errors.h"
#include "radix_sort.h"
#include "random.h"

namespace torch_shards::core {

Planner::Planner(std::shared_ptr<const SamplingPlan> plan, const LoaderOptions& options, int64_t world_size)
    : plan_(std::move(plan)), layout_(plan_->size(), options, world_size) {}

void Planner::fetch_rows(uint64_t seed, int64_t epoch, int64_t fetch, std::vector<int64_t>& rows) const {
  const int64_t count = layout_.fetch_rows(fetch);
  rows.resize(static_cast<size_t>(count));
  plan_->fill(seed, epoch, layout_.fetch_begin(fetch), count, rows.data());
  if (!plan_->shuffles_within_fetch()) return;
  thread_local std::vector<int64_t> scratch;
  sort_rows(rows, scratch);
  // Fisher-Yates on a stream keyed by (seed, epoch, fetch): identical on every platform.
  SplitMixStream stream(derive_key(seed, epoch, Purpose::kFetchShuffle, static_cast<uint64_t>(fetch)));
  for (int64_t i = count - 1; i > 0; --i) {
    const int64_t j = stream.bounded(static_cast<uint32_t>(i + 1));
    std::swap(rows[i], rows[j]);
  }
}

void Planner::unit_rows(uint64_t seed, int64_t epoch, const WorkUnit& unit, FetchCache& cache,
                        std::vector<int64_t>& rows) const {
  if (unit.fetch != cache.fetch) {
    fetch_rows(seed, epoch, unit.fetch, cache.rows);
    cache.fetch = unit.fetch;
  }
  const int64_t begin = unit.first_batch * layout_.batch_size();
  const int64_t end =
      std::min<int64_t>(begin + unit.num_batches * layout_.batch_size(), static_cast<int64_t>(cache.rows.size()));
  rows.assign(cache.rows.begin() + begin, cache.rows.begin() + end);
}

UnitCursor::UnitCursor(std::shared_ptr<const Planner> planner, uint64_t seed, int64_t epoch, int64_t rank,
                       int64_t worker, int64_t num_workers)
    : planner_(std::move(planner)),
      seed_(seed),
      epoch_(epoch),
      rank_(rank),
      worker_(worker),
      num_workers_(num_workers) {
  const int64_t world_size = planner_->layout().world_size();
  check_argument(rank >= 0 && rank < world_size, "rank must be in [0, world_size=", world_size, "), got ", rank);
  check_argument(num_workers >= 1, "num_workers must be >= 1, got ", num_workers);
  check_argument(worker >= 0 && worker < num_workers, "worker must be in [0, num_workers=", num_workers, "), got ",
                 worker);
  num_units_ = planner_->layout().worker_units(rank, worker, num_workers);
}

void UnitCursor::skip(int64_t units) {
  check_argument(units >= 0, "cannot skip a negative number of units, got ", units);
  next_ = std::min(num_units_, next_ + units);
}

bool UnitCursor::next(WorkUnit& unit, std::vector<int64_t>& rows) {
  if (next_ >= num_units_) return false;
  unit = planner_->layout().worker_unit(rank_, worker_, num_workers_, next_++);
  planner_->unit_rows(seed_, epoch_, unit, cache_, rows);
  return true;
}

}  // namespace torch_shards::core
