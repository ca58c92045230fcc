// What one iteration (one worker's part of one epoch) covers, kept by its
// iterator for checkpoints: where it stands in a resumed epoch and on which
// topology.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/resume.h"

namespace torch_shards {

struct Iteration {
  int64_t epoch = 0;
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t worker = 0;       // the DataLoader worker (0 of 1 in the process iterating in place)
  int64_t num_workers = 1;  // DataLoader workers of the rank; 1 in place
  bool in_worker = false;   // runs in a DataLoader worker process
  // Segments the epoch ran before this iteration (resume.h): empty for a fresh epoch.
  std::vector<core::ResumeSegment> prior;
  // Batches of this worker's stream consumed in this segment before this iteration (StatefulDataLoader).
  int64_t consumed_before = 0;
  // Batches the rank delivers in this segment, all its workers together.
  int64_t rank_batches = 0;
  // Batches each of the rank's workers delivers in this iteration.
  std::vector<int64_t> worker_batches;
  // An endless DataLoader loop's batches taken before this epoch (core/stream_dealing.h); none: one
  // epoch per loop.
  std::optional<int64_t> stream_start;
};

// An iteration and how many batches it delivered, kept by its dataset after
// the iterator is gone (a loop broken out of still has a position).
struct IterationProgress {
  std::shared_ptr<const Iteration> iteration;
  std::atomic<int64_t> delivered{0};
  // Until its iterator ends, is closed or is gone: len() is then this iteration's batches.
  std::atomic<bool> under_way{true};
};

}  // namespace torch_shards
