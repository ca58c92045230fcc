#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "loader/buffer_pool.h"

#include <ATen/ops/empty.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>

#include "core/errors.h"
#include "io/file.h"
#include "loader/shared_slab.h"
#include "loader/transfer.h"

namespace torch_shards {
namespace {

// Sizes rounded up to an eighth of their power of two (at least a page):
// units of slightly different sizes share a class, wasting at most 12.5%.
size_t size_class(size_t bytes) {
  constexpr size_t kPage = 4096;
  if (bytes <= kPage) return kPage;
  const int top = 63 - __builtin_clzll(static_cast<unsigned long long>(bytes));
  const size_t step = std::max<size_t>(kPage, size_t{1} << std::max(0, top - 3));
  return (bytes + step - 1) / step * step;
}

// Large pageable storages ask for transparent huge pages (where the kernel
// leaves that to madvise, its default): a fetch's rows land at scattered
// places in tens or hundreds of MB, and with 4 KB pages nearly every row
// written misses the TLB (batch 4096 of 8 KB rows: 512 MB fetches, ~10% of
// the copy rate). Before the first touch, so the pages are made huge then.
void ask_for_huge_pages(void* data, size_t bytes) {
#ifdef MADV_HUGEPAGE
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (bytes < 2 * kHuge) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // a hint only
#endif
}

c10::Storage allocate(size_t bytes, sources::Memory memory) {
  if (memory == sources::Memory::kSharedPooled) return new_slab(bytes);  // zeroed: no lease yet
  const bool pinned = memory == sources::Memory::kPinned;
  c10::Storage storage =
      at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).pinned_memory(pinned)).storage();
  if (!pinned) ask_for_huge_pages(storage.mutable_data(), bytes);
  return storage;
}

}  // namespace

BufferPool::BufferPool(int64_t budget_bytes)
    : budget_(std::max<int64_t>(budget_bytes, 0)), owner_pid_(io::current_process_id()) {}

BufferPool::~BufferPool() { adopt_if_forked(); }

void BufferPool::adopt_if_forked() {
  const int pid = io::current_process_id();
  int owner = owner_pid_.load(std::memory_order_acquire);
  // The first of this process's threads to get here adopts; the others wait for it.
  while (owner != pid) {
    if (owner != kAdopting && owner_pid_.compare_exchange_weak(owner, kAdopting, std::memory_order_acquire)) {
      adopt_after_fork();
      owner_pid_.store(pid, std::memory_order_release);
      return;
    }
    std::this_thread::yield();
    owner = owner_pid_.load(std::memory_order_acquire);
  }
}

void BufferPool::adopt_after_fork() {
  // The parent's threads (and whoever held the lock) do not exist here: never
  // touch the inherited lock, nor the inherited list, which a parent thread
  // may have been changing at the fork. Its storages are the parent's: they
  // are left as they are (their pages are copies the child never touches; no
  // destructor runs, so none touches CUDA's or Python's state without its lock).
  (void)sync_.release();
  sync_ = std::make_unique<Sync>();
  auto* abandoned = new std::vector<Kept>();
  std::swap(*abandoned, kept_);  // exchanges the three pointers only; never freed
  kept_bytes_ = 0;
  largest_ = 0;
}

bool BufferPool::is_free(const Kept& kept) {
  // Only the pool holds it: every tensor (and batch) viewing it is gone, on whatever thread it died,
  // and, for a slab, the main process gave back every lease on it.
  return kept.storage.use_count() == 1 && kept.storage.data() == kept.data &&
         (kept.memory != sources::Memory::kSharedPooled || leases(kept.storage) == 0);
}

c10::Storage BufferPool::acquire(size_t bytes, sources::Memory memory) {
  core::check_argument(memory != sources::Memory::kShared, "BufferPool: shared memory is never pooled (",
                       "kSharedPooled is, under leases)");
  adopt_if_forked();
  const size_t wanted = size_class(bytes);
  // Storages let go of are freed after the lock: one Python saw gives back its Python object then,
  // which takes the GIL.
  std::vector<c10::Storage> released;
  std::lock_guard<std::mutex> lock(sync_->mutex);
  largest_ = std::max(largest_, wanted);
  // Storages whose memory moved (to be sent elsewhere) are no longer ours to reuse.
  for (auto it = kept_.begin(); it != kept_.end();) {
    if (it->storage.data() != it->data) {
      kept_bytes_ -= it->size_class;
      released.push_back(std::move(it->storage));
      it = kept_.erase(it);
    } else {
      ++it;
    }
  }
  // The most recently used free storage of the class: its pages are the likeliest to be in cache.
  Kept* best = nullptr;
  for (Kept& kept : kept_) {
    if (kept.memory == memory && kept.size_class == wanted && is_free(kept) &&
        (best == nullptr || kept.last_use > best->last_use)) {
      best = &kept;
    }
  }
  if (best != nullptr) {
    best->last_use = ++clock_;
    ++counts_.reuses;
    return best->storage;
  }
  // Room for a new one: the least recently used free storages go first.
  const size_t limit = static_cast<size_t>(budget_) + 3 * largest_;
  while (kept_bytes_ + wanted > limit) {
    auto victim = kept_.end();
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if (is_free(*it) && (victim == kept_.end() || it->last_use < victim->last_use)) victim = it;
    }
    if (victim == kept_.end()) break;
    kept_bytes_ -= victim->size_class;
    released.push_back(std::move(victim->storage));
    kept_.erase(victim);
  }
  c10::Storage storage = allocate(wanted, memory);
  ++counts_.allocations;
  // Beyond the budget (the consumer holds the rest), a storage is freed when dropped; but a slab only
  // once the main process gave back its leases (it may not have mapped it yet): kept until then.
  const bool over = kept_bytes_ + wanted > limit;
  if (over) ++counts_.untracked;
  if (!over || memory == sources::Memory::kSharedPooled) {
    kept_.push_back(Kept{storage, storage.data(), memory, wanted, ++clock_});
    kept_bytes_ += wanted;
  }
  return storage;
}

BufferPool::Stats BufferPool::stats() const {
  if (owner_pid_ != io::current_process_id()) return Stats{};
  std::lock_guard<std::mutex> lock(sync_->mutex);
  Stats out = counts_;
  out.kept_bytes = static_cast<int64_t>(kept_bytes_);
  out.kept = static_cast<int64_t>(kept_.size());
  return out;
}

FencedBuffers::FencedBuffers(sources::Memory memory, int64_t bound_bytes)
    : memory_(memory), bound_(std::max<int64_t>(bound_bytes, 0)), pool_(bound_) {
  core::check_argument(memory == sources::Memory::kPinned || memory == sources::Memory::kPageable,
                       "FencedBuffers: staging memory is pinned or pageable");
}

FencedBuffers::~FencedBuffers() {
  for (InFlight& copy : in_flight_) {
    try {
      copy.fence->wait();
    } catch (...) {  // a device that failed: nothing is left to wait for
    }
  }
}

void FencedBuffers::reclaim() {
  // In order: a copy stream runs its copies in the order they were queued.
  while (!in_flight_.empty() && in_flight_.front().fence->done()) {
    in_flight_bytes_ -= in_flight_.front().bytes;
    in_flight_.pop_front();  // the storage's last holder but the pool: free for it again
  }
}

c10::Storage FencedBuffers::acquire(size_t bytes) {
  reclaim();
  while (!in_flight_.empty() && in_flight_bytes_ + bytes > static_cast<size_t>(bound_)) {
    ++counts_.waits;
    in_flight_.front().fence->wait();
    reclaim();
  }
  const BufferPool::Stats before = pool_.stats();
  c10::Storage storage = pool_.acquire(bytes, memory_);
  const BufferPool::Stats after = pool_.stats();
  counts_.allocations += after.allocations - before.allocations;
  counts_.reuses += after.reuses - before.reuses;
  return storage;
}

void FencedBuffers::retire(c10::Storage storage, std::unique_ptr<Fence> fence, std::vector<c10::Storage> keep) {
  const size_t bytes = storage ? storage.nbytes() : 0;
  in_flight_.push_back(InFlight{std::move(storage), std::move(keep), std::move(fence), bytes});
  in_flight_bytes_ += bytes;
  counts_.peak_in_flight_bytes = std::max(counts_.peak_in_flight_bytes, static_cast<int64_t>(in_flight_bytes_));
}

FencedBuffers::Stats FencedBuffers::stats() const {
  Stats out = counts_;
  out.in_flight = static_cast<int64_t>(in_flight_.size());
  out.in_flight_bytes = static_cast<int64_t>(in_flight_bytes_);
  return out;
}

}  // namespace torch_shards
