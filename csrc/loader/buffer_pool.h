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
#include <memory>
#include <mutex>
#include <vector>

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

}  // namespace torch_shards
