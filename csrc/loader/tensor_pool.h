// Output tensors of one reader, in the memory their consumer needs.
//
// A fetch's output (tens of MB) freshly allocated every time costs page
// faults and kernel zeroing on every fetch. The pool keeps the storages it
// handed out and reuses one when the reader holds the only reference again
// (every batch view of it is gone). A storage whose memory changed since it
// was handed out (a DataLoader worker moved it to shared memory to send it)
// is never reused.
//
// Memory::kPinned: new storages are pinned host memory, ready for
// asynchronous copies to the GPU. Memory::kShared (DataLoader workers): new
// storages are shared memory that torch sends to the main process by file
// descriptor, without the copy it would otherwise make; they are never
// reused, as the main process may hold their batches for any time.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <string>
#include <vector>

namespace torch_shards::sources {

enum class Memory { kPageable, kPinned, kShared };

// "pageable", "pinned" or "shared"; InvalidArgument otherwise.
Memory memory_from_name(const std::string& name);

class TensorPool {
 public:
  explicit TensorPool(Memory memory = Memory::kPageable, size_t max_kept = 8) : memory_(memory), max_kept_(max_kept) {}

  // An uninitialised contiguous tensor.
  at::Tensor empty(at::IntArrayRef shape, at::ScalarType dtype);

 private:
  struct Kept {
    at::Storage storage;
    const void* data = nullptr;  // where the memory was when handed out
  };

  Memory memory_;
  size_t max_kept_;
  std::vector<Kept> kept_;
};

}  // namespace torch_shards::sources
