// A rank's batches dealt to its DataLoader workers for an endless loop
// (cycle=True): epoch after epoch in one DataLoader iteration.
//
// DataLoader takes one batch from each worker in turn, and in an endless loop
// no worker is ever done, so the loop's j-th batch comes from worker j % K.
// Dealt round-robin by units, workers would hold unequal shares of an epoch:
// the one with fewer batches would run into the next epochs while the others
// were still in this one, and each epoch's run of the loop would repeat some
// rows and miss others. Here, the epoch's part of the loop starting at
// position `stream_start`, worker w gets exactly the batches DataLoader will
// take from it in that part: as many as positions stream_start + j (j over
// the rank's batches) with (stream_start + j) % K == w. Each worker's share
// is a contiguous run of the rank's batches (in the base dealing's order),
// cut into units where the base's units end, so a fetch is split between two
// workers only where their runs meet.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/dealing.h"

namespace torch_shards::core {

class StreamDealing : public Dealing {
 public:
  // The loop has taken stream_start batches (all workers together) before
  // this part; base: the rank's batches of this part, in order.
  StreamDealing(std::shared_ptr<const Dealing> base, int64_t stream_start);

  int64_t world_size() const override { return base_->world_size(); }
  int64_t rank_batches(int64_t rank) const override { return base_->rank_batches(rank); }
  int64_t rank_units(int64_t rank) const override { return base_->rank_units(rank); }
  WorkUnit rank_unit(int64_t rank, int64_t unit) const override { return base_->rank_unit(rank, unit); }

  int64_t worker_units(int64_t rank, int64_t worker, int64_t num_workers) const override;
  WorkUnit worker_unit(int64_t rank, int64_t worker, int64_t num_workers, int64_t i) const override;
  int64_t worker_batches(int64_t rank, int64_t worker, int64_t num_workers) const override;

 private:
  // Computed when first asked for (a worker needs its own).
  const std::vector<WorkUnit>& units_of(int64_t rank, int64_t worker, int64_t num_workers) const;

  std::shared_ptr<const Dealing> base_;
  int64_t stream_start_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<int64_t, std::vector<WorkUnit>> units_;  // key: (rank, worker, num_workers)
};

}  // namespace torch_shards::core
