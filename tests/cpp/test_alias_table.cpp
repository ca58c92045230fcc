// AliasTable: the exact probability of every item, read off the table by
// steering draw() to each slot and locating its keep-threshold, must be the
// item's share of its segment's weight.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/alias_table.h"
#include "core/random.h"

namespace torch_shards::core {
namespace {

// index_bits that make draw() read slot `local` of a segment of `length` slots
// (the smallest x with floor(x * length / 2^64) == local).
uint64_t bits_for_slot(int64_t local, int64_t length) {
  const unsigned __int128 scaled = static_cast<unsigned __int128>(local) << 64;
  return static_cast<uint64_t>((scaled + static_cast<unsigned __int128>(length) - 1) / length);
}

// The probability of each item of the table under uniform index bits and
// unit, computed exactly from draw(): a slot yields draw(.., 0) with
// probability t and draw(.., 1-) with probability 1 - t, t found by bisection.
std::vector<double> exact_probabilities(const AliasTable& table, int64_t segment_size) {
  const int64_t n = table.size();
  std::vector<double> probability(static_cast<size_t>(n), 0.0);
  const double below_one = std::nextafter(1.0, 0.0);
  for (int64_t begin = 0, segment = 0; begin < n; begin += segment_size, ++segment) {
    const int64_t length = std::min(segment_size, n - begin);
    for (int64_t local = 0; local < length; ++local) {
      const uint64_t bits = bits_for_slot(local, length);
      const int64_t low_item = table.draw(segment, bits, 0.0);
      const int64_t high_item = table.draw(segment, bits, below_one);
      EXPECT_EQ(low_item == begin + local || low_item == high_item, true)
          << "slot " << begin + local << " keeps neither itself nor only its alias";
      double keep = 1.0;
      if (low_item != high_item) {
        double lo = 0.0, hi = below_one;  // draw(lo) == low_item, draw(hi) == high_item
        for (int step = 0; step < 200 && std::nextafter(lo, 1.0) < hi; ++step) {
          const double mid = lo + (hi - lo) / 2;
          (table.draw(segment, bits, mid) == low_item ? lo : hi) = mid;
        }
        keep = hi;
      }
      probability[low_item] += keep / static_cast<double>(length);
      probability[high_item] += (1.0 - keep) / static_cast<double>(length);
    }
  }
  return probability;
}

void expect_exact(const std::vector<double>& weights, int64_t segment_size) {
  const AliasTable table(weights, segment_size);
  ASSERT_EQ(table.size(), static_cast<int64_t>(weights.size()));
  const auto probability = exact_probabilities(table, segment_size);
  const int64_t n = static_cast<int64_t>(weights.size());
  for (int64_t begin = 0; begin < n; begin += segment_size) {
    const int64_t end = std::min(begin + segment_size, n);
    double total = 0.0;
    for (int64_t i = begin; i < end; ++i) total += weights[i];
    if (total == 0.0) continue;  // never drawn from
    for (int64_t i = begin; i < end; ++i) {
      if (weights[i] == 0.0) {
        EXPECT_EQ(probability[i], 0.0) << "zero-weight item " << i << " can be drawn";
      } else {
        EXPECT_NEAR(probability[i], weights[i] / total, 1e-12 + 1e-9 * weights[i] / total) << "item " << i;
      }
    }
  }
}

TEST(AliasTable, ItemProbabilitiesAreTheNormalisedWeights) {
  expect_exact({1.0}, 1);
  expect_exact({1.0, 1.0, 1.0}, 3);
  expect_exact({1.0, 2.0, 3.0, 4.0}, 4);
  expect_exact({1e-9, 1.0, 1e9, 3.5, 0.25}, 5);
  std::vector<double> skewed(1000);
  for (size_t i = 0; i < skewed.size(); ++i) skewed[i] = uniform_at(42, i) * uniform_at(43, i) * 100.0;
  expect_exact(skewed, 1000);
}

TEST(AliasTable, ZeroWeightItemsAreNeverDrawn) {
  expect_exact({0.0, 0.0, 5.0}, 3);
  expect_exact({5.0, 0.0, 0.0}, 3);
  expect_exact({0.0, 1.0, 0.0, 2.0, 0.0, 0.0, 0.0}, 7);
  // Weights whose scaled values round: leftovers must not resurrect zeros.
  expect_exact({0.1, 0.0, 0.2, 0.0, 0.3, 0.0, 0.7, 0.0, 1e-300, 0.0}, 10);
}

TEST(AliasTable, SegmentsDrawOnlyWithinThemselvesByTheirOwnWeights) {
  const std::vector<double> weights = {1, 2, 3, 4, 0, 0, 7, 1, 9, 0, 2};
  for (int64_t segment_size : {1, 2, 3, 4, 8, 11, 100}) {
    SCOPED_TRACE(::testing::Message() << "segment_size=" << segment_size);
    expect_exact(weights, segment_size);
    const AliasTable table(weights, segment_size);
    for (int64_t segment = 0; segment * segment_size < 11; ++segment) {
      for (uint64_t i = 0; i < 200; ++i) {
        const int64_t item = table.draw(segment, mix64(i), uniform_at(5, i));
        ASSERT_GE(item, segment * segment_size);
        ASSERT_LT(item, std::min<int64_t>((segment + 1) * segment_size, 11));
      }
    }
  }
}

TEST(AliasTable, ZeroTotalSegmentLeavesTheOthersExact) { expect_exact({0, 0, 0, 1, 3, 0, 0, 0}, 3); }

}  // namespace
}  // namespace torch_shards::core
