// One worker's (or the main process's) pass over one epoch, unit by unit (a
// whole fetch, or the batches of one fetch it delivers at the epoch's tail),
// in the order the unit cursor walks them. The cursor deals tail batches one
// at a time (to spread them over ranks and workers); the ones this worker
// takes in a row from one fetch are read together, as one unit: read one by
// one, each batch's rows are a few scattered rows from each of the fetch's
// blocks (batch 4096 of 8 KB rows: the copy limit of the epoch's tail halves).
// The batches, and their order, are the same.
//
// prefetch == 0: each unit is read when asked for, on the calling thread plus
// num_threads - 1 pool threads.
// prefetch > 0: num_threads reader threads read up to `prefetch` units ahead
// and hand them over in order; a unit starts only while the bytes out (read
// and not yet taken, or being read) stay under prefetch_bytes (one is always
// allowed). A waiting consumer is woken once two pieces in a row are ready
// (or nothing more is being read, or the readers wait for the room it frees):
// woken for each, it took one and slept again, two context switches a piece
// taken from a reader thread's core. Each thread reads its own unit; a large
// unit (a few MB and more) is read with the help of num_threads - 1 shared
// pool threads, so that the copy work of one fetch is spread over every
// thread, and so is the epoch's first piece (one batch, which the consumer
// waits for while the other threads wait for it) from 256 KB. Threads start on the
// first read (inside iteration, never before a fork) and are joined by
// close(), whatever ended the iteration. They are the process's cached threads
// (core/thread_cache.h): an epoch's readers and helpers are the last epoch's,
// with their thread_local scratch already in memory. An exception in a reader thread
// reaches the consumer unchanged.
//
// A unit larger than prefetch_bytes is read in pieces of whole batches, each
// its own allocation, handed over in order (Unit::first / last).
//
// Every tensor of a unit (or piece) is one allocation from the TensorPool in
// options.memory, recycled by options.buffers once no batch holds it; with
// options.batch_size it also holds room for the row offsets of its batches
// (split_into_batches).
#pragma once

#include <ATen/core/Dict.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <torch_shards/export.h>

#include "core/planner.h"
#include "core/thread_cache.h"
#include "core/thread_pool.h"
#include "loader/buffer_pool.h"
#include "loader/sources/source.h"
#include "loader/tensor_pool.h"

namespace torch_shards {

struct ReaderOptions {
  int64_t num_threads = 1;
  int64_t prefetch = 0;                                 // units read ahead; 0: read on demand
  int64_t prefetch_bytes = int64_t{1} << 30;            // bytes out beyond which no new unit starts
  sources::Memory memory = sources::Memory::kPageable;  // of the output tensors
  // > 0: large units are read in pieces of whole batches of this many rows, and each unit carries room
  // for its batches' CSR row offsets (the consumer cuts it: split_into_batches).
  int64_t batch_size = 0;
  std::shared_ptr<BufferPool> buffers;  // recycled output memory; null: plain allocations
  // > 0: while the last read waited on no request (a remote store's objects all held whole in the
  // cache), only this many threads read, and local_prefetch units (if > 0) are read ahead: the other
  // threads and the deeper read-ahead, there to overlap round trips, would only take turns on the
  // CPUs and push the units out of the CPU's caches before they are taken. 0: as always.
  int64_t local_threads = 0;
  int64_t local_prefetch = 0;
  // Whether read_ahead() may deepen the read-ahead beyond `prefetch` units (the user did not set prefetch).
  bool deepen_read_ahead = false;
  // Whether reads wait on requests, carried from one epoch's reader to the next (null: assumed at first).
  // A reader whose last predecessor ended reading with no wait starts its local_threads only (and their
  // helpers): the other threads, and their helpers, start at the first read that waits. Starting 32
  // threads and 31 helpers each epoch cost an epoch of a cached collection on 2 CPUs 1.5 ms before its
  // first batch and 6-9% of its rows/s (benchmarks/remote.py's, 34 ms).
  std::shared_ptr<std::atomic<bool>> reads_wait;
  // Output bytes a row of the sparse fields took as last read, carried from one epoch's reader to the next
  // (null or 0: not read yet; taken from the stored sizes, Source::sparse_row_bytes). A piece is admitted under
  // prefetch_bytes by its estimate: behind URLs every thread starts one at once, and estimated from the dense fields
  // alone, each epoch's first pieces of a CSR matrix took several times the budget.
  std::shared_ptr<std::atomic<int64_t>> sparse_row_bytes;
};

class EpochReader {
 public:
  struct Unit {
    sources::Batch batch;  // the rows of every field, plus "index"
    // When batch_size > 0, for each CSR field of `batch`: memory for its batches' row offsets (cut by
    // the consumer: its tensor objects are then made and freed on one thread).
    sources::Batch batch_offsets;
    bool padding = false;     // repeats rows another rank delivers (even_batches="pad")
    bool first = true;        // the first piece of its unit
    bool last = true;         // the last piece of its unit
    int64_t dealt_units = 1;  // the cursor's units this one completes (0: not the last piece)
  };

  EpochReader(std::shared_ptr<const sources::Source> source, core::UnitCursor cursor, const ReaderOptions& options);
  ~EpochReader();
  EpochReader(const EpochReader&) = delete;
  EpochReader& operator=(const EpochReader&) = delete;

  // The next unit (or piece of one), or nullopt at the end.
  std::optional<Unit> next();
  // Waits at most timeout_ms; true once next() will not block.
  bool wait(int64_t timeout_ms);
  // For a consumer that takes units `bytes` at a time (a DataLoader worker packing them into one item,
  // then away while it crosses): the threads go on reading until that many bytes are out, beyond
  // `prefetch` units (within prefetch_bytes), instead of stopping at `prefetch` units while it is away.
  // Only with ReaderOptions::deepen_read_ahead; never lowers it.
  void read_ahead(int64_t bytes);
  // For that consumer, between the units of one item: waits until units of at least `bytes` are read
  // and next in line, or none will follow (the epoch is read, a read failed, the reader closed), or
  // the threads wait for the room the consumer frees. Meanwhile the threads wake it only then, not at
  // every unit or two (which cost its thread a switch each: ~50 per epoch and worker at batch 256).
  void wait_for_bytes(int64_t bytes);
  // Stops reading (the reader threads finish their piece and exit); later
  // reads raise instead of waiting. Idempotent.
  void close();
  bool closed() const;

  int64_t num_units() const { return num_units_; }
  // The pool recycling this reader's output memory (null: none).
  BufferPool* buffers() const { return options_.buffers.get(); }
  int64_t units_done() const;
  // Counters for monitoring: units, rows, bytes delivered, queue_depth,
  // queued_bytes, in_flight, wait_us (consumer waiting), wakes (the reader
  // threads woke the waiting consumer as units became ready), read_us, threads,
  // thread<k>_units, and the buffer pool's allocations, reuses, untracked
  // and kept_bytes.
  c10::Dict<std::string, int64_t> stats() const;

 private:
  // What a thread reads: a unit, or a piece of one (whole batches).
  struct Piece {
    int64_t item = 0;                                  // position in delivery order
    std::shared_ptr<const std::vector<int64_t>> rows;  // the unit's rows
    // Their positions in ascending row order, where the planner knows them (else empty).
    std::shared_ptr<const std::vector<int64_t>> sorted;
    int64_t begin = 0, end = 0;  // this piece's
    bool padding = false, first = true, last = true;
    int64_t dealt_units = 1;   // the cursor's units the unit holds
    int64_t estimate = 0;      // bytes
    std::exception_ptr error;  // planning failed
  };
  struct Slot {
    bool ready = false;
    std::optional<Unit> unit;
    std::exception_ptr error;
    int64_t bytes = 0;
  };

  void check_open() const;   // raises after close()
  bool more_pieces() const;  // under mutex_
  // Under mutex_, after a piece is read: whether to wake the consumer now.
  bool consumer_should_wake() const;
  // Under mutex_: whether wait_for_bytes(bytes) is done waiting.
  bool bytes_ready(int64_t bytes) const;
  // Under mutex_: whether `out` pieces out (claimed, not taken) leave room for another, `limit` of them
  // allowed (prefetch, or local_prefetch).
  bool room_for_another(int64_t out, int64_t limit) const;
  Piece claim();  // under mutex_
  Unit read_piece(const Piece& piece, core::ThreadPool& pool);
  int64_t estimate_bytes(int64_t rows) const;
  void start_threads_locked();  // under mutex_
  void reader_loop(size_t thread);
  Unit take(Slot& slot);

  std::shared_ptr<const sources::Source> source_;
  core::UnitCursor cursor_;  // guarded by mutex_
  ReaderOptions options_;
  int64_t num_units_;
  sources::TensorPool tensors_;
  int64_t dense_row_bytes_ = 0;               // output bytes per row of the dense fields and the index
  std::atomic<int64_t> sparse_row_bytes_{0};  // and of the sparse ones, as last read

  // The unit being cut into pieces (guarded by mutex_).
  std::shared_ptr<const std::vector<int64_t>> unit_rows_;
  std::shared_ptr<const std::vector<int64_t>> unit_sorted_;  // as Piece::sorted
  bool unit_padding_ = false;
  int64_t unit_next_row_ = 0, piece_rows_ = 0, unit_dealt_units_ = 1;

  int64_t claimed_ = 0;                          // pieces claimed
  int64_t delivered_ = 0;                        // pieces handed to the consumer
  std::atomic<int64_t> units_delivered_{0};      // the cursor's units, as num_units_
  std::unique_ptr<core::ThreadPool> main_pool_;  // prefetch == 0: the calling thread's helpers
  std::unique_ptr<core::ThreadPool> helpers_;    // prefetch > 0: shared by the reader threads for large pieces
  // local_threads > 1 (and < num_threads): the helpers while reads wait on no request, as many as the
  // threads that read then (not the 31 of 32 URL threads, which would take turns on the CPUs)
  std::unique_ptr<core::ThreadPool> local_helpers_;
  // Starts the reader threads not started yet (and the helpers they share); under mutex_.
  void start_waiting_threads_locked();

  // prefetch > 0
  mutable std::mutex mutex_;
  std::condition_variable unit_ready_;   // consumer waits
  std::condition_variable room_;         // reader threads wait
  std::condition_variable sitting_out_;  // threads beyond local_threads wait while reads wait on no request
  std::deque<Slot> slots_;               // pieces [delivered_, claimed_)
  std::vector<std::unique_ptr<core::CachedThread>> threads_;  // this process's cached threads
  std::vector<int64_t> thread_units_;
  int64_t queued_bytes_ = 0;  // read, not yet taken
  int64_t out_bytes_ = 0;     // read or being read (estimated), not yet taken
  int64_t in_flight_ = 0;
  int64_t read_ahead_bytes_ = 0;  // read_ahead()'s
  int64_t wanted_bytes_ = 0;      // wait_for_bytes()'s, while it waits (0: not waiting)
  bool consumer_waits_ = false;   // the consumer waits on unit_ready_
  int64_t wakes_ = 0;             // the waiting consumer woken by a reader thread (stats' "wakes")
  bool started_ = false;
  bool stopping_ = false;
  bool failed_ = false;
  bool first_read_ = false;  // the first piece (one batch) was read: until then, where reads wait on
                             // no request, no other piece starts

  std::atomic<int64_t> rows_delivered_{0}, bytes_delivered_{0}, wait_us_{0}, read_us_{0};
  std::atomic<bool> reads_wait_{true};  // the last read's PlannedRead::waits_on_requests
  int owner_pid_;
};

// This process's cached threads, readers and helpers (for the Python door's native_threads()).
TORCH_SHARDS_API core::ThreadCacheStats reader_thread_stats();

}  // namespace torch_shards
