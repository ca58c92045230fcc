// run_waiting_tasks: every task runs exactly once; the tasks wait at the same
// time (a rendezvous that every task must reach before any may leave, which
// tasks run one after another would never complete: bounded, so a failure is
// a failed test, not a hang), also from inside a ThreadPool task, where a
// pool runs nested calls inline; the first error comes back once every
// thread is joined; and more tasks than threads share them.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "core/waiting_tasks.h"

namespace torch_shards::core {
namespace {

// Every task of `count` arrives, then waits (at most 10 s) for all to have arrived. Returns how many
// tasks saw everyone arrive.
int rendezvous(int64_t count) {
  std::mutex mutex;
  std::condition_variable all_here;
  int64_t arrived = 0;
  std::atomic<int> met{0};
  run_waiting_tasks(count, [&](int64_t) {
    std::unique_lock<std::mutex> lock(mutex);
    if (++arrived == count) all_here.notify_all();
    if (all_here.wait_for(lock, std::chrono::seconds(10), [&] { return arrived == count; })) met.fetch_add(1);
  });
  return met.load();
}

TEST(WaitingTasks, EveryIndexRunsExactlyOnce) {
  for (int64_t count : {0, 1, 2, 5, 33, 200}) {
    std::vector<std::atomic<int>> runs(static_cast<size_t>(count));
    run_waiting_tasks(count, [&](int64_t i) { runs[static_cast<size_t>(i)].fetch_add(1); });
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(runs[static_cast<size_t>(i)].load(), 1) << i << " of " << count;
  }
}

TEST(WaitingTasks, TasksWaitAtTheSameTime) {
  EXPECT_EQ(rendezvous(2), 2);
  EXPECT_EQ(rendezvous(kMaxWaitingThreads + 1), kMaxWaitingThreads + 1);
}

TEST(WaitingTasks, ConcurrentInsideAPoolTask) {
  // A pool runs a nested parallel_for inline: waiting tasks still wait together.
  ThreadPool pool(1);
  std::atomic<int> met{0};
  pool.parallel_for(2, [&](int64_t) { met.fetch_add(rendezvous(3)); });
  EXPECT_EQ(met.load(), 6);
}

TEST(WaitingTasks, MoreTasksThanThreadsShareThem) {
  std::mutex mutex;
  std::set<std::thread::id> threads;
  run_waiting_tasks(4 * kMaxWaitingThreads, [&](int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard<std::mutex> lock(mutex);
    threads.insert(std::this_thread::get_id());
  });
  EXPECT_LE(static_cast<int64_t>(threads.size()), kMaxWaitingThreads + 1);
  EXPECT_GT(threads.size(), 1u);
}

TEST(WaitingTasks, FirstErrorComesBackAfterEveryTaskEnded) {
  std::atomic<int> running{0}, ended{0};
  try {
    run_waiting_tasks(8, [&](int64_t i) {
      running.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      running.fetch_sub(1);
      ended.fetch_add(1);
      if (i == 3) throw std::runtime_error("task 3 failed");
    });
    FAIL() << "no exception";
  } catch (const std::runtime_error& error) {
    EXPECT_STREQ(error.what(), "task 3 failed");
  }
  EXPECT_EQ(running.load(), 0);  // no task still running once the call returned
  EXPECT_GE(ended.load(), 4);
}

}  // namespace
}  // namespace torch_shards::core
