// Fetch sorting: sort_rows must agree with std::sort on every input a plan can
// produce (block runs, duplicates from weighted draws, any row magnitude),
// whichever of its two paths it takes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/radix_sort.h"
#include "core/random.h"

namespace torch_shards::core {
namespace {

std::vector<int64_t> random_rows(size_t n, uint64_t bound, uint64_t key) {
  std::vector<int64_t> rows(n);
  for (size_t i = 0; i < n; ++i) rows[i] = static_cast<int64_t>(mix64(key + i) % bound);
  return rows;
}

void expect_sorts(std::vector<int64_t> rows) {
  std::vector<int64_t> expected = rows;
  std::sort(expected.begin(), expected.end());
  std::vector<int64_t> scratch;
  sort_rows(rows, scratch);
  EXPECT_EQ(rows, expected) << "n=" << expected.size();
}

TEST(SortRows, MatchesStdSortOnRandomRowsOfAnySizeAndMagnitude) {
  const uint64_t bounds[] = {1,
                             2,
                             1000,
                             uint64_t{1} << 11,
                             (uint64_t{1} << 11) + 1,
                             1000000000,
                             uint64_t{1} << 40,
                             uint64_t{1} << 62,
                             uint64_t{INT64_MAX}};
  for (size_t n : {0, 1, 2, 7, 8, 9, 255, 256, 257, 1000, 4096, 10007}) {
    for (uint64_t bound : bounds) expect_sorts(random_rows(n, bound, n * 31 + bound));
  }
}

TEST(SortRows, MatchesStdSortOnShuffledBlockRuns) {
  // Blocks of consecutive rows in a shuffled order: the run-ordering path.
  for (int64_t block : {1, 4, 8, 16, 64}) {
    for (int64_t num_blocks : {1, 2, 3, 50, 300}) {
      std::vector<int64_t> rows;
      for (int64_t b = 0; b < num_blocks; ++b) {
        const int64_t first = static_cast<int64_t>(mix64(static_cast<uint64_t>(b)) % 1000000) * 100;
        for (int64_t t = 0; t < block; ++t) rows.push_back(first + t);
      }
      expect_sorts(rows);
    }
  }
}

TEST(SortRows, MatchesStdSortWhenRunsOverlapOrRepeat) {
  // Weighted draws repeat rows; runs may overlap or touch.
  std::vector<int64_t> repeated;
  for (int r = 0; r < 4; ++r) {
    for (int64_t t = 0; t < 64; ++t) repeated.push_back(500 + t);
  }
  expect_sorts(repeated);
  std::vector<int64_t> overlapping;
  for (int64_t t = 0; t < 64; ++t) overlapping.push_back(100 + t);
  for (int64_t t = 0; t < 64; ++t) overlapping.push_back(50 + t);
  expect_sorts(overlapping);
  std::vector<int64_t> touching;
  for (int64_t t = 0; t < 64; ++t) touching.push_back(164 + t);
  for (int64_t t = 0; t < 64; ++t) touching.push_back(100 + t);
  expect_sorts(touching);
  expect_sorts(std::vector<int64_t>(1000, 7));
  expect_sorts(std::vector<int64_t>{3, 3, 3, 2, 2, 1, 1, 1, 0});
}

TEST(SortRows, RunPathRefusesOverlappingRunsAndLeavesRowsUntouched) {
  std::vector<int64_t> rows;
  for (int64_t t = 0; t < 32; ++t) rows.push_back(100 + t);
  for (int64_t t = 0; t < 32; ++t) rows.push_back(90 + t);
  const auto original = rows;
  std::vector<int64_t> scratch;
  EXPECT_FALSE(sort_disjoint_runs(rows, scratch));
  EXPECT_EQ(rows, original);
  // Too many runs (more than one per 8 rows) is refused too.
  std::vector<int64_t> scattered = random_rows(64, 1000000, 3);
  const auto scattered_original = scattered;
  EXPECT_FALSE(sort_disjoint_runs(scattered, scratch));
  EXPECT_EQ(scattered, scattered_original);
  // Disjoint runs are accepted and sorted.
  std::vector<int64_t> runs;
  for (int64_t t = 0; t < 32; ++t) runs.push_back(200 + t);
  for (int64_t t = 0; t < 32; ++t) runs.push_back(10 + t);
  EXPECT_TRUE(sort_disjoint_runs(runs, scratch));
  EXPECT_TRUE(std::is_sorted(runs.begin(), runs.end()));
  EXPECT_EQ(runs.size(), 64u);
}

TEST(SortRows, RadixSortMatchesStdSortAboveItsSmallInputCutoff) {
  for (size_t n : {256, 257, 5000}) {
    for (uint64_t bound : {uint64_t{3}, uint64_t{1} << 22, uint64_t{1} << 33, uint64_t{INT64_MAX}}) {
      auto rows = random_rows(n, bound, bound ^ n);
      auto expected = rows;
      std::sort(expected.begin(), expected.end());
      std::vector<int64_t> scratch;
      radix_sort_rows(rows, scratch);
      EXPECT_EQ(rows, expected) << "n=" << n << " bound=" << bound;
    }
  }
}

TEST(SortRows, RadixSortFromABitSortsValuesWhoseLowerBitsAreInOrder) {
  // Keys of a row and a position below bit 13, listed by position: sorting on the rows' bits alone
  // orders the whole keys (equal rows keep their positions' order).
  for (uint64_t bound : {uint64_t{1}, uint64_t{50}, uint64_t{1} << 30}) {
    const auto rows = random_rows(5000, bound, bound + 11);
    std::vector<int64_t> keys;
    for (size_t i = 0; i < rows.size(); ++i) keys.push_back((rows[i] << 13) | static_cast<int64_t>(i));
    auto expected = keys;
    std::sort(expected.begin(), expected.end());
    std::vector<int64_t> scratch;
    radix_sort_rows(keys, scratch, 13);
    EXPECT_EQ(keys, expected) << "bound=" << bound;
  }
}

// The positions std::stable_sort gives: ascending rows, equal rows in their order.
std::vector<int64_t> stable_positions(const std::vector<int64_t>& rows) {
  std::vector<int64_t> order(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return rows[a] < rows[b]; });
  return order;
}

TEST(SortPositionsByRow, MatchesStableSortOnBothPaths) {
  // Small rows carry their position in the key (radix path); rows near 2^63 leave no room for it
  // (std::stable_sort path). Duplicates check that equal rows keep their order.
  for (size_t n : {0, 1, 2, 3, 255, 256, 4096, 5000}) {
    for (uint64_t bound : {uint64_t{1}, uint64_t{7}, uint64_t{100000}, uint64_t{1} << 40, uint64_t{INT64_MAX}}) {
      const auto rows = random_rows(n, bound, bound * 7 + n);
      std::vector<int64_t> order, scratch;
      sort_positions_by_row(rows, order, scratch);
      EXPECT_EQ(order, stable_positions(rows)) << "n=" << n << " bound=" << bound;
    }
  }
  // A shuffled fetch of block runs, the order a reader meets.
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < 64; ++b) {
    for (int64_t t = 0; t < 64; ++t)
      rows.push_back(static_cast<int64_t>(mix64(static_cast<uint64_t>(b)) % 1000) * 64 + t);
  }
  for (size_t i = rows.size() - 1; i > 0; --i) std::swap(rows[i], rows[mix64(i) % (i + 1)]);
  std::vector<int64_t> order, scratch;
  sort_positions_by_row(rows, order, scratch);
  EXPECT_EQ(order, stable_positions(rows));
}

}  // namespace
}  // namespace torch_shards::core
