#include "thread_pool.h"

#include <unistd.h>

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
    stopping_ = true;
  }
  sync_->wake.notify_all();
  for (auto& worker : workers_) worker->join();
}

void ThreadPool::adopt_after_fork() {
  for (auto& worker : workers_) worker.release();  // std::thread objects of threads that are not ours
  workers_.clear();
  (void)sync_.release();  // may hold the parent's waiters: never lock, signal or destroy it
  sync_ = std::make_unique<Sync>();
  job_.reset();  // only an atomic count: copies held by the parent's absent threads keep the job alive
  generation_ = 0;
  stopping_ = false;
  owner_pid_ = static_cast<int>(getpid());
}

void ThreadPool::start() {
  if (static_cast<int>(workers_.size()) == threads_) return;
  for (int i = 0; i < threads_; ++i) workers_.push_back(std::make_unique<std::thread>([this] { worker_loop(); }));
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
  uint64_t seen = 0;
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(sync.mutex);
      sync.wake.wait(lock, [&] { return stopping_ || (job_ && generation_ != seen); });
      if (stopping_) return;
      seen = generation_;
      job = job_;
    }
    run_tasks(*job);
  }
}

void ThreadPool::parallel_for(int64_t count, const std::function<void(int64_t)>& task) {
  if (count <= 0) return;
  const auto run_inline = [&] {
    for (int64_t i = 0; i < count; ++i) task(i);
  };
  if (threads_ == 0 || count == 1 || inside_pool_task) return run_inline();
  if (owner_pid_ != static_cast<int>(getpid())) adopt_after_fork();
  // The workers serve one caller at a time; another caller meanwhile runs its
  // own tasks rather than wait idle for them.
  std::unique_lock<std::mutex> running(sync_->run, std::try_to_lock);
  if (!running.owns_lock()) return run_inline();
  auto job = std::make_shared<Job>();
  job->task = &task;
  job->count = count;
  {
    std::lock_guard<std::mutex> lock(sync_->mutex);
    start();
    job_ = job;
    ++generation_;
  }
  sync_->wake.notify_all();
  run_tasks(*job);
  {
    std::unique_lock<std::mutex> lock(sync_->mutex);
    sync_->done.wait(lock, [&] { return job->finished.load() == job->count; });
    job_.reset();
  }
  if (job->error) std::rethrow_exception(job->error);
}

}  // namespace torch_shards::core
