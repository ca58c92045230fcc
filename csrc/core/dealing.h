// Who delivers which batches of an epoch: each rank's units (runs of
// consecutive global batches of one fetch), dealt round-robin to the rank's
// DataLoader workers. A fresh epoch deals by EpochLayout (the distribution
// contract); a resumed one deals what is left of it (resume.h).
#pragma once

#include <cstdint>

namespace torch_shards::core {

// A run of consecutive global batches of one fetch, delivered by one worker.
struct WorkUnit {
  int64_t fetch = 0;
  int64_t first_batch = 0;  // within the fetch
  int64_t num_batches = 0;
  bool padding = false;  // a repeat of a batch another rank delivers (even_batches="pad")
};

class Dealing {
 public:
  virtual ~Dealing() = default;

  virtual int64_t world_size() const = 0;
  // Batches rank r delivers (after even_batches), and its units in order.
  virtual int64_t rank_batches(int64_t rank) const = 0;
  virtual int64_t rank_units(int64_t rank) const = 0;
  virtual WorkUnit rank_unit(int64_t rank, int64_t unit) const = 0;

  // Worker w of K takes units w, w + K, w + 2K, ... of its rank (StreamDealing
  // deals otherwise).
  virtual int64_t worker_units(int64_t rank, int64_t worker, int64_t num_workers) const {
    const int64_t units = rank_units(rank);
    return worker < units ? (units - worker + num_workers - 1) / num_workers : 0;
  }
  virtual WorkUnit worker_unit(int64_t rank, int64_t worker, int64_t num_workers, int64_t i) const {
    return rank_unit(rank, worker + i * num_workers);
  }
  virtual int64_t worker_batches(int64_t rank, int64_t worker, int64_t num_workers) const {
    int64_t batches = 0;
    for (int64_t i = 0, units = worker_units(rank, worker, num_workers); i < units; ++i) {
      batches += worker_unit(rank, worker, num_workers, i).num_batches;
    }
    return batches;
  }
};

}  // namespace torch_shards::core
