#include "core/stream_dealing.h"

#include <algorithm>
#include <utility>

#include "core/errors.h"

namespace torch_shards::core {

StreamDealing::StreamDealing(std::shared_ptr<const Dealing> base, int64_t stream_start)
    : base_(std::move(base)), stream_start_(stream_start) {
  check_argument(base_ != nullptr, "StreamDealing needs a dealing");
  check_argument(stream_start >= 0, "stream_start must be >= 0, got ", stream_start);
}

int64_t StreamDealing::worker_units(int64_t rank, int64_t worker, int64_t num_workers) const {
  return static_cast<int64_t>(units_of(rank, worker, num_workers).size());
}

WorkUnit StreamDealing::worker_unit(int64_t rank, int64_t worker, int64_t num_workers, int64_t i) const {
  return units_of(rank, worker, num_workers).at(static_cast<size_t>(i));
}

int64_t StreamDealing::worker_batches(int64_t rank, int64_t worker, int64_t num_workers) const {
  int64_t batches = 0;
  for (const WorkUnit& unit : units_of(rank, worker, num_workers)) batches += unit.num_batches;
  return batches;
}

const std::vector<WorkUnit>& StreamDealing::units_of(int64_t rank, int64_t worker, int64_t num_workers) const {
  check_argument(num_workers >= 1, "num_workers must be >= 1, got ", num_workers);
  check_argument(worker >= 0 && worker < num_workers, "worker must be in [0, num_workers=", num_workers, "), got ",
                 worker);
  check_argument(num_workers <= (int64_t{1} << 20), "num_workers=", num_workers, " is out of range");
  const int64_t key = (rank << 40) | (num_workers << 20) | worker;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = units_.find(key);
  if (found != units_.end()) return found->second;
  const int64_t count = base_->rank_units(rank);
  int64_t total = 0;
  for (int64_t u = 0; u < count; ++u) total += base_->rank_unit(rank, u).num_batches;
  // Worker v's share: the positions stream_start + j, j in [0, total), that are v modulo num_workers.
  const auto share = [&](int64_t v) {
    const int64_t first = ((v - stream_start_) % num_workers + num_workers) % num_workers;  // its first j
    return first < total ? (total - first + num_workers - 1) / num_workers : 0;
  };
  int64_t begin = 0;
  for (int64_t v = 0; v < worker; ++v) begin += share(v);
  const int64_t end = begin + share(worker);
  std::vector<WorkUnit> units;
  int64_t at = 0;  // the rank's batches before unit u
  for (int64_t u = 0; u < count && at < end; ++u) {
    const WorkUnit unit = base_->rank_unit(rank, u);
    const int64_t from = std::max(begin, at), to = std::min(end, at + unit.num_batches);
    if (from < to) {
      WorkUnit part = unit;
      part.first_batch += from - at;
      part.num_batches = to - from;
      units.push_back(part);
    }
    at += unit.num_batches;
  }
  return units_.emplace(key, std::move(units)).first->second;
}

}  // namespace torch_shards::core
