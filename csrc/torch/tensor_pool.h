// Output tensors of one reader, recycled once nobody else holds them.
//
// A fetch's output (tens of MB) freshly allocated every time costs page
// faults and kernel zeroing on every fetch. The pool keeps the storages it
// handed out and reuses one when the reader holds the only reference again
// (every batch view of it is gone). A storage whose memory changed since it
// was handed out (a DataLoader worker moved it to shared memory to send it)
// is never reused. With pinned=true new storages are pinned host memory,
// ready for asynchronous copies to the GPU.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <vector>

namespace torch_shards::sources {

class TensorPool {
 public:
  explicit TensorPool(bool pinned = false, size_t max_kept = 8) : pinned_(pinned), max_kept_(max_kept) {}

  // An uninitialised contiguous tensor.
  at::Tensor empty(at::IntArrayRef shape, at::ScalarType dtype);
  bool pinned() const { return pinned_; }
  size_t bytes_kept() const;

 private:
  struct Kept {
    at::Storage storage;
    const void* data = nullptr;  // where the memory was when handed out
  };

  bool pinned_;
  size_t max_kept_;
  std::vector<Kept> kept_;
};

}  // namespace torch_shards::sources
