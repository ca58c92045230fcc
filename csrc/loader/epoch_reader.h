// One worker's (or the main process's) pass over one epoch, unit by unit (a
// whole fetch, or one batch at the epoch's tail), in the order the unit
// cursor walks them.
//
// prefetch == 0: each unit is read when asked for, on the calling thread plus
// num_threads - 1 pool threads.
// prefetch > 0: num_threads reader threads read up to `prefetch` units ahead
// (and, beyond the first, no more than prefetch_bytes queued), each unit on
// one thread, and hand them over in order. Threads start on the first read
// (inside iteration, never before a fork) and are joined by close(), whatever
// ended the iteration. An exception in a reader thread reaches the consumer
// unchanged.
//
// Output tensors come from per-thread TensorPools in options.memory: recycled
// once no batch holds them (pageable or pinned), or in shared memory that
// DataLoader workers send without a copy.
#pragma once

#include <ATen/core/Dict.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/planner.h"
#include "core/thread_pool.h"
#include "loader/sources/source.h"
#include "loader/tensor_pool.h"

namespace torch_shards {

struct ReaderOptions {
  int64_t num_threads = 1;
  int64_t prefetch = 0;                                 // units read ahead; 0: read on demand
  int64_t prefetch_bytes = int64_t{1} << 30;            // queued bytes beyond which no new unit starts
  sources::Memory memory = sources::Memory::kPageable;  // of the output tensors
};

class EpochReader {
 public:
  struct Unit {
    sources::Batch batch;  // the unit's rows of every field, plus "index"
    bool padding = false;  // repeats rows another rank delivers (even_batches="pad")
  };

  EpochReader(std::shared_ptr<const sources::Source> source, core::UnitCursor cursor, const ReaderOptions& options);
  ~EpochReader();
  EpochReader(const EpochReader&) = delete;
  EpochReader& operator=(const EpochReader&) = delete;

  // The next unit, or nullopt at the end.
  std::optional<Unit> next();
  // Waits at most timeout_ms; true once next() will not block.
  bool wait(int64_t timeout_ms);
  // Stops reading (the reader threads finish their unit and exit); later reads
  // raise instead of waiting. Idempotent.
  void close();
  bool closed() const;

  int64_t num_units() const { return num_units_; }
  int64_t units_done() const { return delivered_; }
  // Counters for monitoring: units, rows, bytes delivered, queue_depth,
  // in_flight, wait_us (consumer waiting), read_us, threads, thread<k>_units.
  c10::Dict<std::string, int64_t> stats() const;

 private:
  // A thread's reading state: its pool and output tensors.
  struct ReadState {
    std::unique_ptr<core::ThreadPool> pool;
    std::unique_ptr<sources::TensorPool> tensors;
  };
  struct Slot {
    bool ready = false;
    std::optional<Unit> unit;
    std::exception_ptr error;
    int64_t bytes = 0;
  };

  void check_open() const;  // raises after close()
  Unit read_unit(const core::WorkUnit& work, const std::vector<int64_t>& rows, ReadState& state);
  void start_threads();
  void reader_loop(size_t thread);
  Unit take(Slot& slot);

  std::shared_ptr<const sources::Source> source_;
  core::UnitCursor cursor_;  // guarded by mutex_ once the threads run
  ReaderOptions options_;
  int64_t num_units_;

  int64_t delivered_ = 0;  // units handed to the consumer
  ReadState main_state_;   // prefetch == 0

  // prefetch > 0
  mutable std::mutex mutex_;
  std::condition_variable unit_ready_;  // consumer waits
  std::condition_variable room_;        // reader threads wait
  std::vector<Slot> slots_;             // unit i lives in slots_[i % prefetch]
  std::vector<std::unique_ptr<std::thread>> threads_;
  std::vector<int64_t> thread_units_;
  int64_t queued_bytes_ = 0;
  int64_t in_flight_ = 0;
  bool started_ = false;
  bool stopping_ = false;
  bool failed_ = false;

  std::atomic<int64_t> rows_delivered_{0}, bytes_delivered_{0}, wait_us_{0}, read_us_{0};
  int owner_pid_;
};

}  // namespace torch_shards
