#include "shared_state.h"

#include "errors.h"

namespace torch_shards::core {

void shared_state_init(int64_t* words) {
  epoch_state_init(words);
  for (int64_t i = kDeliveryOffset; i < kSharedStateWords; ++i) __atomic_store_n(words + i, 0, __ATOMIC_RELEASE);
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
  for (int64_t i = 0; i < 2 * kDeliverySlots; ++i)
    out[i] = __atomic_load_n(words + kDeliveryOffset + i, __ATOMIC_RELAXED);
}

}  // namespace torch_shards::core
