// The device stage's host side, on the CPU (csrc/loader/device_stage.h,
// buffer_pool.h): staging memory recycled under fences (never handed out
// again while its copy may still run, the bytes in flight within the bound,
// no allocation per batch after the first rounds), and a batch staged into
// one storage and cut back into tensors (CSR as a sparse CSR tensor). Host
// fences stand for the CUDA events; the copy to the GPU itself runs in
// tests/test_device.py on a GPU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "loader/buffer_pool.h"
#include "loader/device_stage.h"

namespace torch_shards {
namespace {

// A copy that ends when the test says so, or when waited for (a waited-for copy runs to its end).
struct HostFence : Fence {
  std::shared_ptr<bool> finished = std::make_shared<bool>(false);
  std::shared_ptr<int> waited = std::make_shared<int>(0);
  bool done() override { return *finished; }
  void wait() override {
    ++*waited;
    *finished = true;
  }
};

std::unique_ptr<HostFence> fence_for(std::shared_ptr<bool>& finished) {
  auto fence = std::make_unique<HostFence>();
  finished = fence->finished;
  return fence;
}

TEST(FencedBuffers, AStorageIsNeverHandedOutWhileItsCopyIsPending) {
  FencedBuffers buffers(sources::Memory::kPageable, 1 << 20);
  std::shared_ptr<bool> first_done;
  c10::Storage first = buffers.acquire(100'000);
  const void* first_data = first.data();
  buffers.retire(std::move(first), fence_for(first_done));
  for (int i = 0; i < 5; ++i) {  // the copy still runs: every storage handed out is another one
    std::shared_ptr<bool> done;
    c10::Storage other = buffers.acquire(100'000);
    EXPECT_NE(other.data(), first_data);
    buffers.retire(std::move(other), fence_for(done));
    *done = true;
  }
  EXPECT_EQ(buffers.stats().in_flight, 6);
  *first_done = true;  // the first copy ended (and every later one)
  buffers.reclaim();
  EXPECT_EQ(buffers.stats().in_flight, 0);
  EXPECT_EQ(buffers.stats().in_flight_bytes, 0);
}

TEST(FencedBuffers, FencesAreReleasedInOrder) {
  FencedBuffers buffers(sources::Memory::kPageable, 1 << 20);
  std::shared_ptr<bool> a, b;
  buffers.retire(buffers.acquire(4096), fence_for(a));
  buffers.retire(buffers.acquire(4096), fence_for(b));
  *b = true;  // a later copy cannot end before an earlier one on one stream: nothing is released yet
  buffers.reclaim();
  EXPECT_EQ(buffers.stats().in_flight, 2);
  *a = true;
  buffers.reclaim();
  EXPECT_EQ(buffers.stats().in_flight, 0);
}

TEST(FencedBuffers, TheBoundIsRespectedAndNoAllocationFollowsTheFirstRounds) {
  constexpr size_t kBatch = 64 << 10;
  FencedBuffers buffers(sources::Memory::kPageable, 4 * kBatch);
  std::vector<std::pair<std::shared_ptr<bool>, const void*>> copies;  // they end only when the stage waits
  int64_t allocations_after_warm_up = -1;
  for (int round = 0; round < 200; ++round) {
    c10::Storage storage = buffers.acquire(kBatch);
    for (const auto& [done, data] : copies) EXPECT_TRUE(*done || data != storage.data());  // never a pending one
    std::memset(storage.mutable_data(), round & 0xff, kBatch);  // the host writes the next batch into it
    std::shared_ptr<bool> done;
    copies.emplace_back(nullptr, storage.data());
    buffers.retire(std::move(storage), fence_for(done));
    copies.back().first = done;
    EXPECT_LE(buffers.stats().in_flight_bytes, static_cast<int64_t>(4 * kBatch));
    if (round == 20) allocations_after_warm_up = buffers.stats().allocations;
  }
  const FencedBuffers::Stats stats = buffers.stats();
  EXPECT_LE(stats.peak_in_flight_bytes, static_cast<int64_t>(4 * kBatch));
  EXPECT_EQ(stats.allocations, allocations_after_warm_up);  // none per batch after warm-up
  EXPECT_LE(stats.allocations, 5);
  EXPECT_GT(stats.reuses, 190);
  EXPECT_GT(stats.waits, 190);  // the copies never ended by themselves: each acquire waited for the oldest
}

TEST(FencedBuffers, ABatchLargerThanTheBoundStillGoesOneAtATime) {
  FencedBuffers buffers(sources::Memory::kPageable, 0);
  for (int i = 0; i < 3; ++i) {
    std::shared_ptr<bool> done;
    buffers.retire(buffers.acquire(10'000), fence_for(done));
    EXPECT_EQ(buffers.stats().in_flight, 1);
  }
  EXPECT_EQ(buffers.stats().waits, 2);
}

TEST(FencedBuffers, HeldStoragesAreKeptUntilTheFence) {
  FencedBuffers buffers(sources::Memory::kPageable, 1 << 20);
  at::Tensor host = at::arange(10, at::kFloat);
  const c10::Storage storage = host.storage();
  std::shared_ptr<bool> done;
  buffers.retire(c10::Storage(), fence_for(done), {storage});
  EXPECT_EQ(storage.use_count(), 3);              // host, ours, the in-flight list
  EXPECT_EQ(buffers.stats().in_flight_bytes, 0);  // held, not staged: not counted in the bound
  *done = true;
  buffers.reclaim();
  EXPECT_EQ(storage.use_count(), 2);
}

TEST(FencedBuffers, RefusesSharedMemory) { EXPECT_ANY_THROW(FencedBuffers(sources::Memory::kShared, 1 << 20)); }

Batch mixed_batch() {
  Batch batch;
  batch.insert("X", at::arange(24, at::kFloat).reshape({4, 6}).t());  // not contiguous
  batch.insert("index", at::arange(6, at::kLong) + 100);
  const at::Tensor dense = at::tensor({0.f, 1.5f, 0.f, 0.f, 2.f, 3.f, 0.f, 0.f, 0.f, 4.f, 0.f, 0.f}).reshape({3, 4});
  batch.insert("counts", dense.to_sparse_csr());
  batch.insert("empty", at::empty({0, 5}, at::kDouble));
  batch.insert("flags", at::arange(3, at::kLong).remainder(2).eq(0));  // bool
  return batch;
}

void expect_same(const Batch& got, const Batch& expected) {
  ASSERT_EQ(got.size(), expected.size());
  for (const auto& field : expected) {
    const at::Tensor& a = got.at(field.key());
    const at::Tensor& b = field.value();
    EXPECT_EQ(a.layout(), b.layout()) << field.key();
    EXPECT_EQ(a.scalar_type(), b.scalar_type()) << field.key();
    EXPECT_EQ(a.sizes(), b.sizes()) << field.key();
    if (b.layout() == at::kSparseCsr) {
      EXPECT_TRUE(at::equal(a.crow_indices(), b.crow_indices()));
      EXPECT_TRUE(at::equal(a.col_indices(), b.col_indices()));
      EXPECT_TRUE(at::equal(a.values(), b.values()));
      EXPECT_TRUE(at::equal(a.to_dense(), b.to_dense()));
    } else {
      EXPECT_TRUE(at::equal(a, b)) << field.key();
    }
  }
}

TEST(StagedBatch, OneStorageHoldsEveryFieldAndCutsBackIntoTheBatch) {
  FencedBuffers buffers(sources::Memory::kPageable, 1 << 20);
  const Batch host = mixed_batch();
  const StagedBatch staged = stage_batch(host, buffers);
  ASSERT_EQ(staged.fields.size(), 5u);
  EXPECT_TRUE(staged.fields[2].csr);
  EXPECT_EQ(staged.fields[2].pieces.size(), 3u);  // row offsets, column indices, values
  for (const auto& field : staged.fields) {
    for (const auto& piece : field.pieces) EXPECT_EQ(piece.offset % 64, 0u);
  }
  EXPECT_GE(staged.storage.nbytes(), staged.bytes);
  // As the device gets it: the staged bytes copied elsewhere in one transfer, then cut.
  at::Tensor bytes = at::empty({0}, at::kByte);
  bytes.set_(staged.storage, 0, {static_cast<int64_t>(staged.bytes)}, {1});
  const at::Tensor copied = bytes.clone();
  const Batch out = unstage(staged, copied);
  expect_same(out, host);
  EXPECT_EQ(out.at("counts").layout(), at::kSparseCsr);
  bytes.fill_(0);  // the staging memory reused: the cut batch is the copy's, not the staging's
  expect_same(out, host);
}

TEST(StagedBatch, StagingStoragesAreRecycledAcrossBatches) {
  FencedBuffers buffers(sources::Memory::kPageable, 1 << 20);
  std::shared_ptr<bool> previous;  // the last batch's copy: it ends while the next batch is staged
  for (int round = 0; round < 50; ++round) {
    const Batch host = mixed_batch();
    StagedBatch staged = stage_batch(host, buffers);
    at::Tensor bytes = at::empty({0}, at::kByte);
    bytes.set_(staged.storage, 0, {static_cast<int64_t>(staged.bytes)}, {1});
    expect_same(unstage(staged, bytes.clone()), host);
    bytes.reset();
    if (previous) *previous = true;
    buffers.retire(std::move(staged.storage), fence_for(previous));
  }
  EXPECT_LE(buffers.stats().allocations, 2);  // two in flight at most: two storages, reused
  EXPECT_GE(buffers.stats().reuses, 48);
}

TEST(StagedBatch, UnstageRefusesTooFewBytes) {
  FencedBuffers buffers(sources::Memory::kPageable, 1 << 20);
  const StagedBatch staged = stage_batch(mixed_batch(), buffers);
  EXPECT_ANY_THROW(unstage(staged, at::empty({8}, at::kByte)));
}

}  // namespace
}  // namespace torch_shards
