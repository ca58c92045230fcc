// torch.classes.torch_shards.EpochReader: one DataLoader worker's (or the
// main process's) pass over one epoch, unit by unit (a whole fetch, or one
// batch at the epoch's tail), in the planner's order.
//
// prefetch == 0: each unit is read when asked for, on the calling thread plus
// num_threads - 1 pool threads.
// prefetch > 0: num_threads reader threads read up to `prefetch` units ahead
// (and, beyond the first, no more than prefetch_bytes queued), each unit on
// one thread, and hand them over in order. Threads start on the first read
// (inside iteration, never before a fork) and are joined when the reader is
// destroyed, whatever ended the iteration. An exception in a reader thread
// reaches the consumer unchanged.
//
// Output tensors come from per-thread TensorPools in options.memory: recycled
// once no batch holds them (pageable or pinned), or in shared memory that
// DataLoader workers send without a copy. A later GPU stage that copies a
// batch asynchronously keeps the host batch alive until its copy completes,
// which is exactly what recycling waits for.
#pragma once

#include <ATen/core/ivalue.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "../core/planner.h"
#include "../core/thread_pool.h"
#include "source.h"
#include "tensor_pool.h"

namespace torch_shards {

struct ReaderOptions {
  int64_t num_threads = 1;
  int64_t prefetch = 0;                                 // units read ahead; 0: read on demand
  int64_t prefetch_bytes = int64_t{1} << 30;            // queued bytes beyond which no new unit starts
  sources::Memory memory = sources::Memory::kPageable;  // of the output tensors
};

class EpochReader : public torch::CustomClassHolder {
 public:
  EpochReader(std::shared_ptr<const sources::Source> source, std::shared_ptr<const core::Planner> planner,
              uint64_t seed, int64_t epoch, int64_t rank, int64_t worker, int64_t num_workers,
              const ReaderOptions& options);
  ~EpochReader() override;
  EpochReader(const EpochReader&) = delete;
  EpochReader& operator=(const EpochReader&) = delete;

  // The next unit with an "index" field, or nullopt at the end.
  std::optional<sources::Batch> next();
  // The next unit cut into its batches (views, no copy); empty at the end.
  c10::List<sources::Batch> next_batches();
  // Like next_batches, waiting at most timeout_ms for a prefetched unit:
  // nullopt if none is ready yet (so a caller can handle interrupts).
  std::optional<c10::List<sources::Batch>> poll_batches(int64_t timeout_ms);
  // Skips units not yet read (resuming); only before the first read.
  void skip_units(int64_t units);
  // Stops reading (the reader threads finish their unit and exit); later reads
  // raise instead of waiting. Idempotent.
  void close();

  int64_t epoch() const { return epoch_; }
  int64_t num_units() const { return num_units_; }
  int64_t units_done() const { return delivered_; }
  bool last_was_padding() const { return last_padding_; }
  // Counters for monitoring: units, rows, bytes delivered, queue_depth,
  // in_flight, wait_us (consumer waiting), read_us, thread<k>_units.
  c10::Dict<std::string, int64_t> stats() const;

 private:
  // A thread's reading state: its fetch cache, pool and output tensors.
  struct ReadState {
    core::FetchCache cache;
    std::unique_ptr<core::ThreadPool> pool;
    std::unique_ptr<sources::TensorPool> tensors;
  };
  struct Slot {
    bool ready = false;
    std::optional<sources::Batch> batch;
    std::exception_ptr error;
    bool padding = false;
    int64_t bytes = 0;
  };

  void check_open();  // raises after close()
  sources::Batch read_unit(int64_t index, ReadState& state, bool& padding);
  void start_threads();
  void reader_loop(size_t thread);
  sources::Batch take(Slot& slot);
  c10::List<sources::Batch> split(const sources::Batch& unit) const;

  std::shared_ptr<const sources::Source> source_;
  std::shared_ptr<const core::Planner> planner_;
  uint64_t seed_;
  int64_t epoch_, rank_, worker_, num_workers_;
  ReaderOptions options_;
  int64_t num_units_;
  int64_t batch_size_;

  int64_t delivered_ = 0;  // units handed to the consumer
  bool last_padding_ = false;
  ReadState main_state_;  // prefetch == 0

  // prefetch > 0
  mutable std::mutex mutex_;
  std::condition_variable unit_ready_;  // consumer waits
  std::condition_variable room_;        // reader threads wait
  std::vector<Slot> slots_;             // unit i lives in slots_[i % prefetch]
  std::vector<std::unique_ptr<std::thread>> threads_;
  std::vector<int64_t> thread_units_;
  int64_t next_claim_ = 0;
  int64_t queued_bytes_ = 0;
  int64_t in_flight_ = 0;
  bool started_ = false;
  bool stopping_ = false;
  bool failed_ = false;

  std::atomic<int64_t> rows_delivered_{0}, bytes_delivered_{0}, wait_us_{0}, read_us_{0};
  int owner_pid_;
};

}  // namespace torch_shards
