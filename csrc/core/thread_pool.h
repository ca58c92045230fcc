// A small fixed-size thread pool for parallel reads and decompression.
//
// Threads start on first use (never in a constructor that may run before a
// fork) and are joined on destruction, on every path: they are this process's
// cached threads (core/thread_cache.h), kept for the next pool. A pool used in
// a forked child (whose parent's threads do not exist there) starts fresh ones.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/thread_cache.h"

namespace torch_shards::core {

class ThreadPool {
 public:
  // threads >= 1 workers besides the calling thread; 0 runs everything inline.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return threads_; }

  // Runs task(i) for every i in [0, count) on the workers and the calling
  // thread, and returns when all have finished. If tasks throw, the remaining
  // ones are skipped and the first exception is rethrown here. Callers on
  // several threads share the workers (a worker takes tasks of the oldest call
  // that has some left, so the read needed first finishes first); a caller
  // runs its own tasks too, and never waits for workers that are busy with
  // another call's. Called from inside a task (nested), it runs inline.
  void parallel_for(int64_t count, const std::function<void(int64_t)>& task);

 private:
  struct Job {
    const std::function<void(int64_t)>* task = nullptr;
    int64_t count = 0;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> finished{0};
    std::atomic<bool> failed{false};
    std::exception_ptr error;
    std::mutex error_mutex;
    bool has_tasks_left() const { return next.load(std::memory_order_relaxed) < count; }
  };

  // Locks, condition variables and the calls under way. A forked child must
  // not touch the ones it inherited (the parent's waiting threads are
  // registered in them and do not exist there; a parent thread may have been
  // changing the list): it abandons them and makes fresh ones.
  struct Sync {
    std::mutex mutex;  // guards jobs and stopping
    std::condition_variable wake;
    std::condition_variable done;
    std::deque<std::shared_ptr<Job>> jobs;  // calls under way, oldest first
    bool stopping = false;
  };

  void adopt_after_fork();
  void start();
  void worker_loop();
  void run_tasks(Job& job);

  int threads_;
  int owner_pid_ = 0;
  std::unique_ptr<Sync> sync_ = std::make_unique<Sync>();
  std::vector<std::unique_ptr<CachedThread>> workers_;
};

}  // namespace torch_shards::core
