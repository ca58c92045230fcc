// CachedThread: a task runs on a thread an ended task left, or on a new one
// when none waits (so tasks that wait for each other never deadlock); join()
// rethrows what the task threw; a thread with no task for the idle timeout
// exits; a forked child starts its own threads.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/thread_cache.h"
#include "threads_in_process.h"

namespace torch_shards::core {
namespace {

// Whether `done` holds within 5 s.
bool soon(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(ThreadCache, ATaskRunsOnTheThreadAnEndedTaskLeft) {
  std::thread::id first, second;
  CachedThread one([&] { first = std::this_thread::get_id(); });
  one.join();  // its thread is back in the cache by then
  EXPECT_EQ(thread_cache_stats().busy, 0);
  EXPECT_EQ(thread_cache_stats().idle, 1);
  const int threads = threads_in_process();
  CachedThread two([&] { second = std::this_thread::get_id(); });
  two.join();
  EXPECT_EQ(first, second);
  EXPECT_NE(first, std::this_thread::get_id());
  EXPECT_EQ(threads_in_process(), threads);
}

TEST(ThreadCache, TasksThatWaitForEachOtherEachGetAThread) {
  // None idle: each task gets a new thread, so eight tasks that all wait for the last one to start end.
  std::atomic<int> started{0};
  std::vector<std::unique_ptr<CachedThread>> tasks;
  for (int i = 0; i < 8; ++i) {
    tasks.push_back(std::make_unique<CachedThread>([&] {
      ++started;
      while (started.load() < 8) std::this_thread::yield();
    }));
  }
  for (auto& task : tasks) task->join();
  EXPECT_EQ(started.load(), 8);
  EXPECT_EQ(thread_cache_stats().busy, 0);
  EXPECT_EQ(thread_cache_stats().idle, 8);
}

TEST(ThreadCache, JoinRethrowsWhatTheTaskThrewAndTheThreadIsKept) {
  CachedThread failing([] { throw std::runtime_error("task failed"); });
  EXPECT_THROW(failing.join(), std::runtime_error);
  failing.join();  // once: joined already
  EXPECT_EQ(thread_cache_stats().idle, 1);
  bool ran = false;
  CachedThread next([&] { ran = true; });
  next.join();
  EXPECT_TRUE(ran);
}

TEST(ThreadCache, TheDestructorWaitsForTheTask) {
  std::atomic<bool> finished{false};
  {
    CachedThread task([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      finished = true;
    });
  }
  EXPECT_TRUE(finished.load());
}

TEST(ThreadCache, AThreadWithNoTaskForTheIdleTimeoutExits) {
  const int before = threads_in_process();
  set_thread_idle_timeout(std::chrono::milliseconds(50));
  CachedThread task([] {});
  task.join();
  EXPECT_TRUE(soon([&] { return thread_cache_stats().idle == 0 && threads_in_process() == before; }))
      << thread_cache_stats().idle << " idle, " << threads_in_process() - before << " more threads";
  set_thread_idle_timeout(std::chrono::seconds(kIdleSeconds));
}

TEST(ThreadCache, AForkedChildStartsItsOwnThreads) {
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<std::unique_ptr<CachedThread>> tasks;
    for (int i = 0; i < 3; ++i) tasks.push_back(std::make_unique<CachedThread>([] {}));
    for (auto& task : tasks) task->join();  // the parent's threads now wait, idle
    CachedThread running([] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
    const pid_t child = fork();
    if (child == 0) {
      alarm(5);           // a hang ends in SIGALRM
      running.abandon();  // its thread is the parent's
      if (thread_cache_stats().idle != 0 || thread_cache_stats().busy != 0) _exit(2);
      std::atomic<int> runs{0};
      for (int round = 0; round < 5; ++round) {
        CachedThread task([&] { ++runs; });
        task.join();
      }
      _exit(runs.load() == 5 ? 0 : 1);
    }
    ASSERT_GT(child, 0);
    running.join();
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "fork " << trial << ": " << (WIFSIGNALED(status) ? "child killed by signal " : "child exited with ")
        << (WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
  }
}

}  // namespace
}  // namespace torch_shards::core
