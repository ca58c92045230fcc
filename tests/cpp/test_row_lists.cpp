#include "core/row_lists.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace torch_shards::core {
namespace {

// Frees whatever this thread keeps (a fresh start for each test, which gtest runs on one thread).
void drain() {
  while (kept_row_lists() > 0) {
    std::vector<int64_t> list = take_row_list();
    list.shrink_to_fit();  // empty: no memory, freed when let go of
    keep_row_list(std::move(list));
  }
}

TEST(RowLists, AListKeptIsHandedOutAgainEmptyWithItsMemory) {
  drain();
  std::vector<int64_t> list(65536, 7);
  const int64_t* memory = list.data();
  keep_row_list(std::move(list));
  EXPECT_EQ(kept_row_lists(), 1U);
  EXPECT_EQ(kept_row_list_bytes(), 65536 * sizeof(int64_t));
  std::vector<int64_t> again = take_row_list();
  EXPECT_TRUE(again.empty());
  again.resize(65536);
  EXPECT_EQ(again.data(), memory);  // no new pages
  EXPECT_EQ(kept_row_lists(), 0U);
  EXPECT_EQ(kept_row_list_bytes(), 0U);
  EXPECT_EQ(take_row_list().capacity(), 0U);  // none kept: a new one
}

TEST(RowLists, TheLargestKeptListIsHandedOutFirst) {
  drain();
  std::vector<int64_t> small(10), large(100000);
  const int64_t* large_memory = large.data();
  keep_row_list(std::move(large));
  keep_row_list(std::move(small));
  std::vector<int64_t> first = take_row_list();
  first.resize(100000);
  EXPECT_EQ(first.data(), large_memory);
  EXPECT_LT(take_row_list().capacity(), 100000U);
}

TEST(RowLists, AThreadKeepsAtMostSoManyListsAndBytesAndNoEmptyOnes) {
  drain();
  for (size_t i = 0; i < kKeptRowLists + 4; ++i) keep_row_list(std::vector<int64_t>(16));
  EXPECT_EQ(kept_row_lists(), kKeptRowLists);
  drain();
  keep_row_list(std::vector<int64_t>(kKeptRowListBytes / sizeof(int64_t) + 1));  // more than a thread keeps
  keep_row_list(std::vector<int64_t>());                                         // no memory
  EXPECT_EQ(kept_row_lists(), 0U);
  EXPECT_EQ(kept_row_list_bytes(), 0U);
}

TEST(RowLists, AScopedListIsKeptWhenItGoes) {
  drain();
  const int64_t* memory = nullptr;
  {
    KeptRowList part;
    part.list.assign(5000, 1);
    memory = part.list.data();
  }
  EXPECT_EQ(kept_row_lists(), 1U);
  KeptRowList next;
  EXPECT_TRUE(next.list.empty());
  next.list.resize(5000);
  EXPECT_EQ(next.list.data(), memory);
}

TEST(RowLists, TheThreadThatLetsGoOfASharedListLastKeepsIt) {
  drain();
  std::shared_ptr<std::vector<int64_t>> from_thread;
  size_t kept_there = 0;
  std::thread([&] {
    from_thread = share_row_list();
    from_thread->resize(1000);
    auto own = share_row_list();
    own->resize(1000);
    own.reset();
    kept_there = kept_row_lists();
  }).join();  // what it kept is freed as it ends
  EXPECT_EQ(kept_there, 1U);
  EXPECT_EQ(kept_row_lists(), 0U);
  from_thread.reset();  // taken there, let go of here: kept here
  EXPECT_EQ(kept_row_lists(), 1U);
  drain();
}

}  // namespace
}  // namespace torch_shards::core
