#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "loader/tensor_pool.h"

#include <ATen/StorageUtils.h>
#include <ATen/ops/empty.h>

#include <algorithm>

#include "core/errors.h"

namespace torch_shards::sources {

Memory memory_from_name(const std::string& name) {
  if (name == "pageable") return Memory::kPageable;
  if (name == "pinned") return Memory::kPinned;
  if (name == "shared") return Memory::kShared;
  throw core::InvalidArgument(core::concat("memory must be 'pageable', 'pinned' or 'shared', got '", name, "'"));
}

at::Tensor TensorPool::empty(at::IntArrayRef shape, at::ScalarType dtype) {
  int64_t numel = 1;
  for (int64_t size : shape) numel *= size;
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  if (memory_ == Memory::kShared) {
    at::Tensor tensor = at::empty({0}, at::TensorOptions().dtype(dtype));
    tensor.set_(c10::Storage(at::new_shm_fd_storage(std::max<size_t>(bytes, 1))), 0, shape);
    return tensor;
  }
  // Storages moved elsewhere (to shared memory, to send them) are never reused: let them go.
  kept_.erase(
      std::remove_if(kept_.begin(), kept_.end(), [](const Kept& kept) { return kept.storage.data() != kept.data; }),
      kept_.end());
  // Reuse a storage only we hold, big enough but not wastefully bigger.
  for (Kept& kept : kept_) {
    const size_t capacity = kept.storage.nbytes();
    if (kept.storage.use_count() == 1 && capacity >= bytes && capacity <= 2 * bytes + 4096) {
      at::Tensor tensor = at::empty({0}, at::TensorOptions().dtype(dtype));
      tensor.set_(kept.storage, 0, shape);
      return tensor;
    }
  }
  const bool pinned = memory_ == Memory::kPinned;
  at::Tensor tensor = at::empty(shape, at::TensorOptions().dtype(dtype).pinned_memory(pinned));
  if (kept_.size() == max_kept_) kept_.erase(kept_.begin());  // the oldest goes
  kept_.push_back(Kept{tensor.storage(), tensor.storage().data()});
  return tensor;
}

}  // namespace torch_shards::sources
