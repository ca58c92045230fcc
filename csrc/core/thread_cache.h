// Threads kept between uses. A task started here runs on a thread that an
// earlier task left, or on a new one; when it ends, its thread waits up to
// kIdleSeconds for the next task before it exits. The reader threads of one
// epoch are then those of the one before, with what they keep (thread_local
// scratch, whose pages would otherwise be taken from the system again at
// every epoch, and decompression contexts):
//   core::CachedThread thread([&] { read(); });
//   ...
//   thread.join();  // the task has ended (its thread is back in the cache)
// Per process: a forked child starts its own threads (the parent's do not
// exist there); a CachedThread inherited through fork is abandon()ed.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

namespace torch_shards::core {

// How long a thread waits for a task before it exits: kIdleSeconds, none where the environment has
// TORCH_SHARDS_KEEP_THREADS=0 (read at the first use), or as set (tests shorten it).
constexpr int64_t kIdleSeconds = 30;
void set_thread_idle_timeout(std::chrono::milliseconds timeout);

class CachedThread {
 public:
  explicit CachedThread(std::function<void()> task);  // starts it at once
  ~CachedThread();                                    // joins (a task must not outlive what it uses)
  CachedThread(const CachedThread&) = delete;
  CachedThread& operator=(const CachedThread&) = delete;

  // Waits for the task to end (its thread is back in the cache by then); rethrows what it threw.
  void join();
  // Forgets the task without waiting: for a CachedThread inherited through fork, whose thread does
  // not exist in this process (and whose locks another thread may have held at the fork).
  void abandon();

  struct Task;

 private:
  void wait() const;  // until the task has ended (nothing rethrown)

  std::shared_ptr<Task> task_;
};

// This process's cached threads: running a task, and waiting for one.
struct ThreadCacheStats {
  int64_t busy = 0;
  int64_t idle = 0;
};
ThreadCacheStats thread_cache_stats();

}  // namespace torch_shards::core
