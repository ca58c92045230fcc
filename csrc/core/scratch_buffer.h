// Scratch memory kept between calls: grown on demand, never zero-filled (a
// decode that fails early touches little of it). One per thread and use:
//   thread_local core::ScratchBuffer chunk;
//   uint8_t* decoded = chunk.get(chunk_bytes);
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace torch_shards::core {

class ScratchBuffer {
 public:
  // At least `bytes` bytes, valid until the next get().
  uint8_t* get(size_t bytes) {
    if (capacity_ < bytes) {
      data_.reset();  // the old buffer goes first: a failed allocation leaves none, not a wrong capacity
      capacity_ = 0;
      data_.reset(new uint8_t[bytes]);
      capacity_ = bytes;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t capacity_ = 0;
};

}  // namespace torch_shards::core
