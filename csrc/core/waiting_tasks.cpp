#include "core/waiting_tasks.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace torch_shards::core {

void run_waiting_tasks(int64_t count, const std::function<void(int64_t)>& task) {
  if (count <= 0) return;
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr error;
  const auto run = [&] {
    for (int64_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) {
      if (failed.load(std::memory_order_relaxed)) continue;
      try {
        task(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> threads;
  const int64_t wanted = std::min(count - 1, kMaxWaitingThreads);
  threads.reserve(static_cast<size_t>(wanted));
  for (int64_t t = 0; t < wanted; ++t) {
    try {
      threads.emplace_back(run);
    } catch (...) {
      break;  // no more threads: the ones started and this one take every task
    }
  }
  run();
  for (std::thread& thread : threads) thread.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace torch_shards::core
