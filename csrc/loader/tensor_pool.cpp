#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "loader/tensor_pool.h"

#include <ATen/StorageUtils.h>
#include <ATen/ops/empty.h>

#include <algorithm>

#include "core/errors.h"
#include "loader/buffer_pool.h"
#include "loader/transfer.h"

namespace torch_shards::sources {
namespace {

constexpr size_t kAlignment = 64;

size_t aligned(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * std::max<int64_t>(shape[d], 1);
  return strides;
}

c10::Storage plain_storage(size_t bytes, Memory memory) {
  // Shared memory is never reused: the main process may hold its batches for any time.
  if (memory == Memory::kShared || memory == Memory::kSharedPooled) {
    return c10::Storage(at::new_shm_fd_storage(std::max<size_t>(bytes, 1)));
  }
  return at::empty({static_cast<int64_t>(bytes)},
                   at::TensorOptions().dtype(at::kByte).pinned_memory(memory == Memory::kPinned))
      .storage();
}

}  // namespace

Memory memory_from_name(const std::string& name) {
  if (name == "pageable") return Memory::kPageable;
  if (name == "pinned") return Memory::kPinned;
  if (name == "shared") return Memory::kShared;
  if (name == "shared_pooled") return Memory::kSharedPooled;
  throw core::InvalidArgument(
      core::concat("memory must be 'pageable', 'pinned', 'shared' or 'shared_pooled', got '", name, "'"));
}

size_t TensorSpec::bytes() const {
  int64_t count = 1;
  for (int64_t size : shape) count *= size;
  return static_cast<size_t>(count) * c10::elementSize(dtype);
}

TensorPool::TensorPool(Memory memory, std::shared_ptr<BufferPool> buffers)
    : memory_(memory), buffers_(std::move(buffers)) {}

TensorPool::~TensorPool() = default;

std::vector<at::Tensor> TensorPool::carve(const std::vector<TensorSpec>& specs, Memory memory) {
  // Pooled shared storages start with their lease word (transfer.h).
  const bool leased = buffers_ && memory == Memory::kSharedPooled;
  std::vector<size_t> offsets;
  size_t total = leased ? kLeaseHeaderBytes : 0;
  for (const TensorSpec& spec : specs) {
    offsets.push_back(total);
    total += aligned(spec.bytes());
  }
  total = std::max<size_t>(total, kAlignment);
  c10::Storage storage =
      buffers_ && memory != Memory::kShared ? buffers_->acquire(total, memory) : plain_storage(total, memory);
  std::vector<at::Tensor> out;
  out.reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& spec = specs[i];
    at::Tensor tensor = at::empty({0}, at::TensorOptions().dtype(spec.dtype));
    tensor.set_(storage, static_cast<int64_t>(offsets[i] / c10::elementSize(spec.dtype)), spec.shape,
                contiguous_strides(spec.shape));
    out.push_back(std::move(tensor));
  }
  return out;
}

std::vector<at::Tensor> TensorPool::allocate(const std::vector<TensorSpec>& specs) { return carve(specs, memory_); }

at::Tensor TensorPool::empty(at::IntArrayRef shape, at::ScalarType dtype) {
  return allocate({TensorSpec{std::vector<int64_t>(shape.begin(), shape.end()), dtype}}).front();
}

std::vector<at::Tensor> TensorPool::scratch(const std::vector<TensorSpec>& specs) {
  return carve(specs, Memory::kPageable);
}

}  // namespace torch_shards::sources
