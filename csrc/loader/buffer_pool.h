// Recycled output memory of one dataset in one process (every epoch and every
// iterator of it): the storages units are carved from, and the scratch
// memory sources stage into.
//
// A fetch's output freshly allocated every time costs a page fault (and the
// kernel zeroing the page) for every 4 KB delivered, every epoch: large
// allocations come from mmap and go back to the kernel when freed. The pool
// keeps the storages it handed out and hands one out again once nobody else
// holds it (the consumer dropped every batch viewing it, on whatever thread:
// DataLoader's pin-memory thread included), so after the first epoch the
// pages are already there.
//
// Memory::kPageable and kPinned storages are reused when the pool holds the
// only reference. Memory::kSharedPooled storages (shared_slab.h: DataLoader
// workers whose batches cross through transfer.h) are reused when, besides,
// the main process gave back every lease on them. Memory::kShared storages are never
// pooled: once sent as torch sends them, the main process may hold their
// batches for any time and nothing tells this process when it lets go
// (TensorPool allocates them fresh). A storage whose memory was moved since (torch moves plain memory
// into its own shared memory to send it) is never reused.
//
// The pool keeps at most `budget` bytes plus three of the largest storages
// asked for: the unit whose start took the bytes in flight past the budget
// (a unit starts while they are under it), the unit the consumer goes
// through and the one before it (its last batch is still held while the
// consumer asks for the next). Beyond that, storages are handed out
// untracked and freed when dropped (slabs: once, besides, their leases are
// back, as the main process may not have mapped them yet). Size classes
// (an eighth of a power of two) let units of slightly different sizes (CSR
// fetches) reuse each other's storages. Thread-safe; a pool inherited
// through fork starts empty in the child.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include <torch_shards/export.h>

#include "loader/tensor_pool.h"

namespace torch_shards {

class BufferPool {
 public:
  struct Stats {
    int64_t allocations = 0;  // storages allocated (pooled or not)
    int64_t reuses = 0;       // storages handed out again
    int64_t untracked = 0;    // allocations beyond the budget, freed once free
    int64_t kept_bytes = 0;   // bytes of the storages the pool keeps (free or in use)
    int64_t kept = 0;         // storages the pool keeps
  };

  explicit BufferPool(int64_t budget_bytes);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A storage of at least `bytes` bytes, uninitialised (but for the lease
  // word of kSharedPooled), pageable, pinned or shared (InvalidArgument for
  // Memory::kShared).
  c10::Storage acquire(size_t bytes, sources::Memory memory);
  Stats stats() const;

 private:
  struct Kept {
    c10::Storage storage;
    const void* data = nullptr;  // where its memory was when made: moved storages are never reused
    sources::Memory memory = sources::Memory::kPageable;
    size_t size_class = 0;
    uint64_t last_use = 0;
  };
  struct Sync {
    std::mutex mutex;
  };

  static bool is_free(const Kept& kept);
  // In a forked child, the first call starts the pool afresh (thread-safe: reader threads race here).
  void adopt_if_forked();
  void adopt_after_fork();  // by adopt_if_forked()

  int64_t budget_;
  std::unique_ptr<Sync> sync_ = std::make_unique<Sync>();
  std::vector<Kept> kept_;
  size_t kept_bytes_ = 0;
  size_t largest_ = 0;  // largest request seen
  uint64_t clock_ = 0;
  static constexpr int kAdopting = -1;
  std::atomic<int> owner_pid_;  // the process the pool belongs to (kAdopting while a child adopts it)
  Stats counts_;
};

// The end of an asynchronous use of memory (a copy to the GPU): its memory
// may be written again only once the fence is done. The device stage's fence
// is the CUDA event recorded after the copy (device_stage.cpp); the tests use
// host fences they complete themselves.
class TORCH_SHARDS_API Fence {
 public:
  virtual ~Fence() = default;
  virtual bool done() = 0;  // without waiting
  virtual void wait() = 0;  // until done
};

// Staging memory of the device stage, from a BufferPool of its own (pinned:
// the copies to the GPU are asynchronous only from pinned memory), under one
// discipline with the host path's: a storage handed out is given back with
// the fence of the copy that reads it (retire) and goes back to the pool only
// once that fence is done, so it is never written while its copy may still
// run. The bytes retired and not yet done stay within `bound_bytes` (the
// dataset's prefetch_bytes): acquire() waits for the oldest fences first
// (never for the last one left: a batch larger than the bound still goes, one
// at a time). Storages are sized in the pool's size classes, so after the
// first rounds every acquire reuses one: no allocation per batch. Not
// thread-safe (one consumer, as the stage).
class TORCH_SHARDS_API FencedBuffers {
 public:
  struct Stats {
    int64_t allocations = 0;      // storages the pool allocated
    int64_t reuses = 0;           // storages it handed out again
    int64_t waits = 0;            // fences waited for (the bound reached)
    int64_t in_flight = 0;        // retired storages whose fences are not known done
    int64_t in_flight_bytes = 0;  // their bytes
    int64_t peak_in_flight_bytes = 0;
  };

  FencedBuffers(sources::Memory memory, int64_t bound_bytes);
  // Waits for the fences still pending: no storage is freed while a copy may read it.
  ~FencedBuffers();
  FencedBuffers(const FencedBuffers&) = delete;
  FencedBuffers& operator=(const FencedBuffers&) = delete;

  // A storage of at least `bytes` bytes, uninitialised.
  c10::Storage acquire(size_t bytes);
  // `storage` (from acquire) is read until `fence` is done; `keep` (e.g. the
  // host batch a copy reads directly) is held as long, not counted in the bound.
  void retire(c10::Storage storage, std::unique_ptr<Fence> fence, std::vector<c10::Storage> keep = {});
  // Lets go of what the done fences held (acquire does it too).
  void reclaim();
  sources::Memory memory() const { return memory_; }
  int64_t bound_bytes() const { return bound_; }
  Stats stats() const;

 private:
  struct InFlight {
    c10::Storage storage;
    std::vector<c10::Storage> keep;
    std::unique_ptr<Fence> fence;
    size_t bytes = 0;
  };

  sources::Memory memory_;
  int64_t bound_;
  BufferPool pool_;
  std::deque<InFlight> in_flight_;  // in the order retired
  size_t in_flight_bytes_ = 0;
  Stats counts_;
};

}  // namespace torch_shards
