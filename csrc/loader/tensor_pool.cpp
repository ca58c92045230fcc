#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "loader/tensor_pool.h"

#include <ATen/StorageUtils.h>
#include <ATen/ops/empty.h>

#include <c10/util/Exception.h>
#include <sys/statvfs.h>
#include <sys/sysinfo.h>

#include <algorithm>
#include <limits>
#include <new>

#include "core/errors.h"
#include "loader/buffer_pool.h"
#include "loader/shared_slab.h"

namespace torch_shards::sources {
namespace {

constexpr size_t kAlignment = 64;

size_t aligned(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * std::max<int64_t>(shape[d], 1);
  return strides;
}

// The machine's RAM and swap: no output larger can be written (without
// swap, a larger pageable allocation fails; shared and pinned memory, or
// overcommitted memory, would be mapped and fail only as it is written).
uint64_t machine_memory() {
  static const uint64_t bytes = [] {
    struct sysinfo info {};
    uint64_t total = 0;
    if (sysinfo(&info) != 0 ||
        __builtin_mul_overflow(static_cast<uint64_t>(info.totalram) + info.totalswap, info.mem_unit, &total)) {
      return std::numeric_limits<uint64_t>::max();
    }
    return total;
  }();
  return bytes;
}

// The size of the tmpfs that shared memory (shm_open) comes from: torch maps
// a larger segment, and writing past the filesystem's size raises SIGBUS.
uint64_t shared_memory_size() {
  struct statvfs fs {};
  uint64_t total = 0;
  if (statvfs("/dev/shm", &fs) != 0 || __builtin_mul_overflow(fs.f_blocks, fs.f_frsize, &total)) {
    return std::numeric_limits<uint64_t>::max();
  }
  return total;
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

TensorPool::TensorPool(Memory memory, std::shared_ptr<BufferPool> buffers)
    : memory_(memory), buffers_(std::move(buffers)) {}

TensorPool::~TensorPool() = default;

std::vector<at::Tensor> TensorPool::carve(const std::vector<TensorSpec>& specs, Memory memory, Purpose purpose) {
  // Slabs start with their lease word (shared_slab.h).
  const bool leased = buffers_ && memory == Memory::kSharedPooled;
  // torch's shared memory lives in /dev/shm (slabs do not: it may be small, as in containers).
  const bool in_dev_shm = memory == Memory::kShared || (memory == Memory::kSharedPooled && !buffers_);
  std::vector<size_t> offsets;
  uint64_t total = leased ? kSlabHeaderBytes : 0;
  bool overflow = false;  // shapes are checked where they are made; a read's rows may repeat (weighted sampling)
  for (const TensorSpec& spec : specs) {
    offsets.push_back(total);
    uint64_t bytes = c10::elementSize(spec.dtype);
    for (int64_t size : spec.shape) overflow |= __builtin_mul_overflow(bytes, static_cast<uint64_t>(size), &bytes);
    overflow |= bytes > std::numeric_limits<uint64_t>::max() - kAlignment ||
                __builtin_add_overflow(total, aligned(bytes), &total);
  }
  total = std::max<uint64_t>(total, kAlignment);
  const auto fail = [&](const std::string& why) {
    throw core::ReadError(core::concat(purpose(), ": cannot allocate its output",
                                       overflow ? "" : core::concat(" of ", total, " bytes"), ": ", why));
  };
  if (overflow || total > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) fail("2^63 bytes or more");
  if (total > machine_memory()) {
    fail(core::concat("more than this machine's memory (", machine_memory(), " bytes of RAM and swap)"));
  }
  if (in_dev_shm && total > shared_memory_size()) {
    fail(core::concat("more than the shared memory of /dev/shm (", shared_memory_size(), " bytes)"));
  }
  c10::Storage storage;
  try {
    storage = buffers_ && memory != Memory::kShared ? buffers_->acquire(total, memory) : plain_storage(total, memory);
  } catch (const c10::Error& error) {
    fail(error.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    fail("out of memory");
  }
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

std::vector<at::Tensor> TensorPool::allocate(const std::vector<TensorSpec>& specs, Purpose purpose) {
  return carve(specs, memory_, purpose);
}

std::vector<at::Tensor> TensorPool::scratch(const std::vector<TensorSpec>& specs) {
  return carve(specs, Memory::kPageable, [] { return std::string("staging memory of a read"); });
}

}  // namespace torch_shards::sources
