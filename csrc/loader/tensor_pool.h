// Where a read's output tensors come from, in the memory their consumer
// needs.
//
// Every output tensor of a unit (every field, the row indices, the CSR
// arrays and the batches' rebased row offsets) is carved out of one storage:
// one allocation per unit, and one shared-memory segment when DataLoader
// workers send it. With a BufferPool the storage is recycled once no batch
// holds it (no page faults after the first epoch); without one (Source.read)
// it is a plain allocation.
//
// Memory::kPinned: pinned host memory, ready for asynchronous copies to the
// GPU. Memory::kShared (DataLoader workers): a new shared-memory segment per
// unit, which torch sends to the main process by file descriptor without the
// copy it would otherwise make; never reused, as the main process may hold its
// batches for any time. Memory::kSharedPooled (DataLoader workers whose
// batches cross through transfer.h): slabs of shared memory (shared_slab.h)
// recycled by the BufferPool under the main process's leases, each starting
// with its lease word (kSlabHeaderBytes).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/function_ref.h"

namespace torch_shards {
class BufferPool;
}

namespace torch_shards::sources {

enum class Memory { kPageable, kPinned, kShared, kSharedPooled };

// "pageable", "pinned", "shared" or "shared_pooled"; InvalidArgument otherwise.
Memory memory_from_name(const std::string& name);

struct TensorSpec {
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
};

// What an allocation is for (the source and the rows asked for), named by
// its error; called only on failure.
using Purpose = core::FunctionRef<std::string()>;

class TensorPool {
 public:
  explicit TensorPool(Memory memory = Memory::kPageable, std::shared_ptr<BufferPool> buffers = nullptr);
  ~TensorPool();

  Memory memory() const { return memory_; }
  // Whether its tensors cross to another process (shared memory: Memory::kShared and kSharedPooled).
  bool crosses() const { return memory_ == Memory::kShared || memory_ == Memory::kSharedPooled; }
  // Uninitialised contiguous tensors, one per spec, all views of one storage
  // (each 64-byte aligned). Every output of a read comes from here (pooled or
  // not): a storage that cannot be had (2^63 bytes or more, more than the
  // machine's memory, RAM and swap, or for shared memory than /dev/shm
  // holds, or one the allocator refuses) raises a ReadError naming
  // `purpose`, the bytes and why, before anything is written.
  std::vector<at::Tensor> allocate(const std::vector<TensorSpec>& specs, Purpose purpose);
  // Uninitialised pageable memory to stage data in before it reaches the
  // outputs (recycled like them), one tensor per spec, views of one storage.
  std::vector<at::Tensor> scratch(const std::vector<TensorSpec>& specs);

 private:
  std::vector<at::Tensor> carve(const std::vector<TensorSpec>& specs, Memory memory, Purpose purpose);

  Memory memory_;
  std::shared_ptr<BufferPool> buffers_;
};

}  // namespace torch_shards::sources
