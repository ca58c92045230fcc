#include "core/shared_state.h"

#include <sched.h>

#include "core/errors.h"

namespace torch_shards::core {
namespace {

int64_t load(const int64_t* word) { return __atomic_load_n(word, __ATOMIC_ACQUIRE); }
void store(int64_t* word, int64_t value) { __atomic_store_n(word, value, __ATOMIC_RELEASE); }

// The resume record: a version word (odd while it is written), then
// [present, epoch, segments, then per segment: world_size, num_workers,
// counts, counts x consumed].
enum ResumeWord : int64_t { kVersion = 0, kPresent, kEpoch, kSegments, kFirstSegment };

}  // namespace

void shared_state_init(int64_t* words) {
  epoch_state_init(words);
  for (int64_t i = kDeliveryOffset; i < kSharedStateWords; ++i) store(words + i, 0);
}

void check_shared_state(const int64_t* words, int64_t size) {
  check_argument(size == kSharedStateWords, "shared state must have ", kSharedStateWords, " words, got ", size);
  epoch_state_last(words);  // throws if the epoch state is not initialised
}

void count_delivery(int64_t* words, int64_t slot, int64_t rows) {
  check_argument(slot >= 0 && slot < kDeliverySlots, "delivery slot must be in [0, ", kDeliverySlots, "), got ", slot);
  __atomic_fetch_add(words + kDeliveryOffset + 2 * slot, 1, __ATOMIC_RELAXED);
  __atomic_fetch_add(words + kDeliveryOffset + 2 * slot + 1, rows, __ATOMIC_RELAXED);
}

void delivery_counts(const int64_t* words, int64_t* out) {
  for (int64_t i = 0; i < 2 * kDeliverySlots; ++i) out[i] = load(words + kDeliveryOffset + i);
}

void set_last_workers(int64_t* words, int64_t num_workers) { store(words + kLastWorkersWord, num_workers); }

int64_t last_workers(const int64_t* words) { return load(words + kLastWorkersWord); }

void set_shared_seed(int64_t* words, int64_t seed) { store(words + kSeedWord, seed); }

int64_t shared_seed(const int64_t* words) { return load(words + kSeedWord); }

void set_flag(int64_t* words, int64_t word, bool value) { store(words + word, value ? 1 : 0); }

bool flag(const int64_t* words, int64_t word) { return load(words + word) != 0; }

void store_resume_record(int64_t* words, const std::optional<ResumeRecord>& record) {
  int64_t* region = words + kResumeOffset;
  std::vector<int64_t> body{record.has_value(), record ? record->epoch : 0,
                            record ? static_cast<int64_t>(record->segments.size()) : 0};
  if (record) {
    for (const ResumeSegment& segment : record->segments) {
      body.insert(body.end(), {segment.world_size, segment.num_workers, static_cast<int64_t>(segment.consumed.size())});
      body.insert(body.end(), segment.consumed.begin(), segment.consumed.end());
    }
  }
  check_argument(static_cast<int64_t>(body.size()) < kResumeWords, "a resume state of ", body.size(),
                 " words does not fit the ", kResumeWords - 1, " words datasets share with their workers: its ",
                 record ? record->segments.size() : 0,
                 " segments (one per interruption of the epoch; those on one topology merge where the workers' "
                 "order allows) are too many");
  const int64_t version = load(region + kVersion);
  store(region + kVersion, version + 1);  // odd: being written
  for (size_t i = 0; i < body.size(); ++i) store(region + kPresent + static_cast<int64_t>(i), body[i]);
  store(region + kVersion, version + 2);
}

std::optional<ResumeRecord> load_resume_record(const int64_t* words) {
  const int64_t* region = words + kResumeOffset;
  for (;;) {
    const int64_t version = load(region + kVersion);
    if (version % 2 != 0) {
      sched_yield();
      continue;
    }
    std::optional<ResumeRecord> record;
    if (load(region + kPresent) != 0) {
      record.emplace();
      record->epoch = load(region + kEpoch);
      const int64_t segments = load(region + kSegments);
      int64_t at = kFirstSegment;
      for (int64_t s = 0; s < segments && at + 3 <= kResumeWords; ++s) {
        ResumeSegment segment;
        segment.world_size = load(region + at);
        segment.num_workers = load(region + at + 1);
        const int64_t counts = load(region + at + 2);
        at += 3;
        for (int64_t c = 0; c < counts && at < kResumeWords; ++c) segment.consumed.push_back(load(region + at++));
        record->segments.push_back(std::move(segment));
      }
    }
    if (load(region + kVersion) == version) return record;
  }
}

namespace {
enum RestoredWord : int64_t { kRestoredEpoch = 0, kRestoredWorkers, kRestoredConsumed };
}  // namespace

void record_worker_restored(int64_t* words, int64_t epoch, int64_t num_workers, int64_t worker, int64_t consumed) {
  check_argument(num_workers >= 1 && num_workers <= kMaxWorkers && worker >= 0 && worker < num_workers, "worker ",
                 worker, " of ", num_workers, " out of range");
  int64_t* region = words + kRestoredOffset;
  // Every worker of one restore writes the same epoch and number; a slot is written by its worker only
  // (consumed + 1: 0 means not recorded).
  store(region + kRestoredEpoch, epoch + 1);
  store(region + kRestoredWorkers, num_workers);
  store(region + kRestoredConsumed + worker, consumed + 1);
}

void clear_workers_restored(int64_t* words) {
  for (int64_t i = 0; i < kRestoredWords; ++i) store(words + kRestoredOffset + i, 0);
}

std::optional<std::vector<int64_t>> workers_restored(const int64_t* words, int64_t epoch, int64_t num_workers) {
  const int64_t* region = words + kRestoredOffset;
  if (load(region + kRestoredEpoch) != epoch + 1 || load(region + kRestoredWorkers) != num_workers) return std::nullopt;
  std::vector<int64_t> consumed;
  for (int64_t w = 0; w < num_workers; ++w) {
    const int64_t value = load(region + kRestoredConsumed + w);
    if (value == 0) return std::nullopt;
    consumed.push_back(value - 1);
  }
  return consumed;
}

}  // namespace torch_shards::core
