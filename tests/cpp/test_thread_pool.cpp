// ThreadPool: every task index runs exactly once, on the workers and the
// caller; errors come back to the caller; nested and zero-thread calls run
// inline; concurrent callers share the workers, and a caller whose workers are
// all busy with another call runs its own tasks instead of waiting; and a pool
// inherited by a forked child keeps working there.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "threads_in_process.h"

namespace torch_shards::core {
namespace {

TEST(ThreadPool, EveryIndexRunsExactlyOnceAcrossThreads) {
  ThreadPool pool(3);
  for (int64_t count : {1, 2, 7, 1000, 100000}) {
    std::vector<std::atomic<int>> runs(static_cast<size_t>(count));
    pool.parallel_for(count, [&](int64_t i) { runs[i].fetch_add(1); });
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(runs[i].load(), 1) << "index " << i << " of " << count;
  }
}

// The threads that ran 64 tasks of 2 ms each.
std::set<std::thread::id> threads_running_slow_tasks(ThreadPool& pool) {
  std::mutex mutex;
  std::set<std::thread::id> threads;
  pool.parallel_for(64, [&](int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::lock_guard<std::mutex> lock(mutex);
    threads.insert(std::this_thread::get_id());
  });
  return threads;
}

TEST(ThreadPool, WorkIsSharedWithTheWorkerThreads) {
  ThreadPool pool(3);
  const std::set<std::thread::id> threads = threads_running_slow_tasks(pool);
  EXPECT_GT(threads.size(), 1u);
  EXPECT_LE(threads.size(), 4u);  // three workers and the caller
}

TEST(ThreadPool, ZeroThreadsRunsEverythingInlineInOrder) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.num_threads(), 0);
  std::vector<int64_t> order;
  const auto caller = std::this_thread::get_id();
  pool.parallel_for(5, [&](int64_t i) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    order.push_back(i);
  });
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(ThreadPool(-2).num_threads(), 0);
}

TEST(ThreadPool, EmptyRangeRunsNothing) {
  ThreadPool pool(2);
  int runs = 0;
  pool.parallel_for(0, [&](int64_t) { ++runs; });
  pool.parallel_for(-5, [&](int64_t) { ++runs; });
  EXPECT_EQ(runs, 0);
}

TEST(ThreadPool, TaskErrorIsRethrownToTheCallerAndThePoolStaysUsable) {
  ThreadPool pool(2);
  try {
    pool.parallel_for(1000, [](int64_t i) {
      if (i % 100 == 42) throw std::runtime_error("task " + std::to_string(i) + " failed");
    });
    ADD_FAILURE() << "expected the task's exception";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("failed"), std::string::npos) << error.what();
  }
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, [&](int64_t i) { sum += i; });
  EXPECT_EQ(sum.load(), 4950);
}

TEST(ThreadPool, NestedParallelForRunsInlineWithoutDeadlock) {
  ThreadPool pool(2);
  std::atomic<int64_t> inner_runs{0};
  pool.parallel_for(8, [&](int64_t) { pool.parallel_for(10, [&](int64_t) { inner_runs.fetch_add(1); }); });
  EXPECT_EQ(inner_runs.load(), 80);
}

TEST(ThreadPool, ConcurrentCallersEachGetEveryIndexOnce) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round) pool.parallel_for(100, [&](int64_t i) { sum += i; });
    });
  }
  for (auto& caller : callers) caller.join();
  EXPECT_EQ(sum.load(), 4 * 50 * 4950);
}

TEST(ThreadPool, ConcurrentCallersShareTheWorkers) {
  // The first call holds the caller and one worker until the second is done; the two idle workers
  // must help the second call (a pool serving one call at a time left it to its caller alone).
  ThreadPool pool(3);
  std::atomic<bool> second_done{false};
  std::atomic<int> first_started{0};
  std::thread first([&] {
    pool.parallel_for(2, [&](int64_t) {
      first_started.fetch_add(1);
      while (!second_done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
  });
  while (first_started.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const std::set<std::thread::id> threads = threads_running_slow_tasks(pool);
  second_done = true;
  first.join();
  EXPECT_GT(threads.size(), 1u);
  EXPECT_LE(threads.size(), 3u);  // the caller and the two workers the first call left free
}

TEST(ThreadPool, ACallerRunsItsOwnTasksWhileAnotherHasTheWorkers) {
  ThreadPool pool(2);
  std::atomic<bool> first_started{false}, second_done{false};
  std::atomic<int> first_runs{0};
  std::thread first([&] {
    pool.parallel_for(3, [&](int64_t) {
      first_started = true;
      // Holds the workers until the second caller is done: it must not wait for them.
      while (!second_done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      first_runs.fetch_add(1);
    });
  });
  while (!first_started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto caller = std::this_thread::get_id();
  std::vector<int64_t> order;
  pool.parallel_for(5, [&](int64_t i) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    order.push_back(i);
  });
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_THROW(pool.parallel_for(4,
                                 [](int64_t i) {
                                   if (i == 2) throw std::runtime_error("inline task failed");
                                 }),
               std::runtime_error);
  second_done = true;
  first.join();
  EXPECT_EQ(first_runs.load(), 3);
}

// Regression (glibc 2.36): the child inherits the condition variables with the parent's idle
// workers registered as waiters; those threads do not exist in the child, so
// its pthread_cond_broadcast blocks forever in __condvar_quiesce_and_switch_g1
// waiting for them (about one fork in ten hung). The pool replaces its
// mutexes and condition variables (leaking the inherited ones) when it finds
// itself in a new process.
TEST(ThreadPool, PoolInheritedByAForkedChildStartsFreshThreadsThere) {
  ThreadPool pool(2);
  for (int trial = 0; trial < 50; ++trial) {
    std::atomic<int64_t> sum{0};
    pool.parallel_for(100, [&](int64_t i) { sum += i; });  // the parent's workers now wait for work
    ASSERT_EQ(sum.load(), 4950);
    const pid_t child = fork();
    if (child == 0) {
      alarm(5);  // a hang ends in SIGALRM
      for (int round = 0; round < 20; ++round) {
        std::atomic<int64_t> child_sum{0};
        pool.parallel_for(100, [&](int64_t i) { child_sum += i; });
        if (child_sum.load() != 4950) _exit(1);
      }
      _exit(0);
    }
    ASSERT_GT(child, 0);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "fork " << trial << ": " << (WIFSIGNALED(status) ? "child killed by signal " : "child exited with ")
        << (WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
  }
}

TEST(ThreadPool, ThreadsStartOnFirstUseAndAreJoinedOnDestruction) {
  // A pool built before a fork must not own threads yet.
  const int before = threads_in_process();
  {
    ThreadPool pool(4);
    EXPECT_EQ(threads_in_process(), before);
    pool.parallel_for(100, [](int64_t) {});
    EXPECT_EQ(threads_in_process(), before + 4);
    EXPECT_EQ(thread_cache_stats().busy, 4);
  }
  // Joined: the workers' loops ended, and their threads wait in the process's cache for the next pool's.
  EXPECT_EQ(thread_cache_stats().busy, 0);
  EXPECT_EQ(thread_cache_stats().idle, 4);
  {
    ThreadPool pool(4);
    pool.parallel_for(100, [](int64_t) {});
    EXPECT_EQ(threads_in_process(), before + 4);  // the same threads
  }
}

}  // namespace
}  // namespace torch_shards::core
