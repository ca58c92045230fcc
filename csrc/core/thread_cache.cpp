#include "core/thread_cache.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace torch_shards::core {

struct CachedThread::Task {
  std::function<void()> run;
  std::mutex mutex;
  std::condition_variable ended;
  bool done = false;
  std::exception_ptr error;
};

namespace {

// A kept thread's place: the task handed to it while it waits.
struct Slot {
  std::condition_variable wake;
  std::shared_ptr<CachedThread::Task> task;
};

// One process's threads. Never destroyed: a thread waiting at exit waits on it, and a forked child
// must not touch its parent's (another thread may have held the lock at the fork).
struct Cache {
  explicit Cache(int process) : pid(process) {}
  const int pid;
  std::mutex mutex;
  std::vector<Slot*> idle;  // most recently idle last
  int64_t busy = 0;
};

// kIdleSeconds, or 0 where TORCH_SHARDS_KEEP_THREADS=0 (a thread exits as its task ends).
std::atomic<int64_t>& idle_timeout_ms() {
  static std::atomic<int64_t> timeout{[] {
    const char* setting = std::getenv("TORCH_SHARDS_KEEP_THREADS");
    return setting != nullptr && std::strcmp(setting, "0") == 0 ? int64_t{0} : kIdleSeconds * 1000;
  }()};
  return timeout;
}

Cache& this_process_cache() {
  static std::atomic<Cache*> current{nullptr};
  const int now = static_cast<int>(getpid());
  Cache* cache = current.load(std::memory_order_acquire);
  while (cache == nullptr || cache->pid != now) {
    auto* fresh = new Cache(now);
    if (current.compare_exchange_strong(cache, fresh, std::memory_order_acq_rel)) return *fresh;
    delete fresh;  // another thread of this process made one first: `cache` holds it now
  }
  return *cache;
}

void run(CachedThread::Task& task) {
  try {
    task.run();
  } catch (...) {
    task.error = std::current_exception();
  }
  task.run = nullptr;  // what the task captured goes before its joiner is told
}

void tell_joiner(CachedThread::Task& task) {
  {
    std::lock_guard<std::mutex> lock(task.mutex);
    task.done = true;
  }
  task.ended.notify_all();
}

void thread_main(Cache* cache, Slot* slot, std::shared_ptr<CachedThread::Task> task) {
  const std::unique_ptr<Slot> own(slot);
  for (;;) {
    run(*task);
    const auto timeout = std::chrono::milliseconds(idle_timeout_ms().load(std::memory_order_relaxed));
    const bool kept = timeout.count() > 0;  // else the thread exits as its task ends
    {
      std::lock_guard<std::mutex> lock(cache->mutex);
      --cache->busy;
      // Back in the cache before its joiner is told: a task started right after the join (the next
      // epoch's) takes this thread, not a new one.
      if (kept) cache->idle.push_back(slot);
    }
    tell_joiner(*task);
    task.reset();
    if (!kept) return;
    std::unique_lock<std::mutex> lock(cache->mutex);
    // A task handed over since the thread went back to the cache is in slot->task already.
    if (!slot->wake.wait_for(lock, timeout, [&] { return slot->task != nullptr; })) {
      cache->idle.erase(std::find(cache->idle.begin(), cache->idle.end(), slot));
      return;  // no task came: the thread exits
    }
    task = std::move(slot->task);
  }
}

}  // namespace

CachedThread::CachedThread(std::function<void()> task) : task_(std::make_shared<Task>()) {
  task_->run = std::move(task);
  Cache& cache = this_process_cache();
  std::unique_lock<std::mutex> lock(cache.mutex);
  ++cache.busy;
  if (!cache.idle.empty()) {
    Slot* slot = cache.idle.back();  // the thread idle the shortest time: its memory is the warmest
    cache.idle.pop_back();
    slot->task = task_;
    lock.unlock();
    slot->wake.notify_one();
    return;
  }
  lock.unlock();
  auto slot = std::make_unique<Slot>();
  try {
    std::thread(thread_main, &cache, slot.get(), task_).detach();
    (void)slot.release();  // the thread owns it
  } catch (...) {
    lock.lock();
    --cache.busy;
    throw;
  }
}

CachedThread::~CachedThread() { wait(); }

void CachedThread::wait() const {
  if (!task_) return;
  std::unique_lock<std::mutex> lock(task_->mutex);
  task_->ended.wait(lock, [&] { return task_->done; });
}

void CachedThread::join() {
  if (!task_) return;
  wait();
  const std::exception_ptr error = std::move(task_->error);
  task_.reset();
  if (error) std::rethrow_exception(error);
}

void CachedThread::abandon() {
  // Never released: its last owner here would destroy a mutex that a thread of the parent may have held.
  if (task_) (void)new std::shared_ptr<Task>(std::move(task_));
}

ThreadCacheStats thread_cache_stats() {
  Cache& cache = this_process_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  return ThreadCacheStats{cache.busy, static_cast<int64_t>(cache.idle.size())};
}

void set_thread_idle_timeout(std::chrono::milliseconds timeout) {
  idle_timeout_ms().store(timeout.count(), std::memory_order_relaxed);
}

}  // namespace torch_shards::core
