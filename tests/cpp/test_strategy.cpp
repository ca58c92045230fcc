// Strategies and their plans: what each epoch visits, that it depends only on
// (strategy, N, seed, epoch), that any range of it can be evaluated alone, and
// that every invalid parameter is refused with a message naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/strategy.h"
#include "statistics.h"

namespace torch_shards::core {
namespace {

using stats::chi_square;
using stats::chi_square_bound;
using stats::normalised;

std::vector<int64_t> fill_range(const SamplingPlan& plan, uint64_t seed, int64_t epoch, int64_t begin, int64_t count) {
  std::vector<int64_t> rows(static_cast<size_t>(count), -1);
  plan.fill(seed, epoch, begin, count, rows.data());
  return rows;
}

std::vector<int64_t> whole_plan(const SamplingPlan& plan, uint64_t seed, int64_t epoch) {
  return fill_range(plan, seed, epoch, 0, plan.size());
}

std::vector<int64_t> iota(int64_t n, int64_t first = 0) {
  std::vector<int64_t> out(static_cast<size_t>(n));
  std::iota(out.begin(), out.end(), first);
  return out;
}

std::vector<int64_t> sorted(std::vector<int64_t> values) {
  std::sort(values.begin(), values.end());
  return values;
}

std::vector<int64_t> histogram(const std::vector<int64_t>& rows, int64_t num_rows) {
  std::vector<int64_t> counts(static_cast<size_t>(num_rows), 0);
  for (int64_t row : rows) ++counts.at(static_cast<size_t>(row));
  return counts;
}

// Every fill of a sub-range equals the same slice of the whole plan.
void expect_ranges_match_whole(const SamplingPlan& plan, uint64_t seed, int64_t epoch) {
  const auto whole = whole_plan(plan, seed, epoch);
  const int64_t size = plan.size();
  const int64_t step = std::max<int64_t>(1, size / 23);
  for (int64_t begin = 0; begin < size; begin += step) {
    for (int64_t count : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{7}, int64_t{16}, size - begin}) {
      if (begin + count > size) continue;
      const auto part = fill_range(plan, seed, epoch, begin, count);
      ASSERT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + begin))
          << "range [" << begin << ", " << begin + count << ") differs from the whole plan";
    }
  }
}

// Whether rows (a plan over the sorted subset `rows_sorted`) is a sequence of
// whole blocks of block_size consecutive subset positions (the last block of
// the subset possibly short). Returns the plan position of the short block, or
// -1 if every block is full.
int64_t expect_contiguous_blocks(const std::vector<int64_t>& plan, const std::vector<int64_t>& rows_sorted,
                                 int64_t block_size) {
  std::map<int64_t, int64_t> position_of;
  for (size_t p = 0; p < rows_sorted.size(); ++p) position_of[rows_sorted[p]] = static_cast<int64_t>(p);
  const int64_t size = static_cast<int64_t>(rows_sorted.size());
  int64_t short_at = -1;
  size_t i = 0;
  while (i < plan.size()) {
    const int64_t first = position_of.at(plan[i]);
    EXPECT_EQ(first % block_size, 0) << "plan position " << i << " starts inside a block";
    if (first % block_size != 0) return short_at;
    const int64_t length = std::min(block_size, size - first);
    if (length < block_size) short_at = static_cast<int64_t>(i);
    for (int64_t t = 0; t < length; ++t) {
      EXPECT_LT(i + t, plan.size());
      if (i + t >= plan.size()) return short_at;
      EXPECT_EQ(position_of.at(plan[i + t]), first + t) << "block starting at plan position " << i << " is broken";
    }
    i += static_cast<size_t>(length);
  }
  return short_at;
}

// Expects `body` to throw InvalidArgument whose message contains each of `parts`.
void expect_invalid(const std::function<void()>& body, const std::vector<std::string>& parts) {
  try {
    body();
    ADD_FAILURE() << "expected InvalidArgument mentioning '" << parts.front() << "'";
  } catch (const InvalidArgument& error) {
    for (const auto& part : parts) {
      EXPECT_NE(std::string(error.what()).find(part), std::string::npos)
          << "message '" << error.what() << "' does not mention '" << part << "'";
    }
  }
}

// --- Streaming --------------------------------------------------------------

TEST(Streaming, PlanIsTheIdentityOverAllRows) {
  const auto plan = Streaming().bind(1000);
  EXPECT_EQ(plan->size(), 1000);
  EXPECT_FALSE(plan->shuffles_within_fetch());
  EXPECT_EQ(whole_plan(*plan, 0, 0), iota(1000));
  EXPECT_EQ(whole_plan(*plan, 123, 45), iota(1000));
}

TEST(Streaming, PlanIsTheSortedSubsetOfIndices) {
  const auto plan = Streaming(false, std::vector<int64_t>{42, 3, 17, 99, 0, 5}).bind(100);
  EXPECT_EQ(plan->size(), 6);
  EXPECT_EQ(whole_plan(*plan, 9, 2), (std::vector<int64_t>{0, 3, 5, 17, 42, 99}));
  EXPECT_EQ(fill_range(*plan, 9, 2, 2, 3), (std::vector<int64_t>{5, 17, 42}));
}

TEST(Streaming, ShuffleKeepsTheIdentityPlanButShufflesWithinFetches) {
  const auto plan = Streaming(true).bind(50);
  EXPECT_TRUE(plan->shuffles_within_fetch());
  EXPECT_EQ(whole_plan(*plan, 1, 1), iota(50));
}

// --- BlockShuffling ---------------------------------------------------------

TEST(BlockShuffling, PlanIsAPermutationOfAllRows) {
  for (int64_t n : {1, 2, 7, 8, 9, 1000, 1003}) {
    for (int64_t block_size : {1, 3, 8, 64}) {
      const auto plan = BlockShuffling(block_size).bind(n);
      ASSERT_EQ(plan->size(), n);
      EXPECT_TRUE(plan->shuffles_within_fetch());
      EXPECT_EQ(sorted(whole_plan(*plan, 5, 1)), iota(n)) << "n=" << n << " block_size=" << block_size;
    }
  }
}

TEST(BlockShuffling, PlanIsMadeOfWholeBlocksOfConsecutiveRows) {
  for (int64_t n : {8, 64, 1000, 1003}) {
    for (int64_t block_size : {1, 3, 8}) {
      const auto plan = BlockShuffling(block_size).bind(n);
      for (int64_t epoch = 0; epoch < 3; ++epoch) {
        expect_contiguous_blocks(whole_plan(*plan, 17, epoch), iota(n), block_size);
      }
    }
  }
}

TEST(BlockShuffling, ShortLastBlockIsPlacedAnywhereLikeTheOthers) {
  const int64_t n = 83, block_size = 8;  // 10 full blocks and one of 3 rows
  const auto plan = BlockShuffling(block_size).bind(n);
  std::set<int64_t> short_positions;
  for (int64_t epoch = 0; epoch < 40; ++epoch) {
    const int64_t short_at = expect_contiguous_blocks(whole_plan(*plan, 1, epoch), iota(n), block_size);
    ASSERT_GE(short_at, 0);
    // Blocks before it are full, so it starts at a multiple of block_size.
    EXPECT_EQ(short_at % block_size, 0);
    short_positions.insert(short_at);
  }
  // 11 possible slots: 40 epochs reach most of them, the early ones included.
  EXPECT_GE(short_positions.size(), 6u);
  EXPECT_LT(*short_positions.begin(), 40);
}

TEST(BlockShuffling, BlockOrderChangesAcrossEpochsAndSeeds) {
  const auto plan = BlockShuffling(4).bind(1000);
  std::set<std::vector<int64_t>> plans;
  for (int64_t epoch = 0; epoch < 5; ++epoch) plans.insert(whole_plan(*plan, 7, epoch));
  for (uint64_t seed = 8; seed < 13; ++seed) plans.insert(whole_plan(*plan, seed, 0));
  EXPECT_EQ(plans.size(), 10u);
  EXPECT_NE(whole_plan(*plan, 7, 0), iota(1000));
}

TEST(BlockShuffling, SameSeedAndEpochGiveTheSamePlanFromAnyBinding) {
  const auto first = BlockShuffling(8).bind(777);
  const auto second = BlockShuffling(8).bind(777);
  for (int64_t epoch : {0, 1, 1000}) {
    EXPECT_EQ(whole_plan(*first, 99, epoch), whole_plan(*second, 99, epoch));
    EXPECT_EQ(whole_plan(*first, 99, epoch), whole_plan(*first, 99, epoch));
  }
}

TEST(BlockShuffling, FillOfAnyRangeEqualsTheSliceOfTheWholePlan) {
  for (int64_t n : {1, 37, 1003}) {
    for (int64_t block_size : {1, 4, 8, 2000}) {
      expect_ranges_match_whole(*BlockShuffling(block_size).bind(n), 3, 2);
    }
  }
  // Exhaustively for a small plan with a short block.
  const auto plan = BlockShuffling(4).bind(37);
  const auto whole = whole_plan(*plan, 8, 8);
  for (int64_t begin = 0; begin < 37; ++begin) {
    for (int64_t count = 0; begin + count <= 37; ++count) {
      const auto part = fill_range(*plan, 8, 8, begin, count);
      ASSERT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + begin)) << begin << "+" << count;
    }
  }
}

TEST(BlockShuffling, OneBlockHoldingEveryRowIsTheIdentity) {
  EXPECT_EQ(whole_plan(*BlockShuffling(100).bind(100), 4, 4), iota(100));
  EXPECT_EQ(whole_plan(*BlockShuffling(1000).bind(100), 4, 4), iota(100));
}

TEST(BlockShuffling, HugeSourcesArePlannedLazilyInAnyRange) {
  // 10^12 rows: binding and filling must not depend on N.
  const int64_t n = 1000000000000;
  const auto plan = BlockShuffling(64).bind(n);
  ASSERT_EQ(plan->size(), n);
  for (int64_t begin : {int64_t{0}, int64_t{123456789}, n / 2 + 17, n - 1000}) {
    const auto rows = fill_range(*plan, 1, 1, begin, 1000);
    std::set<int64_t> distinct(rows.begin(), rows.end());
    EXPECT_EQ(distinct.size(), rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      ASSERT_GE(rows[i], 0);
      ASSERT_LT(rows[i], n);
      // Within a block, rows are consecutive.
      if ((begin + static_cast<int64_t>(i)) % 64 != 0 && i > 0) {
        ASSERT_EQ(rows[i], rows[i - 1] + 1) << "plan position " << begin + static_cast<int64_t>(i);
      }
    }
    const auto tail = fill_range(*plan, 1, 1, begin + 500, 500);
    EXPECT_TRUE(std::equal(tail.begin(), tail.end(), rows.begin() + 500));
  }
  EXPECT_EQ(fill_range(*Streaming().bind(n), 0, 0, n - 3, 3), (std::vector<int64_t>{n - 3, n - 2, n - 1}));
}

TEST(BlockShuffling, IndicesArePermutedInBlocksOfTheSortedSubset) {
  std::vector<int64_t> indices;
  for (int64_t row = 0; row < 500; row += 3) indices.push_back(row);
  std::reverse(indices.begin(), indices.end());
  const auto plan = BlockShuffling(5, indices).bind(500);
  ASSERT_EQ(plan->size(), static_cast<int64_t>(indices.size()));
  const auto rows = whole_plan(*plan, 21, 0);
  EXPECT_EQ(sorted(rows), sorted(indices));
  expect_contiguous_blocks(rows, sorted(indices), 5);
}

// --- BlockWeightedSampling, with replacement --------------------------------

const std::vector<double> kWeights = {1.0, 2.0, 0.0, 3.0, 4.0, 0.5, 0.0, 5.0, 2.5, 1.0, 0.0, 6.0};

TEST(BlockWeightedSampling, DrawFrequenciesMatchTheWeights) {
  const int64_t n = static_cast<int64_t>(kWeights.size());
  const auto plan = BlockWeightedSampling(kWeights, 240000).bind(n);
  ASSERT_EQ(plan->size(), 240000);
  EXPECT_TRUE(plan->shuffles_within_fetch());
  const auto counts = histogram(whole_plan(*plan, 2024, 0), n);
  int64_t positive = 0;
  for (int64_t row = 0; row < n; ++row) {
    if (kWeights[row] == 0.0) {
      EXPECT_EQ(counts[row], 0) << "zero-weight row " << row << " drawn";
    }
    positive += kWeights[row] > 0.0;
  }
  EXPECT_LT(chi_square(counts, normalised(kWeights)), chi_square_bound(positive - 1));
}

TEST(BlockWeightedSampling, DefaultTotalSizeIsTheNumberOfRowsSampledFrom) {
  EXPECT_EQ(BlockWeightedSampling(kWeights).bind(12)->size(), 12);
  EXPECT_EQ(BlockWeightedSampling({1.0, 1.0, 1.0}, std::nullopt, 1, std::vector<int64_t>{8, 1, 4}).bind(10)->size(), 3);
}

TEST(BlockWeightedSampling, ZeroWeightRowsAreNeverDrawnEvenAtTheEdges) {
  // Zero weights first, last and around the only positive rows, with blocks
  // that are all zero: no rounding may land on them.
  const std::vector<double> weights = {0, 0, 0, 1e-300, 0, 0, 1, 0, 0, 0};
  for (int64_t block_size : {1, 2, 3, 4}) {
    const auto plan = BlockWeightedSampling(weights, 50000, block_size).bind(10);
    for (int64_t row : whole_plan(*plan, 1, 0)) {
      ASSERT_TRUE(row == 3 || row == 6) << "row " << row << " drawn with block_size " << block_size;
    }
  }
  const auto single = BlockWeightedSampling({0, 0, 0, 0, 7, 0, 0}, 10000, 3).bind(7);
  for (int64_t row : whole_plan(*single, 3, 3)) ASSERT_EQ(row, 4);
}

TEST(BlockWeightedSampling, EachGroupOfBlockSizeDrawsStaysInsideOneBlock) {
  const int64_t n = 103, block_size = 8;  // the last block has 7 rows
  std::vector<double> weights(n);
  for (int64_t row = 0; row < n; ++row) weights[row] = 1.0 + static_cast<double>(row % 5);
  const auto plan = BlockWeightedSampling(weights, 8000, block_size).bind(n);
  const auto rows = whole_plan(*plan, 5, 5);
  std::set<int64_t> blocks_seen;
  for (size_t group = 0; group * block_size < rows.size(); ++group) {
    const int64_t block = rows[group * block_size] / block_size;
    blocks_seen.insert(block);
    for (int64_t t = 1; t < block_size && group * block_size + t < rows.size(); ++t) {
      ASSERT_EQ(rows[group * block_size + t] / block_size, block) << "group " << group << " leaves its block";
    }
  }
  EXPECT_EQ(blocks_seen.size(), 13u);  // every block, the short one included, is reached
}

TEST(BlockWeightedSampling, BlockDrawsStillMatchTheRowWeights) {
  const int64_t n = static_cast<int64_t>(kWeights.size());
  for (int64_t block_size : {2, 5, 12}) {
    const auto plan = BlockWeightedSampling(kWeights, 240000, block_size).bind(n);
    const auto counts = histogram(whole_plan(*plan, 77, 1), n);
    int64_t positive = 0;
    for (int64_t row = 0; row < n; ++row) {
      if (kWeights[row] == 0.0) {
        EXPECT_EQ(counts[row], 0);
      }
      positive += kWeights[row] > 0.0;
    }
    // Draws of one group are correlated (they share a block), which inflates
    // the statistic by up to block_size; scale the bound accordingly.
    EXPECT_LT(chi_square(counts, normalised(kWeights)) / static_cast<double>(block_size),
              chi_square_bound(positive - 1))
        << "block_size " << block_size;
  }
}

TEST(BlockWeightedSampling, PlanDependsOnlyOnSeedAndEpoch) {
  const auto first = BlockWeightedSampling(kWeights, 1000, 3).bind(12);
  const auto second = BlockWeightedSampling(kWeights, 1000, 3).bind(12);
  EXPECT_EQ(whole_plan(*first, 4, 2), whole_plan(*second, 4, 2));
  EXPECT_NE(whole_plan(*first, 4, 2), whole_plan(*first, 4, 3));
  EXPECT_NE(whole_plan(*first, 4, 2), whole_plan(*first, 5, 2));
}

TEST(BlockWeightedSampling, FillOfAnyRangeEqualsTheSliceOfTheWholePlan) {
  std::vector<double> many(300);
  for (size_t row = 0; row < many.size(); ++row) many[row] = static_cast<double>(row % 7);
  for (int64_t block_size : {1, 3, 5}) {
    expect_ranges_match_whole(*BlockWeightedSampling(kWeights, 500, block_size).bind(12), 6, 1);
    expect_ranges_match_whole(*BlockWeightedSampling(many, 137, block_size, std::nullopt, false).bind(300), 6, 1);
  }
}

TEST(BlockWeightedSampling, WeightsPerIndexEntryAndPerRowGiveTheSamePlan) {
  const std::vector<int64_t> indices = {9, 2, 6, 4};
  // Per entry of indices: row 9 has weight 4, row 2 weight 1, row 6 weight 0, row 4 weight 3.
  const std::vector<double> per_entry = {4, 1, 0, 3};
  std::vector<double> per_row(10, 100.0);  // rows outside the subset must not matter
  per_row[9] = 4;
  per_row[2] = 1;
  per_row[6] = 0;
  per_row[4] = 3;
  const auto by_entry = BlockWeightedSampling(per_entry, 80000, 1, indices).bind(10);
  const auto by_row = BlockWeightedSampling(per_row, 80000, 1, indices).bind(10);
  const auto rows = whole_plan(*by_entry, 3, 0);
  EXPECT_EQ(rows, whole_plan(*by_row, 3, 0));
  const auto counts = histogram(rows, 10);
  std::vector<double> expected(10, 0.0);
  expected[9] = 4;
  expected[2] = 1;
  expected[4] = 3;
  for (int64_t row = 0; row < 10; ++row) {
    if (expected[row] == 0.0) {
      EXPECT_EQ(counts[row], 0) << "row " << row;
    }
  }
  EXPECT_LT(chi_square(counts, normalised(expected)), chi_square_bound(2));
}

// --- BlockWeightedSampling, without replacement -----------------------------

TEST(BlockWeightedSampling, WithoutReplacementDrawsDistinctPositiveWeightRows) {
  const int64_t n = static_cast<int64_t>(kWeights.size());  // 9 rows with positive weight
  for (int64_t total_size : {1, 4, 9}) {
    for (int64_t block_size : {1, 2, 4}) {
      const auto plan = BlockWeightedSampling(kWeights, total_size, block_size, std::nullopt, false).bind(n);
      ASSERT_EQ(plan->size(), total_size);
      for (int64_t epoch = 0; epoch < 5; ++epoch) {
        const auto rows = whole_plan(*plan, 8, epoch);
        EXPECT_EQ(std::set<int64_t>(rows.begin(), rows.end()).size(), rows.size()) << "a row drawn twice";
        for (int64_t row : rows) {
          ASSERT_GE(row, 0);
          ASSERT_LT(row, n);
          EXPECT_GT(kWeights[row], 0.0) << "zero-weight row " << row << " drawn";
        }
      }
    }
  }
}

TEST(BlockWeightedSampling, WithoutReplacementOfEveryPositiveRowIsABlockShuffleOfThem) {
  std::vector<int64_t> positive_rows;
  for (size_t row = 0; row < kWeights.size(); ++row) {
    if (kWeights[row] > 0.0) positive_rows.push_back(static_cast<int64_t>(row));
  }
  const auto plan = BlockWeightedSampling(kWeights, 9, 2, std::nullopt, false).bind(12);
  std::set<std::vector<int64_t>> orders;
  for (int64_t epoch = 0; epoch < 6; ++epoch) {
    const auto rows = whole_plan(*plan, 1, epoch);
    EXPECT_EQ(sorted(rows), positive_rows);
    expect_contiguous_blocks(rows, positive_rows, 2);
    orders.insert(rows);
  }
  EXPECT_GT(orders.size(), 1u);
}

TEST(BlockWeightedSampling, WithoutReplacementFavoursHeavierRowsLikeSuccessiveSampling) {
  // One draw from weights {1, 3}: row 1 with probability 3/4, over many epochs.
  const auto plan = BlockWeightedSampling({1.0, 3.0}, 1, 1, std::nullopt, false).bind(2);
  std::vector<int64_t> counts(2, 0);
  for (int64_t epoch = 0; epoch < 8000; ++epoch) ++counts[whole_plan(*plan, 10, epoch)[0]];
  EXPECT_LT(chi_square(counts, {0.25, 0.75}), chi_square_bound(1));
  // Two draws out of {1, 1, 2}: row 2 is in the pair with probability
  // 1/4 * 2/3 + 1/4 * 2/3 + 1/2 = 5/6.
  const auto pairs = BlockWeightedSampling({1.0, 1.0, 2.0}, 2, 1, std::nullopt, false).bind(3);
  std::vector<int64_t> has_row_two(2, 0);
  for (int64_t epoch = 0; epoch < 6000; ++epoch) {
    const auto rows = whole_plan(*pairs, 10, epoch);
    ++has_row_two[std::count(rows.begin(), rows.end(), 2)];
  }
  EXPECT_LT(chi_square(has_row_two, {1.0 / 6, 5.0 / 6}), chi_square_bound(1));
}

TEST(BlockWeightedSampling, WithoutReplacementSelectionChangesAcrossEpochs) {
  const auto plan = BlockWeightedSampling(std::vector<double>(100, 1.0), 10, 1, std::nullopt, false).bind(100);
  std::set<std::vector<int64_t>> selections;
  for (int64_t epoch = 0; epoch < 5; ++epoch) selections.insert(sorted(whole_plan(*plan, 3, epoch)));
  EXPECT_EQ(selections.size(), 5u);
  // Interleaved epochs (the plan caches one selection) still agree.
  const auto epoch_one = whole_plan(*plan, 3, 1);
  whole_plan(*plan, 3, 2);
  EXPECT_EQ(whole_plan(*plan, 3, 1), epoch_one);
}

// --- ClassBalancedSampling --------------------------------------------------

TEST(ClassBalancedSampling, ClassesAreDrawnEquallyOftenWhateverTheirSizes) {
  // Classes of 1, 10 and 100 rows, interleaved.
  std::vector<int64_t> labels(111, 2);
  labels[50] = 0;
  for (int64_t row = 0; row < 10; ++row) labels[row * 11] = 1;
  for (int64_t block_size : {1, 4}) {
    const auto plan = ClassBalancedSampling(labels, 90000, block_size).bind(111);
    ASSERT_EQ(plan->size(), 90000);
    std::vector<int64_t> class_counts(3, 0);
    for (int64_t row : whole_plan(*plan, 12, 0)) ++class_counts[labels[row]];
    EXPECT_LT(chi_square(class_counts, {1.0 / 3, 1.0 / 3, 1.0 / 3}) / static_cast<double>(block_size),
              chi_square_bound(2))
        << class_counts[0] << " " << class_counts[1] << " " << class_counts[2];
  }
}

TEST(ClassBalancedSampling, AnyClassCodesWorkFarApart) {
  // Small label ranges are counted in an array, wide ones in a map: both
  // must give the same law.
  const int64_t far = int64_t{1} << 40;
  const std::vector<std::vector<int64_t>> label_sets = {
      {3, 3, 3, 7},
      {far, far, far, 0},
      {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max(),
       0},
  };
  for (const auto& labels : label_sets) {
    const auto plan = ClassBalancedSampling(labels, 40000).bind(4);
    const auto counts = histogram(whole_plan(*plan, 2, 0), 4);
    EXPECT_LT(chi_square(counts, {1.0 / 6, 1.0 / 6, 1.0 / 6, 1.0 / 2}), chi_square_bound(3))
        << counts[0] << " " << counts[1] << " " << counts[2] << " " << counts[3];
  }
}

TEST(ClassBalancedSampling, NegativeLabelsOtherThanMissingAreRefused) {
  // -1 is a missing label; -2 is no class (it would silently be one).
  expect_invalid(
      [] {
        ClassBalancedSampling({0, 1, -2, 1}, 10);
      },
      {"ClassBalancedSampling: labels must be class codes >= 0, or -1 for a missing label; got -2 at position 2"});
  EXPECT_NO_THROW(ClassBalancedSampling({0, -1, 1}, 10));
}

TEST(ClassBalancedSampling, RowsWithinAClassAreDrawnUniformly) {
  std::vector<int64_t> labels = {0, 1, 1, 1, 1, 0};
  const auto plan = ClassBalancedSampling(labels, 60000).bind(6);
  const auto counts = histogram(whole_plan(*plan, 4, 0), 6);
  EXPECT_LT(chi_square(counts, {0.25, 0.125, 0.125, 0.125, 0.125, 0.25}), chi_square_bound(5));
}

TEST(ClassBalancedSampling, LabelsPerIndexEntryBalanceTheSubset) {
  const std::vector<int64_t> indices = {7, 2, 5, 9};
  const std::vector<int64_t> per_entry = {0, 1, 1, 1};  // row 7 alone in class 0
  const auto rows = whole_plan(*ClassBalancedSampling(per_entry, 40000, 1, indices).bind(10), 6, 0);
  const auto counts = histogram(rows, 10);
  std::vector<double> expected(10, 0.0);
  expected[7] = 1.0 / 2;
  expected[2] = expected[5] = expected[9] = 1.0 / 6;
  for (int64_t row = 0; row < 10; ++row) {
    if (expected[row] == 0.0) {
      EXPECT_EQ(counts[row], 0) << "row " << row << " is outside indices";
    }
  }
  EXPECT_LT(chi_square(counts, expected), chi_square_bound(3));
}

TEST(ClassBalancedSampling, LabelsPerRowKeepTheWholeDatasetsClassSizes) {
  // scDataset's global balancing: class 0 has 7 rows in the dataset and class 1 has 3, so a class-0
  // row weighs 1/14 and a class-1 row 1/6, whatever the subset drawn from holds.
  const std::vector<int64_t> indices = {7, 2, 5, 9};
  const std::vector<int64_t> per_row = {0, 0, 1, 0, 0, 1, 0, 0, 0, 1};
  const auto rows = whole_plan(*ClassBalancedSampling(per_row, 40000, 1, indices).bind(10), 6, 0);
  const auto counts = histogram(rows, 10);
  const double total = 1.0 / 14 + 3.0 / 6;
  std::vector<double> expected(10, 0.0);
  expected[7] = (1.0 / 14) / total;
  expected[2] = expected[5] = expected[9] = (1.0 / 6) / total;
  EXPECT_LT(chi_square(counts, expected), chi_square_bound(3));
}

TEST(ClassBalancedSampling, RowsWithAMissingLabelAreNeverDrawn) {
  const std::vector<int64_t> labels = {-1, 0, 1, 1, -1, 1};
  const auto counts = histogram(whole_plan(*ClassBalancedSampling(labels, 30000).bind(6), 3, 0), 6);
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[4], 0);
  EXPECT_LT(chi_square(counts, {0.0, 0.5, 1.0 / 6, 1.0 / 6, 0.0, 1.0 / 6}), chi_square_bound(3));
  EXPECT_THROW(ClassBalancedSampling({-1, -1}).bind(2), InvalidArgument);
}

TEST(ClassBalancedSampling, SmoothingMovesTowardsTheNaturalFrequencies) {
  const std::vector<int64_t> labels = {0, 1, 1, 1};  // class 1 holds 3 of 4 rows
  for (const double smoothing : {0.0, 0.5, 1.0}) {
    const auto counts =
        histogram(whole_plan(*ClassBalancedSampling(labels, 40000, 1, std::nullopt, smoothing).bind(4), 5, 0), 4);
    const double class0 = (1.0 - smoothing) / 2 + smoothing / 4;  // (1 - s) / classes + s * share
    const double class1 = 1.0 - class0;
    EXPECT_LT(chi_square(counts, {class0, class1 / 3, class1 / 3, class1 / 3}), chi_square_bound(3)) << smoothing;
  }
  EXPECT_THROW(ClassBalancedSampling(labels, std::nullopt, 1, std::nullopt, 1.5), InvalidArgument);
  EXPECT_THROW(ClassBalancedSampling(labels, std::nullopt, 1, std::nullopt, -0.1), InvalidArgument);
}

TEST(ClassBalancedSampling, DefaultTotalSizeIsTheNumberOfRowsSampledFrom) {
  EXPECT_EQ(ClassBalancedSampling({0, 1, 1, 2}).bind(4)->size(), 4);
  EXPECT_EQ(ClassBalancedSampling({0, 1, 1, 2}, std::nullopt, 1, std::vector<int64_t>{3, 0}).bind(4)->size(), 2);
}

// --- describe() -------------------------------------------------------------

TEST(Strategy, DescriptionsNameTheParametersAndTellApartDifferentArrays) {
  EXPECT_EQ(Streaming().describe(), "Streaming(shuffle=False, indices=None)");
  EXPECT_EQ(BlockShuffling(16).describe(), "BlockShuffling(block_size=16, indices=None)");
  EXPECT_NE(BlockShuffling(8, std::vector<int64_t>{1, 2}).describe(),
            BlockShuffling(8, std::vector<int64_t>{2, 1}).describe());
  EXPECT_EQ(BlockWeightedSampling({1, 2}, 5).describe(), BlockWeightedSampling({1, 2}, 5).describe());
  EXPECT_NE(BlockWeightedSampling({1, 2}, 5).describe(), BlockWeightedSampling({2, 1}, 5).describe());
  EXPECT_NE(BlockWeightedSampling({1, 2}).describe(),
            BlockWeightedSampling({1, 2}, std::nullopt, 1, std::nullopt, false).describe());
  EXPECT_NE(ClassBalancedSampling({0, 1}).describe(), ClassBalancedSampling({1, 0}).describe());
  EXPECT_EQ(std::string(ClassBalancedSampling({0, 1}).name()), "ClassBalancedSampling");
}

// --- Invalid arguments ------------------------------------------------------

TEST(StrategyArguments, BlockSizeBelowOneIsRefused) {
  expect_invalid([] { BlockShuffling(0); }, {"BlockShuffling", "block_size", "0"});
  expect_invalid([] { BlockShuffling(-3); }, {"block_size", "-3"});
  expect_invalid([] { BlockWeightedSampling({1.0}, std::nullopt, 0); }, {"BlockWeightedSampling", "block_size"});
  expect_invalid([] { ClassBalancedSampling({0}, std::nullopt, 0); }, {"ClassBalancedSampling", "block_size"});
}

TEST(StrategyArguments, NegativeNaNAndInfiniteWeightsAreRefused) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  expect_invalid([] { BlockWeightedSampling({1.0, -0.5}); }, {"weights", "weights[1]", "-0.5"});
  expect_invalid([&] { BlockWeightedSampling({nan, 1.0}); }, {"weights", "weights[0]"});
  expect_invalid([&] { BlockWeightedSampling({1.0, 2.0, inf}); }, {"weights", "weights[2]"});
  expect_invalid([&] { BlockWeightedSampling({-inf}); }, {"weights"});
}

TEST(StrategyArguments, AllZeroEmptyOrOverflowingWeightsAreRefused) {
  expect_invalid([] { BlockWeightedSampling({0.0, 0.0}); }, {"weights", "zero"});
  expect_invalid([] { BlockWeightedSampling(std::vector<double>{}); }, {"weights", "empty"});
  expect_invalid([] { BlockWeightedSampling({1e308, 1e308}); }, {"weights", "overflow"});
  // Positive weights exist, but not on the rows sampled from.
  expect_invalid(
      [] {
        BlockWeightedSampling({1.0, 0.0, 0.0}, std::nullopt, 1, std::vector<int64_t>{1, 2}).bind(3);
      },
      {"weights", "zero"});
}

TEST(StrategyArguments, DuplicateNegativeOrEmptyIndicesAreRefusedAtConstruction) {
  expect_invalid([] { Streaming(false, std::vector<int64_t>{1, 5, 1}); }, {"Streaming", "indices", "unique", "1"});
  expect_invalid([] { BlockShuffling(4, std::vector<int64_t>{3, -2}); }, {"indices", "indices[1]", "-2"});
  expect_invalid([] { BlockWeightedSampling({1.0}, std::nullopt, 1, std::vector<int64_t>{}); }, {"indices", "empty"});
  expect_invalid(
      [] {
        ClassBalancedSampling({0, 1}, std::nullopt, 1, std::vector<int64_t>{0, 0});
      },
      {"ClassBalancedSampling", "indices"});
}

TEST(StrategyArguments, IndicesBeyondTheSourceAreRefusedAtBind) {
  const std::vector<int64_t> indices = {2, 10};
  expect_invalid([&] { Streaming(false, indices).bind(10); }, {"indices", "10"});
  expect_invalid([&] { BlockShuffling(2, indices).bind(10); }, {"BlockShuffling", "indices"});
  expect_invalid([&] { BlockWeightedSampling({1.0, 1.0}, std::nullopt, 1, indices).bind(10); }, {"indices"});
  expect_invalid([&] { ClassBalancedSampling({0, 1}, std::nullopt, 1, indices).bind(10); }, {"indices"});
  EXPECT_NO_THROW(Streaming(false, indices).bind(11));
}

TEST(StrategyArguments, WeightsAndLabelsOfTheWrongLengthAreRefusedAtBind) {
  expect_invalid([] { BlockWeightedSampling({1.0, 1.0, 1.0}).bind(4); }, {"weights", "4", "3"});
  expect_invalid(
      [] {
        BlockWeightedSampling({1.0, 1.0, 1.0}, std::nullopt, 1, std::vector<int64_t>{0, 1}).bind(5);
      },
      {"weights", "indices"});
  expect_invalid([] { ClassBalancedSampling({0, 1, 0}).bind(4); }, {"labels", "4", "3"});
  expect_invalid(
      [] {
        ClassBalancedSampling({0, 1, 0}, std::nullopt, 1, std::vector<int64_t>{0, 1}).bind(5);
      },
      {"labels", "indices"});
  expect_invalid([] { ClassBalancedSampling(std::vector<int64_t>{}); }, {"labels", "empty"});
}

TEST(StrategyArguments, TotalSizeBelowOneIsRefused) {
  expect_invalid([] { BlockWeightedSampling({1.0}, 0); }, {"total_size", "0"});
  expect_invalid([] { BlockWeightedSampling({1.0}, -5); }, {"total_size", "-5"});
  expect_invalid([] { ClassBalancedSampling({0}, 0); }, {"ClassBalancedSampling", "total_size"});
}

TEST(StrategyArguments, WithoutReplacementTotalSizeBeyondThePositiveRowsIsRefused) {
  // 9 rows of kWeights are positive.
  expect_invalid([] { BlockWeightedSampling(kWeights, 10, 1, std::nullopt, false).bind(12); },
                 {"total_size", "10", "9", "replacement=False"});
  expect_invalid([] { BlockWeightedSampling(kWeights, std::nullopt, 1, std::nullopt, false).bind(12); },
                 {"total_size", "12"});
  EXPECT_NO_THROW(BlockWeightedSampling(kWeights, 9, 1, std::nullopt, false).bind(12));
  // With replacement there is no such limit.
  EXPECT_NO_THROW(BlockWeightedSampling(kWeights, 1000).bind(12));
}

TEST(StrategyArguments, EmptySourceIsRefusedAtBind) {
  expect_invalid([] { Streaming().bind(0); }, {"Streaming", "at least one row"});
  expect_invalid([] { BlockShuffling().bind(0); }, {"BlockShuffling", "row"});
  expect_invalid([] { BlockWeightedSampling({1.0}).bind(0); }, {"BlockWeightedSampling", "row"});
  expect_invalid([] { ClassBalancedSampling({0}).bind(0); }, {"ClassBalancedSampling", "row"});
}

}  // namespace
}  // namespace torch_shards::core
