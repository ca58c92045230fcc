// Shared memory a DataLoader worker assembles its batches in, and the main
// process maps by handle (transfer.h).
//
// A slab is an anonymous shared-memory file (memfd: it has no name, so
// nothing is ever left in /dev/shm, even when the worker is killed) mapped in
// the worker, which keeps its descriptor open for the slab's life. The main
// process maps it once, by opening /proc/<worker pid>/fd/<fd> (checked
// against the file's inode), and keeps the mapping, so a batch crosses as a
// few words: no descriptor passed over a socket, no segment made, no page
// faulted in again per batch. Each slab starts with kSlabHeaderBytes: its
// lease word (transfer.h), then nothing.
//
// The mapping ends when the worker says the slab is gone (its ids freed since
// the last batch travel with the next one), when the worker's iteration
// delivered its last batch, or when the worker process is dead; the views of
// batches the main process still holds keep their own reference.
//
// The slab's storage is not one torch's allocators made: torch moves it into
// its own shared memory if it ever sends it itself (a batch turned into
// other objects by a custom collate_fn), and the worker's pool then never
// reuses it (buffer_pool.h).
#pragma once

#include <c10/core/Storage.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include <torch_shards/export.h>

namespace torch_shards {

// Bytes at the start of a slab holding its lease count (the tensors carved
// from it start after them, 64-byte aligned).
inline constexpr size_t kSlabHeaderBytes = 64;

// What the main process needs to map a slab of another process.
struct SlabHandle {
  int64_t id = 0;     // unique among the slabs of its process
  int64_t fd = -1;    // its descriptor in that process
  int64_t inode = 0;  // the file's inode: a descriptor number reused for another file is refused
  int64_t bytes = 0;  // its size
};

// This process, as the owner of slabs: its pid and a random word drawn
// afresh in each process (a forked child included), which names its slabs
// for the main process (a pid may be reused).
struct SlabOwner {
  int64_t pid = 0;
  int64_t nonce = 0;
};
TORCH_SHARDS_API SlabOwner slab_owner();

// A new slab of `bytes` bytes (zeroed). ReadError-free: c10::Error if the
// memory cannot be had.
TORCH_SHARDS_API c10::Storage new_slab(size_t bytes);

// The handle of a slab this process made, or nullopt for any other storage
// (or a slab whose memory torch moved since).
TORCH_SHARDS_API std::optional<SlabHandle> slab_handle(const c10::Storage& storage);

// Ids of this process's slabs freed since the last call.
TORCH_SHARDS_API std::vector<int64_t> take_freed_slabs();

// In the main process: the slab `handle` of process `owner`, mapped on first
// use and kept until forgotten. RuntimeError naming the process, the
// descriptor and why, if it cannot be mapped.
TORCH_SHARDS_API c10::Storage map_slab(const SlabOwner& owner, const SlabHandle& handle);
// Forgets the mappings of slabs `ids` of `owner` (they were freed there).
TORCH_SHARDS_API void forget_slabs(int64_t nonce, const std::vector<int64_t>& ids);
// Forgets every mapping of the slabs of `owner`.
TORCH_SHARDS_API void forget_slab_owner(int64_t nonce);
// Forgets the mappings of processes that are gone.
TORCH_SHARDS_API void forget_dead_slab_owners();

struct MappedSlabStats {
  int64_t maps = 0;          // slabs mapped by this process so far
  int64_t mapped = 0;        // mappings kept now
  int64_t mapped_bytes = 0;  // their bytes
};
TORCH_SHARDS_API MappedSlabStats mapped_slab_stats();

}  // namespace torch_shards
