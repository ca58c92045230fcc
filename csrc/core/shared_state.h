// The words one dataset shares with all its DataLoader workers (a small
// shared-memory int64 array): the epoch state (epoch_state.h), then the
// batches and rows each worker delivered, which the main process reads to
// monitor workers it cannot see.
#pragma once

#include <cstdint>

#include "epoch_state.h"

namespace torch_shards::core {

constexpr int64_t kDeliverySlots = kMaxWorkers + 1;  // DataLoader workers 0..255, then the process iterating in place
constexpr int64_t kMainSlot = kMaxWorkers;
constexpr int64_t kDeliveryOffset = kEpochStateWords;
constexpr int64_t kSharedStateWords = kDeliveryOffset + 2 * kDeliverySlots;

// Called once on a new array.
void shared_state_init(int64_t* words);
// Throws InvalidArgument unless `words` (of `size` words) was made by shared_state_init.
void check_shared_state(const int64_t* words, int64_t size);
// One batch of `rows` rows delivered by `slot`.
void count_delivery(int64_t* words, int64_t slot, int64_t rows);
// Batches (out[2 * slot]) and rows (out[2 * slot + 1]) delivered per slot.
void delivery_counts(const int64_t* words, int64_t* out);

}  // namespace torch_shards::core
