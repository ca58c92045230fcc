// Batches crossing processes as handles to slabs (csrc/loader/transfer.h,
// shared_slab.h): a forked child packs, the parent maps and rebuilds; a unit
// crosses whole and is cut where it arrives; leases come back as the views
// go; freed slabs are forgotten; a handle that names no slab is refused.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "loader/shared_slab.h"
#include "loader/transfer.h"

namespace torch_shards {
namespace {

// A batch of 8 rows of 3 floats (row r holds r * 10 + column) and its index, carved from one slab.
sources::Batch batch_in(const c10::Storage& slab) {
  const auto view = [&](at::ScalarType dtype, int64_t offset, std::vector<int64_t> sizes) {
    at::Tensor tensor = at::empty({0}, at::TensorOptions().dtype(dtype));
    std::vector<int64_t> strides(sizes.size(), 1);
    if (sizes.size() == 2) strides[0] = sizes[1];
    tensor.set_(slab, offset, sizes, strides);
    return tensor;
  };
  at::Tensor x = view(at::kFloat, kSlabHeaderBytes / 4, {8, 3});
  at::Tensor index = view(at::kLong, (kSlabHeaderBytes + 256) / 8, {8});
  index.copy_(at::arange(8, at::kLong));
  x.copy_(index.unsqueeze(1).to(at::kFloat) * 10 + at::arange(3, at::kFloat));
  sources::Batch batch;
  batch.insert("X", x);
  batch.insert("index", index);
  return batch;
}

bool intact(const sources::Batch& batch) {
  const at::Tensor expected = batch.at("index").unsqueeze(1).to(at::kFloat) * 10 + at::arange(3, at::kFloat);
  return at::equal(batch.at("X"), expected);
}

// Runs `child` in a forked process that sends the words it returns through a pipe, then waits for the
// parent's one byte before it exits (its slabs must outlive the parent's mapping of them).
struct Child {
  pid_t pid = -1;
  int to_parent[2] = {-1, -1}, to_child[2] = {-1, -1};
  std::vector<int64_t> words;

  template <typename F>
  explicit Child(F child) {
    EXPECT_EQ(pipe(to_parent), 0);
    EXPECT_EQ(pipe(to_child), 0);
    pid = fork();
    if (pid == 0) {
      close(to_parent[0]);
      close(to_child[1]);
      bool ok = false;
      try {
        const std::vector<int64_t> out = child();
        const int64_t size = static_cast<int64_t>(out.size());
        ok = write(to_parent[1], &size, 8) == 8 &&
             write(to_parent[1], out.data(), out.size() * 8) == static_cast<ssize_t>(out.size() * 8);
      } catch (const std::exception& error) {
        fprintf(stderr, "child: %s\n", error.what());
      }
      close(to_parent[1]);
      char done = 0;
      ok = ok && read(to_child[0], &done, 1) == 1;
      _exit(ok ? 0 : 1);
    }
    close(to_parent[1]);  // a child that dies before writing ends the parent's read
    close(to_child[0]);
    to_parent[1] = to_child[0] = -1;
    int64_t size = 0;
    if (read(to_parent[0], &size, 8) != 8) return;
    words.resize(static_cast<size_t>(size));
    size_t got = 0;
    while (got < words.size() * 8) {
      const ssize_t n = read(to_parent[0], reinterpret_cast<char*>(words.data()) + got, words.size() * 8 - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
  }
  int finish() {
    const char done = 1;
    EXPECT_EQ(write(to_child[1], &done, 1), 1);
    int status = 0;
    waitpid(pid, &status, 0);
    for (int fd : {to_parent[0], to_parent[1], to_child[0], to_child[1]}) {
      if (fd >= 0) close(fd);
    }
    return status;
  }
};

TEST(Transfer, ABatchPackedInAChildIsTheSameBatchMappedInTheParentAndItsLeaseComesBack) {
  const c10::Storage slab = new_slab(4096);
  ASSERT_TRUE(slab_handle(slab).has_value());
  const sources::Batch batch = batch_in(slab);
  // The child makes and packs its own slab (a slab belongs to the process that made it).
  Child child([] {
    static const c10::Storage own = new_slab(4096);  // alive until the child exits
    return pack({batch_in(own)}, 3, {5, 4}, /*last=*/false).description;
  });
  ASSERT_FALSE(child.words.empty()) << "the child sent no description";
  const int64_t maps = mapped_slab_stats().maps;
  {
    const Unpacked first = unpack(child.words, {"X", "index"}, {});
    ASSERT_EQ(first.batches.size(), 1u);
    EXPECT_TRUE(intact(first.batches[0]));
    EXPECT_EQ(first.worker, 3);
    EXPECT_EQ(first.worker_batches, (std::vector<int64_t>{5, 4}));
    const Unpacked second = unpack(child.words, {"X", "index"}, {});  // the same slab: mapped once
    EXPECT_EQ(mapped_slab_stats().maps, maps + 1);
    // Written through one process, seen by the other: one memory.
    first.batches[0].at("X").fill_(7);
    EXPECT_TRUE(at::equal(second.batches[0].at("X"), at::full({8, 3}, 7.0f)));
  }
  EXPECT_EQ(child.finish(), 0);
  // In this process, the slab's handle packs with a lease that the views give back.
  {
    const Packed packed = pack({batch}, -1, {}, false);
    EXPECT_EQ(leases(slab), 1);
    EXPECT_TRUE(packed.others.empty());
    {
      const Unpacked here = unpack(packed.description, packed.names, packed.others);
      EXPECT_TRUE(intact(here.batches[0]));
      EXPECT_EQ(leases(slab), 1);
    }
    EXPECT_EQ(leases(slab), 0);
  }
}

TEST(Transfer, AUnitCrossesWholeAndIsCutWhereItArrivesIntoTheBatchesTheWorkerWouldHaveCut) {
  const c10::Storage slab = new_slab(8192);
  sources::Batch unit = batch_in(slab);
  // A CSR field of the same 8 rows: row r holds r stored values; its rebased offsets (8 rows + 3 batches of
  // 3) set aside in the slab, as the reader sets them aside.
  const at::Tensor counts = at::arange(8, at::kLong);
  const at::Tensor crow = at::cat({at::zeros({1}, at::kLong), counts.cumsum(0)});
  const int64_t stored = crow[-1].item<int64_t>();
  const at::Tensor values = at::arange(stored, at::kFloat), columns = at::arange(stored, at::kLong) % 5;
  const auto carve = [&](const at::Tensor& source, int64_t byte_offset) {
    at::Tensor tensor = at::empty({0}, source.options());
    tensor.set_(slab, byte_offset / static_cast<int64_t>(source.itemsize()), {source.numel()}, {1});
    return tensor.copy_(source);
  };
  const int64_t base = kSlabHeaderBytes + 512;
  unit.insert("counts",
              at::_sparse_csr_tensor_unsafe(carve(crow, base), carve(columns, base + 128), carve(values, base + 512),
                                            {8, 5}, values.options().layout(at::kSparseCsr)));
  sources::Batch offsets;
  at::Tensor set_aside = at::empty({0}, at::kLong);
  set_aside.set_(slab, (base + 1024) / 8, {8 + 3}, {1});
  offsets.insert("counts", set_aside);
  // What the worker would have delivered: rows 0-2, 3-5 and 6-7 of every field (copied: the cut below
  // rebases row offsets into the slab).
  std::vector<sources::Batch> expected;
  for (int64_t first = 0; first < 8; first += 3) {
    sources::Batch rows;
    for (const auto& item : unit)
      rows.insert(item.key(), item.value().to_dense().narrow(0, first, std::min<int64_t>(3, 8 - first)).clone());
    expected.push_back(rows);
  }
  {
    const Packed packed = pack(std::vector<UnitCut>{UnitCut{unit, 3, offsets}}, -1, {}, false);
    EXPECT_EQ(leases(slab), 1);
    {
      const Unpacked back = unpack(packed.description, packed.names, packed.others);
      ASSERT_EQ(back.batches.size(), 3u);
      for (size_t b = 0; b < 3; ++b) {
        EXPECT_TRUE(intact(back.batches[b]));
        for (const auto& item : expected[b]) {
          const at::Tensor got = back.batches[b].at(item.key());
          EXPECT_TRUE(at::equal(got.to_dense(), item.value())) << "batch " << b << " field " << item.key();
        }
        // Cut from the mapped slab, not copied: the CSR values view the memory the dense fields view.
        EXPECT_EQ(back.batches[b].at("counts").values().storage().data(), back.batches[b].at("X").storage().data());
      }
      EXPECT_EQ(leases(slab), 1);
    }
    EXPECT_EQ(leases(slab), 0);  // every batch of the unit gone: the lease is back
  }
}

TEST(Transfer, ABatchOfAWorkerThatDiedInFlightSaysTheWorkerExited) {
  Child child([] {
    static const c10::Storage own = new_slab(4096);
    return pack({batch_in(own)}, 0, {}, /*last=*/false).description;
  });
  ASSERT_FALSE(child.words.empty());
  EXPECT_EQ(child.finish(), 0);  // exited (and reaped) before this process mapped its slab
  try {
    unpack(child.words, {"X", "index"}, {});
    FAIL() << "a dead worker's slab was mapped";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("exited unexpectedly"), std::string::npos) << error.what();
  }
}

TEST(Transfer, StoragesThatAreNotSlabsTravelBesideTheDescription) {
  sources::Batch batch;
  batch.insert("index", at::arange(4, at::kLong));
  const Packed packed = pack({batch}, -1, {}, false);
  ASSERT_EQ(packed.others.size(), 1u);
  const Unpacked back = unpack(packed.description, packed.names, packed.others);
  EXPECT_TRUE(at::equal(back.batches[0].at("index"), at::arange(4, at::kLong)));
}

TEST(Transfer, AFreedSlabTravelsWithTheNextDescriptionAndIsForgotten) {
  take_freed_slabs();
  int64_t id = 0;
  {
    const c10::Storage slab = new_slab(4096);
    id = slab_handle(slab)->id;
    const Packed packed = pack({batch_in(slab)}, -1, {}, false);
    const Unpacked mapped = unpack(packed.description, packed.names, packed.others);
    EXPECT_GE(mapped_slab_stats().mapped, 1);
  }
  const std::vector<int64_t> freed = take_freed_slabs();
  EXPECT_NE(std::find(freed.begin(), freed.end(), id), freed.end());
}

TEST(Transfer, TheLastDescriptionOfAnIterationLetsGoOfItsOwnersMappings) {
  const c10::Storage slab = new_slab(4096);
  const Packed packed = pack({batch_in(slab)}, -1, {}, /*last=*/true);
  const int64_t before = mapped_slab_stats().mapped;
  const Unpacked back = unpack(packed.description, packed.names, packed.others);
  EXPECT_LE(mapped_slab_stats().mapped, before);  // forgotten, yet the views keep the memory
  EXPECT_TRUE(intact(back.batches[0]));
}

TEST(Transfer, AHandleNamingNoSlabIsRefusedNamingTheProcessAndTheWayOut) {
  const c10::Storage slab = new_slab(4096);
  Packed packed = pack({batch_in(slab)}, -1, {}, false);
  // Words 5.. hold the freed count, then the slab count and the first handle (id, fd, inode, bytes).
  std::vector<int64_t>& words = packed.description;
  const size_t handle = 5 + static_cast<size_t>(words[4]) + 1;
  words[handle] += 1000000;    // an id not mapped yet
  words[handle + 1] = 987654;  // a descriptor not open
  try {
    unpack(words, packed.names, packed.others);
    FAIL() << "a handle naming no slab was followed";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("/fd/987654"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("worker_transport='torch'"), std::string::npos) << error.what();
  }
  words[0] = 1;
  EXPECT_THROW(unpack(words, packed.names, packed.others), c10::ValueError);
}

}  // namespace
}  // namespace torch_shards
