// Epoch numbering shared by every process that iterates one dataset: the
// main process and its DataLoader workers (fork, spawn or forkserver,
// persistent or not). The state is a small int64 array in shared memory; the
// Python layer allocates it as a shared-memory tensor, which follows the
// dataset into worker processes.
//
// Each new iteration of the dataset claims an epoch:
// - in the main process (num_workers=0 or direct iteration): the next epoch;
// - in a DataLoader worker: the epoch of its *generation*, the set of K
//   workers started by one iteration of the DataLoader. A generation is named
//   by what all its workers see alike: DataLoader's base seed for the
//   iterator mixed with where its worker processes start in the parent's
//   count of processes (the Python door's _generation_name: the base seed
//   alone is the user's to fix, and two iterators could share it), how many
//   iterations this worker process has started (persistent
//   workers keep the base seed across epochs) and K. The first worker of a
//   generation claims the next epoch; the others join it. A worker id seen
//   twice under one name means a new generation (e.g. a DataLoader re-created
//   with a fixed generator), so it claims a new epoch rather than reuse one.
#pragma once

#include <cstdint>

namespace torch_shards::core {

constexpr int64_t kEpochStateWords = 128;
constexpr int64_t kMaxWorkers = 256;

// Called once on a zeroed array.
void epoch_state_init(int64_t* state);
// Pins the epoch the next iteration claims; counting continues from there.
void epoch_state_set_next(int64_t* state, int64_t epoch);
int64_t epoch_state_next(const int64_t* state);
// The epoch most recently claimed, or -1 if none.
int64_t epoch_state_last(const int64_t* state);
int64_t epoch_state_claim_main(int64_t* state);
// An iteration resuming `epoch` (restored from a checkpoint): it is the last
// started, and the next claim is a later one.
void epoch_state_resume(int64_t* state, int64_t epoch);
int64_t epoch_state_claim_worker(int64_t* state, int64_t generation_seed, int64_t local_iteration, int64_t num_workers,
                                 int64_t worker_id);

}  // namespace torch_shards::core
