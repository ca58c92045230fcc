#include "core/thread_pool.h"

#include <unistd.h>

#include <algorithm>

namespace torch_shards::core {
namespace {
thread_local bool inside_pool_task = false;
}

ThreadPool::ThreadPool(int threads) : threads_(threads < 0 ? 0 : threads), owner_pid_(static_cast<int>(getpid())) {}

ThreadPool::~ThreadPool() {
  if (owner_pid_ != static_cast<int>(getpid())) {
    adopt_after_fork();  // the parent's threads do not exist here: nothing to join
    return;
  }
  {
    std::lock_guard<std::mutex> lock(sync_->mutex);
    sync_->stopping = true;
  }
  sync_->wake.notify_all();
  for (auto& worker : workers_) worker->join();  // worker_loop returns, never throws
}

void ThreadPool::adopt_after_fork() {
  for (auto& worker : workers_) worker->abandon();  // threads of the parent's, not ours
  workers_.clear();
  // May hold the parent's waiters and a list a parent thread was changing: never lock, signal or
  // destroy it (its jobs are only counters; the parent's absent threads hold no task of ours).
  (void)sync_.release();
  sync_ = std::make_unique<Sync>();
  owner_pid_ = static_cast<int>(getpid());
}

void ThreadPool::start() {
  if (static_cast<int>(workers_.size()) == threads_) return;
  for (int i = 0; i < threads_; ++i) workers_.push_back(std::make_unique<CachedThread>([this] { worker_loop(); }));
}

void ThreadPool::run_tasks(Job& job) {
  const bool was_inside = inside_pool_task;
  inside_pool_task = true;
  for (int64_t i = job.next.fetch_add(1); i < job.count; i = job.next.fetch_add(1)) {
    if (!job.failed.load(std::memory_order_relaxed)) {
      try {
        (*job.task)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(job.error_mutex);
        if (!job.error) job.error = std::current_exception();
        job.failed = true;
      }
    }
    if (job.finished.fetch_add(1) + 1 == job.count) {
      std::lock_guard<std::mutex> lock(sync_->mutex);
      sync_->done.notify_all();
    }
  }
  inside_pool_task = was_inside;
}

void ThreadPool::worker_loop() {
  Sync& sync = *sync_;  // a worker only ever runs in the process that started it
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(sync.mutex);
      sync.wake.wait(lock, [&] {
        if (sync.stopping) return true;
        // Calls whose tasks are all taken leave the list (their callers wait on `done`, not on it).
        while (!sync.jobs.empty() && !sync.jobs.front()->has_tasks_left()) sync.jobs.pop_front();
        const auto oldest = std::find_if(sync.jobs.begin(), sync.jobs.end(),
                                         [](const std::shared_ptr<Job>& j) { return j->has_tasks_left(); });
        if (oldest != sync.jobs.end()) job = *oldest;  // the oldest call with tasks left
        return job != nullptr;
      });
      if (sync.stopping) return;
    }
    run_tasks(*job);
  }
}

void ThreadPool::parallel_for(int64_t count, const std::function<void(int64_t)>& task) {
  if (count <= 0) return;
  if (threads_ == 0 || count == 1 || inside_pool_task) {
    for (int64_t i = 0; i < count; ++i) task(i);
    return;
  }
  if (owner_pid_ != static_cast<int>(getpid())) adopt_after_fork();
  auto job = std::make_shared<Job>();
  job->task = &task;
  job->count = count;
  {
    std::lock_guard<std::mutex> lock(sync_->mutex);
    start();
    sync_->jobs.push_back(job);
  }
  sync_->wake.notify_all();
  run_tasks(*job);
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(sync_->mutex);
    sync_->done.wait(lock, [&] { return job->finished.load() == job->count; });
    const auto listed = std::find(sync_->jobs.begin(), sync_->jobs.end(), job);
    if (listed != sync_->jobs.end()) sync_->jobs.erase(listed);
    // Taken out of the job: a worker may still hold the job after this call returns, and the
    // exception must not be freed there while the caller is handling it.
    error = std::move(job->error);
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace torch_shards::core
