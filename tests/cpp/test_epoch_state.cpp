// Shared epoch numbering: main-process claims, pinning, and the generations of
// DataLoader workers, in one process and across forked processes that share
// the state through MAP_SHARED memory (as the shared-memory tensor does).
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/epoch_state.h"
#include "core/errors.h"

namespace torch_shards::core {
namespace {

class EpochState : public ::testing::Test {
 protected:
  void SetUp() override { epoch_state_init(state_.data()); }
  int64_t* state() { return state_.data(); }
  int64_t claim(int64_t seed, int64_t iteration, int64_t workers, int64_t worker) {
    return epoch_state_claim_worker(state(), seed, iteration, workers, worker);
  }

  std::vector<int64_t> state_ = std::vector<int64_t>(kEpochStateWords, 0);
};

TEST_F(EpochState, FreshStateStartsAtEpochZeroWithNoneClaimed) {
  EXPECT_EQ(epoch_state_next(state()), 0);
  EXPECT_EQ(epoch_state_last(state()), -1);
}

TEST_F(EpochState, MainClaimsCountUpFromZero) {
  for (int64_t epoch = 0; epoch < 5; ++epoch) {
    EXPECT_EQ(epoch_state_claim_main(state()), epoch);
    EXPECT_EQ(epoch_state_last(state()), epoch);
    EXPECT_EQ(epoch_state_next(state()), epoch + 1);
  }
}

TEST_F(EpochState, SetNextPinsTheNextClaimAndCountingContinuesFromThere) {
  epoch_state_claim_main(state());
  epoch_state_set_next(state(), 10);
  EXPECT_EQ(epoch_state_next(state()), 10);
  EXPECT_EQ(epoch_state_last(state()), 0);  // pinning claims nothing
  EXPECT_EQ(epoch_state_claim_main(state()), 10);
  EXPECT_EQ(epoch_state_claim_main(state()), 11);
  epoch_state_set_next(state(), 3);  // backwards too, e.g. to replay an epoch
  EXPECT_EQ(claim(99, 0, 2, 1), 3);
  EXPECT_EQ(claim(99, 0, 2, 0), 3);
  EXPECT_EQ(epoch_state_claim_main(state()), 4);
}

TEST_F(EpochState, SetNextRefusesNegativeEpochs) {
  try {
    epoch_state_set_next(state(), -1);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("epoch must be >= 0, got -1"), std::string::npos) << error.what();
  }
  EXPECT_EQ(epoch_state_next(state()), 0);
}

TEST(EpochStateInit, UninitialisedStateIsRefusedByEveryOperation) {
  std::vector<int64_t> zeroed(kEpochStateWords, 0);
  std::vector<int64_t> garbage(kEpochStateWords, 0x1234);
  for (std::vector<int64_t>* words : {&zeroed, &garbage}) {
    int64_t* state = words->data();
    EXPECT_THROW(epoch_state_claim_main(state), InvalidArgument);
    EXPECT_THROW(epoch_state_claim_worker(state, 1, 0, 2, 0), InvalidArgument);
    EXPECT_THROW(epoch_state_set_next(state, 3), InvalidArgument);
    EXPECT_THROW(epoch_state_next(state), InvalidArgument);
    EXPECT_THROW(epoch_state_last(state), InvalidArgument);
  }
  try {
    epoch_state_claim_main(zeroed.data());
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("not initialised"), std::string::npos) << error.what();
  }
}

TEST_F(EpochState, WorkersOfOneGenerationShareOneEpochInAnyOrder) {
  epoch_state_set_next(state(), 7);
  for (int64_t worker : {2, 0, 3, 1}) EXPECT_EQ(claim(555, 0, 4, worker), 7) << "worker " << worker;
  EXPECT_EQ(epoch_state_last(state()), 7);
  EXPECT_EQ(epoch_state_next(state()), 8);
}

TEST_F(EpochState, NextLocalIterationOrNewSeedStartsTheNextEpoch) {
  for (int64_t worker = 0; worker < 3; ++worker) EXPECT_EQ(claim(42, 0, 3, worker), 0);
  // Persistent workers: same base seed, next local iteration.
  for (int64_t worker = 0; worker < 3; ++worker) EXPECT_EQ(claim(42, 1, 3, worker), 1);
  // Non-persistent workers: a new base seed, iteration 0 again.
  for (int64_t worker : {1, 2, 0}) EXPECT_EQ(claim(43, 0, 3, worker), 2);
}

TEST_F(EpochState, WorkerIdSeenTwiceUnderOneNameClaimsANewEpoch) {
  // A DataLoader re-created with a fixed generator repeats the name: the
  // second generation must not replay the first one's epoch.
  EXPECT_EQ(claim(9, 0, 2, 0), 0);
  EXPECT_EQ(claim(9, 0, 2, 1), 0);
  EXPECT_EQ(claim(9, 0, 2, 1), 1);
  EXPECT_EQ(claim(9, 0, 2, 0), 1);  // joins the new generation
  EXPECT_EQ(claim(9, 0, 2, 0), 2);
}

TEST_F(EpochState, NewWorkerCountStartsANewGeneration) {
  EXPECT_EQ(claim(9, 0, 2, 0), 0);
  EXPECT_EQ(claim(9, 0, 3, 1), 1);
  EXPECT_EQ(claim(9, 0, 2, 1), 0);
  EXPECT_EQ(claim(9, 0, 3, 0), 1);
  EXPECT_EQ(claim(9, 0, 3, 2), 1);
}

TEST_F(EpochState, InterleavedGenerationsKeepTheirOwnEpochs) {
  // A fast persistent worker may start the next iteration before a slow one
  // has started the current one.
  EXPECT_EQ(claim(5, 0, 3, 0), 0);
  EXPECT_EQ(claim(5, 1, 3, 0), 1);
  EXPECT_EQ(claim(5, 0, 3, 1), 0);
  EXPECT_EQ(claim(5, 2, 3, 0), 2);
  EXPECT_EQ(claim(5, 1, 3, 1), 1);
  EXPECT_EQ(claim(5, 0, 3, 2), 0);
  EXPECT_EQ(claim(5, 1, 3, 2), 1);
  EXPECT_EQ(claim(5, 2, 3, 2), 2);
  EXPECT_EQ(claim(5, 2, 3, 1), 2);
}

TEST_F(EpochState, MainAndWorkerClaimsDrawFromOneCounter) {
  EXPECT_EQ(epoch_state_claim_main(state()), 0);
  EXPECT_EQ(claim(1, 0, 2, 0), 1);
  EXPECT_EQ(epoch_state_claim_main(state()), 2);
  EXPECT_EQ(claim(1, 0, 2, 1), 1);
  EXPECT_EQ(epoch_state_last(state()), 2);  // joining a generation claims nothing new
  EXPECT_EQ(claim(1, 1, 2, 1), 3);
}

TEST_F(EpochState, RecentGenerationsAreRememberedAfterManyOthers) {
  // 40 generations with only worker 0 started; the table is bounded, but the
  // most recent generations must still be joined by their other workers.
  for (int64_t iteration = 0; iteration < 40; ++iteration) EXPECT_EQ(claim(77, iteration, 2, 0), iteration);
  for (int64_t iteration = 30; iteration < 40; ++iteration) {
    EXPECT_EQ(claim(77, iteration, 2, 1), iteration) << "iteration " << iteration;
  }
  EXPECT_EQ(epoch_state_next(state()), 40);
}

// Every worker id has a bit in the generation's mask: a re-created generation
// whose first claim comes from a high worker id still claims a new epoch.
TEST_F(EpochState, WorkerIdAbove62SeenTwiceClaimsANewEpochLikeAnyOther) {
  for (int64_t worker = 0; worker < 64; ++worker) ASSERT_EQ(claim(7, 0, 64, worker), 0);
  // The same name again: a DataLoader re-created with a fixed generator.
  const int64_t first = claim(7, 0, 64, 63);
  EXPECT_EQ(first, 1) << "worker 63 silently reused the previous generation's epoch";
  EXPECT_EQ(claim(7, 0, 64, 0), first) << "one generation split over two epochs";
}

TEST_F(EpochState, MoreWorkersThanTheMaskHoldsAreRefusedClearly) {
  for (int64_t worker = 0; worker < kMaxWorkers; ++worker) ASSERT_EQ(claim(9, 0, kMaxWorkers, worker), 0);
  EXPECT_EQ(claim(9, 0, kMaxWorkers, kMaxWorkers - 1), 1);
  try {
    claim(9, 0, kMaxWorkers + 1, 0);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("at most 256 DataLoader workers"), std::string::npos) << error.what();
  }
}

TEST_F(EpochState, WorkerIdOutsideTheWorkerCountIsRefused) {
  EXPECT_THROW(claim(1, 0, 4, 4), InvalidArgument);
  EXPECT_THROW(claim(1, 0, 4, -1), InvalidArgument);
  EXPECT_THROW(claim(1, 0, 0, 0), InvalidArgument);
  try {
    claim(1, 0, 2, 5);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("worker id 5"), std::string::npos) << error.what();
  }
  EXPECT_EQ(epoch_state_next(state()), 0);  // nothing claimed
}

// --- Across processes -------------------------------------------------------

constexpr int kWorkers = 8;
constexpr int kRounds = 200;

// The state and what the children report, in one MAP_SHARED mapping.
struct SharedRegion {
  int64_t state[kEpochStateWords];
  int64_t released;
  int64_t reported;
  int64_t epochs[kRounds][kWorkers];
};

class SharedMapping {
 public:
  SharedMapping() {
    void* memory = mmap(nullptr, sizeof(SharedRegion), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    region_ = memory == MAP_FAILED ? nullptr : static_cast<SharedRegion*>(memory);
  }
  ~SharedMapping() {
    if (region_ != nullptr) munmap(region_, sizeof(SharedRegion));
  }
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;
  SharedRegion* get() const { return region_; }

 private:
  SharedRegion* region_;
};

int64_t load(const int64_t* word) { return __atomic_load_n(word, __ATOMIC_ACQUIRE); }
void store(int64_t* word, int64_t value) { __atomic_store_n(word, value, __ATOMIC_RELEASE); }

// Forks `count` children running body(i); body's return value is the exit
// status. A child stuck for 30 s dies of SIGALRM.
template <typename Body>
std::vector<pid_t> fork_children(int count, Body body) {
  std::vector<pid_t> children;
  for (int i = 0; i < count; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(30);
      int status = 3;
      try {
        status = body(i);
      } catch (...) {
        status = 2;
      }
      _exit(status);
    }
    EXPECT_GT(pid, 0) << "fork failed: " << std::strerror(errno);
    if (pid > 0) children.push_back(pid);
  }
  return children;
}

void expect_children_succeed(const std::vector<pid_t>& children) {
  for (pid_t child : children) {
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "child " << child << (WIFSIGNALED(status) ? " killed by signal " : " exited with ")
        << (WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
  }
}

TEST(EpochStateAcrossProcesses, ForkedWorkersOfOneGenerationClaimOneEpochAndTheNextGenerationTheNext) {
  SharedMapping mapping;
  SharedRegion* shared = mapping.get();
  ASSERT_NE(shared, nullptr);
  epoch_state_init(shared->state);
  epoch_state_set_next(shared->state, 5);
  // Like non-persistent DataLoader workers: new processes for each generation,
  // released together to contend for the lock.
  for (int64_t iteration = 0; iteration < 2; ++iteration) {
    store(&shared->released, 0);
    const auto children = fork_children(kWorkers, [&](int worker) {
      while (load(&shared->released) == 0) sched_yield();
      shared->epochs[iteration][worker] = epoch_state_claim_worker(shared->state, 1234, iteration, kWorkers, worker);
      return 0;
    });
    store(&shared->released, 1);
    expect_children_succeed(children);
    for (int worker = 0; worker < kWorkers; ++worker) {
      EXPECT_EQ(shared->epochs[iteration][worker], 5 + iteration) << "iteration " << iteration << " worker " << worker;
    }
  }
  EXPECT_EQ(epoch_state_next(shared->state), 7);
  EXPECT_EQ(epoch_state_last(shared->state), 6);
}

TEST(EpochStateAcrossProcesses, PersistentWorkerProcessesAgreeOnEveryGeneration) {
  SharedMapping mapping;
  SharedRegion* shared = mapping.get();
  ASSERT_NE(shared, nullptr);
  epoch_state_init(shared->state);
  // The same processes claim generation after generation. A round starts the
  // moment the last worker reports the previous one, so every round's first
  // claims race each other.
  const auto children = fork_children(kWorkers, [&](int worker) {
    for (int64_t round = 0; round < kRounds; ++round) {
      while (load(&shared->reported) < round * kWorkers) sched_yield();
      shared->epochs[round][worker] = epoch_state_claim_worker(shared->state, 99, round, kWorkers, worker);
      __atomic_fetch_add(&shared->reported, 1, __ATOMIC_ACQ_REL);
    }
    return 0;
  });
  expect_children_succeed(children);
  for (int64_t round = 0; round < kRounds; ++round) {
    for (int worker = 0; worker < kWorkers; ++worker) {
      EXPECT_EQ(shared->epochs[round][worker], round) << "round " << round << " worker " << worker;
    }
  }
  EXPECT_EQ(epoch_state_next(shared->state), kRounds);
}

TEST(EpochStateAcrossProcesses, LockLeftByAKilledProcessIsTakenOver) {
  SharedMapping mapping;
  SharedRegion* shared = mapping.get();
  ASSERT_NE(shared, nullptr);
  epoch_state_init(shared->state);
  // A process that dies: its pid is free once reaped.
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  int status = 0;
  ASSERT_EQ(waitpid(dead, &status, 0), dead);
  // Word 1 holds the pid of the lock's owner; pretend the dead process held it.
  store(&shared->state[1], dead);
  // Claim in a child so that a lock that is never taken over ends in SIGALRM, not a hung test.
  const auto children = fork_children(1, [&](int) { return epoch_state_claim_main(shared->state) == 0 ? 0 : 1; });
  expect_children_succeed(children);
  EXPECT_EQ(epoch_state_next(shared->state), 1);
  EXPECT_EQ(load(&shared->state[1]), 0) << "the lock was not released";
}

TEST(EpochStateAcrossProcesses, LockLeftByAKilledChildNotYetReapedIsTakenOver) {
  // A DataLoader worker SIGKILLed inside the lock stays a zombie until the main process reaps it; the main
  // process waiting for that lock never did (kill(pid, 0) still finds a zombie): it waited forever.
  SharedMapping mapping;
  SharedRegion* shared = mapping.get();
  ASSERT_NE(shared, nullptr);
  epoch_state_init(shared->state);
  const auto children = fork_children(1, [&](int) {
    const pid_t worker = fork();
    if (worker == 0) {
      store(&shared->state[1], getpid());  // word 1: the lock's owner (it dies holding it)
      raise(SIGKILL);
    }
    while (load(&shared->state[1]) != worker) sched_yield();
    // Not reaped: a zombie of this process, which now needs the lock.
    const int64_t epoch = epoch_state_claim_main(shared->state);
    return epoch == 0 && load(&shared->state[1]) == 0 ? 0 : 1;
  });
  expect_children_succeed(children);
  EXPECT_EQ(epoch_state_next(shared->state), 1);
}

}  // namespace
}  // namespace torch_shards::core
