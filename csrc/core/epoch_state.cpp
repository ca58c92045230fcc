#include "core/epoch_state.h"

#include <errno.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "core/errors.h"

namespace torch_shards::core {
namespace {

constexpr int64_t kMagic = 0x5348524453455054;  // "SHRDSEPT"
enum Word : int64_t { kMagicWord = 0, kLock = 1, kNext = 2, kLast = 3, kStamp = 4, kTable = 8 };
// The mask records which worker ids claimed under an entry's name (bit w of
// word w / 64), up to kMaxWorkers workers.
constexpr int64_t kMaskWords = 4;
enum Field : int64_t { kSeed = 0, kIteration, kWorkers, kEpoch, kEntryStamp, kMask, kFields = kMask + kMaskWords };
constexpr int64_t kSlots = (kEpochStateWords - kTable) / kFields;
static_assert(kSlots >= 8, "the epoch state needs room for recent generations");

int64_t load(const int64_t* word) { return __atomic_load_n(word, __ATOMIC_ACQUIRE); }
void store(int64_t* word, int64_t value) { __atomic_store_n(word, value, __ATOMIC_RELEASE); }

// Whether process `pid` has ended: gone, or a zombie. A DataLoader worker
// killed (SIGKILL) stays a zombie until its parent, the main process, reaps
// it; kill(pid, 0) still finds it, and a main process waiting for the lock
// the worker held would never reap it.
bool process_ended(pid_t pid) {
  if (kill(pid, 0) == -1) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  std::FILE* file = std::fopen(path, "r");
  if (file == nullptr) return errno == ENOENT;
  char text[512];
  const size_t length = std::fread(text, 1, sizeof(text) - 1, file);
  std::fclose(file);
  text[length] = '\0';
  // "pid (comm) state ...": comm may hold spaces and parentheses, so the state follows the last ')'.
  const char* close = std::strrchr(text, ')');
  return close != nullptr && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

// A spin lock in shared memory holding the owner's pid. The critical sections
// are a few dozen instructions; if an owner died inside one (kill -9), its
// lock is taken over instead of hanging every other process.
class StateLock {
 public:
  explicit StateLock(int64_t* state) : word_(state + kLock) {
    const int64_t self = static_cast<int64_t>(getpid());
    for (int64_t spins = 0;; ++spins) {
      int64_t expected = 0;
      if (__atomic_compare_exchange_n(word_, &expected, self, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) return;
      if (spins % 1024 == 1023) {
        if (expected != self && process_ended(static_cast<pid_t>(expected)) &&
            __atomic_compare_exchange_n(word_, &expected, self, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
          return;
        }
        const timespec pause{0, 100000};
        nanosleep(&pause, nullptr);
      }
    }
  }
  ~StateLock() { __atomic_store_n(word_, 0, __ATOMIC_RELEASE); }
  StateLock(const StateLock&) = delete;
  StateLock& operator=(const StateLock&) = delete;

 private:
  int64_t* word_;
};

void check_initialised(const int64_t* state) {
  if (load(state + kMagicWord) != kMagic) {
    throw InvalidArgument("epoch state is not initialised (was it created by torch_shards?)");
  }
}

int64_t claim_next(int64_t* state) {
  const int64_t epoch = load(state + kNext);
  store(state + kNext, epoch + 1);
  store(state + kLast, epoch);
  return epoch;
}

}  // namespace

void epoch_state_init(int64_t* state) {
  for (int64_t i = 0; i < kEpochStateWords; ++i) store(state + i, 0);
  store(state + kLast, -1);
  store(state + kMagicWord, kMagic);
}

void epoch_state_set_next(int64_t* state, int64_t epoch) {
  check_initialised(state);
  check_argument(epoch >= 0, "epoch must be >= 0, got ", epoch);
  StateLock lock(state);
  store(state + kNext, epoch);
}

int64_t epoch_state_next(const int64_t* state) {
  check_initialised(state);
  return load(state + kNext);
}

int64_t epoch_state_last(const int64_t* state) {
  check_initialised(state);
  return load(state + kLast);
}

int64_t epoch_state_claim_main(int64_t* state) {
  check_initialised(state);
  StateLock lock(state);
  return claim_next(state);
}

void epoch_state_resume(int64_t* state, int64_t epoch) {
  check_initialised(state);
  check_argument(epoch >= 0, "epoch must be >= 0, got ", epoch);
  StateLock lock(state);
  if (load(state + kNext) <= epoch) store(state + kNext, epoch + 1);
  store(state + kLast, epoch);
}

int64_t epoch_state_claim_worker(int64_t* state, int64_t generation_seed, int64_t local_iteration, int64_t num_workers,
                                 int64_t worker_id) {
  check_initialised(state);
  check_argument(num_workers >= 1 && worker_id >= 0 && worker_id < num_workers, "worker id ", worker_id,
                 " out of range for ", num_workers, " workers");
  check_argument(num_workers <= kMaxWorkers, "at most ", kMaxWorkers, " DataLoader workers are supported, got ",
                 num_workers);
  const int64_t word = kMask + worker_id / 64;
  const uint64_t bit = uint64_t{1} << (worker_id % 64);
  StateLock lock(state);
  // Reuse the entry of this generation's name, else an empty (stamp 0) or the oldest entry.
  int64_t* victim = nullptr;
  for (int64_t slot = 0; slot < kSlots; ++slot) {
    int64_t* entry = state + kTable + slot * kFields;
    if (entry[kEntryStamp] != 0 && entry[kSeed] == generation_seed && entry[kIteration] == local_iteration &&
        entry[kWorkers] == num_workers) {
      if ((static_cast<uint64_t>(entry[word]) & bit) == 0) {
        entry[word] = static_cast<int64_t>(static_cast<uint64_t>(entry[word]) | bit);
        return entry[kEpoch];
      }
      victim = entry;  // this worker already took part: a new generation under the same name
      break;
    }
    if (victim == nullptr || entry[kEntryStamp] < victim[kEntryStamp]) victim = entry;
  }
  const int64_t epoch = claim_next(state);
  victim[kSeed] = generation_seed;
  victim[kIteration] = local_iteration;
  victim[kWorkers] = num_workers;
  victim[kEpoch] = epoch;
  for (int64_t w = 0; w < kMaskWords; ++w) victim[kMask + w] = 0;
  victim[word] = static_cast<int64_t>(bit);
  victim[kEntryStamp] = ++state[kStamp];
  return epoch;
}

}  // namespace torch_shards::core
