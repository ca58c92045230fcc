// Tasks that mostly wait on something outside this process (requests to a
// server, another process's download into the node-local cache), each on a
// thread of its own, so that their waits overlap whatever pool the caller
// reads with: a reader's pool may run inline (small pieces), be busy with
// other readers' calls (all waiting on one download), or be the pool the
// caller's own task runs in (ThreadPool runs nested calls inline).
#pragma once

#include <cstdint>
#include <functional>

namespace torch_shards::core {

// Threads one call starts at most; more tasks share them.
constexpr int64_t kMaxWaitingThreads = 32;

// Runs task(i) for every i in [0, count): on the calling thread and on up to
// min(count - 1, kMaxWaitingThreads) threads started for this call, all
// joined before it returns, on every path. If tasks throw, those not yet
// started are skipped and the first exception is rethrown here. Where no
// thread can be started, the tasks run on the calling thread.
void run_waiting_tasks(int64_t count, const std::function<void(int64_t)>& task);

}  // namespace torch_shards::core
