// The words one dataset shares with all its DataLoader workers (a small
// shared-memory int64 array): the epoch state (epoch_state.h); the batches
// and rows each worker delivered, which the main process reads to monitor
// workers it cannot see; the workers of the last iteration; the seed; and a
// resume record, so that load_state_dict in the main process reaches workers
// forked or spawned later and persistent ones alike.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/epoch_state.h"
#include "core/resume.h"

namespace torch_shards::core {

constexpr int64_t kDeliverySlots = kMaxWorkers + 1;  // DataLoader workers 0..255, then the process iterating in place
constexpr int64_t kMainSlot = kMaxWorkers;
constexpr int64_t kDeliveryOffset = kEpochStateWords;
constexpr int64_t kLastWorkersWord = kDeliveryOffset + 2 * kDeliverySlots;
constexpr int64_t kSeedWord = kLastWorkersWord + 1;
constexpr int64_t kAgreedWord = kSeedWord + 1;          // 1: every rank uses this seed
constexpr int64_t kSynchronizedWord = kAgreedWord + 1;  // 1: the ranks checked their claims over a process group
constexpr int64_t kResumeOffset = kSynchronizedWord + 1;
constexpr int64_t kResumeWords = 4096;
// Where DataLoader workers that restored their own states (StatefulDataLoader) resumed: the epoch (+1; 0:
// none), their number, then each one's batches consumed before.
constexpr int64_t kRestoredOffset = kResumeOffset + kResumeWords;
constexpr int64_t kRestoredWords = 2 + kMaxWorkers;
constexpr int64_t kSharedStateWords = kRestoredOffset + kRestoredWords;

// Called once on a new array.
void shared_state_init(int64_t* words);
// Throws InvalidArgument unless `words` (of `size` words) was made by shared_state_init.
void check_shared_state(const int64_t* words, int64_t size);
// One batch of `rows` rows delivered by `slot`.
void count_delivery(int64_t* words, int64_t slot, int64_t rows);
// Batches (out[2 * slot]) and rows (out[2 * slot + 1]) delivered per slot.
void delivery_counts(const int64_t* words, int64_t* out);

// Who ran the last iteration: 0 for the process iterating in place, else its number of DataLoader workers.
void set_last_workers(int64_t* words, int64_t num_workers);
int64_t last_workers(const int64_t* words);

// The dataset's seed, for every process reading it (a checkpoint may change it).
void set_shared_seed(int64_t* words, int64_t seed);
int64_t shared_seed(const int64_t* words);
// Flags shared with the workers (kAgreedWord, kSynchronizedWord).
void set_flag(int64_t* words, int64_t word, bool value);
bool flag(const int64_t* words, int64_t word);

// An epoch to resume: the segments it ran (resume.h).
struct ResumeRecord {
  int64_t epoch = 0;
  std::vector<ResumeSegment> segments;
};
// Stores the record (nullopt clears it); throws InvalidArgument if it does not fit.
void store_resume_record(int64_t* words, const std::optional<ResumeRecord>& record);
std::optional<ResumeRecord> load_resume_record(const int64_t* words);

// DataLoader workers restoring their own states (torchdata's StatefulDataLoader hands each worker its
// state; the main process sees none of them): each records the batches it had delivered of `epoch`,
// resumed by `num_workers` workers, so that the main process knows where the epoch resumed (its loop
// then counts the batches it takes from there).
void record_worker_restored(int64_t* words, int64_t epoch, int64_t num_workers, int64_t worker, int64_t consumed);
void clear_workers_restored(int64_t* words);
// The batches each of `num_workers` workers had delivered of `epoch` when they restored their states,
// or nullopt if they did not (or not all of them recorded it).
std::optional<std::vector<int64_t>> workers_restored(const int64_t* words, int64_t epoch, int64_t num_workers);

}  // namespace torch_shards::core
