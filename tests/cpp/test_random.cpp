// Random numbers: Philox4x32-10 against the Random123 known answers, the word
// packing of philox4x32's 64-bit arguments, SplitMix64, and the distributions
// of the values derived from them.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "core/random.h"
#include "statistics.h"

namespace torch_shards::core {
namespace {

using stats::chi_square;
using stats::chi_square_bound;

uint64_t pack(uint32_t low, uint32_t high) { return (uint64_t{high} << 32) | low; }

// Known answers from Random123's kat_vectors ("philox4x32 10 ctr[4] key[2] out[4]"),
// checked independently against randomgen.Philox(number=4, width=32) and a
// from-the-paper Python implementation. Counter words are c0..c3, key words k0, k1.
struct KnownAnswer {
  std::array<uint32_t, 4> counter;
  std::array<uint32_t, 2> key;
  std::array<uint32_t, 4> expected;
};

const KnownAnswer kKnownAnswers[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000},
     {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

TEST(Philox, MatchesRandom123KnownAnswerVectors) {
  for (const KnownAnswer& kat : kKnownAnswers) {
    const uint64_t key = pack(kat.key[0], kat.key[1]);
    const uint64_t counter_lo = pack(kat.counter[0], kat.counter[1]);
    const uint64_t counter_hi = pack(kat.counter[2], kat.counter[3]);
    EXPECT_EQ(philox4x32(key, counter_lo, counter_hi), kat.expected)
        << std::hex << "key=" << key << " counter_lo=" << counter_lo << " counter_hi=" << counter_hi;
  }
}

TEST(Philox, EveryCounterAndKeyWordChangesEveryOutputWord) {
  const uint64_t key = pack(0xa4093822, 0x299f31d0);
  const uint64_t lo = pack(0x243f6a88, 0x85a308d3);
  const uint64_t hi = pack(0x13198a2e, 0x03707344);
  const auto base = philox4x32(key, lo, hi);
  const std::array<std::array<uint32_t, 4>, 6> flipped = {
      philox4x32(key, lo ^ 1, hi), philox4x32(key, lo ^ (uint64_t{1} << 32), hi),
      philox4x32(key, lo, hi ^ 1), philox4x32(key, lo, hi ^ (uint64_t{1} << 32)),
      philox4x32(key ^ 1, lo, hi), philox4x32(key ^ (uint64_t{1} << 32), lo, hi),
  };
  for (size_t input = 0; input < flipped.size(); ++input) {
    for (int word = 0; word < 4; ++word) {
      EXPECT_NE(flipped[input][word], base[word]) << "flipping input bit " << input << " left word " << word;
    }
  }
}

TEST(Mix64, IsSplitMix64Finaliser) {
  // The first three outputs of SplitMix64 seeded with 0.
  EXPECT_EQ(mix64(0x9e3779b97f4a7c15ULL), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(mix64(0x3c6ef372fe94f82aULL), 0x6e789e6aa1b965f4ULL);
  EXPECT_EQ(mix64(0xdaa66d2c7ddf743fULL), 0x06c45d188009454fULL);
}

TEST(DeriveKey, EverySeedEpochPurposeAndExtraGivesADistinctKey) {
  const Purpose purposes[] = {Purpose::kBlockOrder,  Purpose::kFetchShuffle,       Purpose::kWeightedBlock,
                              Purpose::kWeightedRow, Purpose::kWithoutReplacement, Purpose::kSamplerOrder};
  std::set<uint64_t> keys;
  int64_t count = 0;
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{42}, ~uint64_t{0}}) {
    for (int64_t epoch : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{1000000}}) {
      for (Purpose purpose : purposes) {
        for (uint64_t extra : {uint64_t{0}, uint64_t{1}, uint64_t{7}}) {
          keys.insert(derive_key(seed, epoch, purpose, extra));
          ++count;
        }
      }
    }
  }
  EXPECT_EQ(static_cast<int64_t>(keys.size()), count);
  EXPECT_EQ(derive_key(3, 4, Purpose::kFetchShuffle, 5), derive_key(3, 4, Purpose::kFetchShuffle, 5));
}

TEST(ToUnitDouble, MapsTheExtremesToZeroAndTheLargestDoubleBelowOne) {
  EXPECT_EQ(to_unit_double(0, 0), 0.0);
  EXPECT_EQ(to_unit_double(0xffffffff, 0xffffffff), 1.0 - 1.0 / 9007199254740992.0);
  EXPECT_LT(to_unit_double(0xffffffff, 0xffffffff), 1.0);
  // The top 53 of the 64 bits: the low 11 bits of b do not matter.
  EXPECT_EQ(to_unit_double(0x80000000, 0), 0.5);
  EXPECT_EQ(to_unit_double(0x80000000, 0x7ff), 0.5);
  EXPECT_GT(to_unit_double(0x80000000, 0x800), 0.5);
}

TEST(UniformAt, IsTheFirstTwoWordsOfTheCounterBlockAsAUnitDouble) {
  const uint64_t key = derive_key(7, 3, Purpose::kWeightedRow);
  for (uint64_t counter : {uint64_t{0}, uint64_t{1}, uint64_t{123456789}, ~uint64_t{0}}) {
    const auto block = philox4x32(key, counter, 0);
    EXPECT_EQ(uniform_at(key, counter), to_unit_double(block[0], block[1]));
  }
}

TEST(UniformAt, IsInUnitIntervalAndUniformOverSixteenBins) {
  const uint64_t key = derive_key(2024, 0, Purpose::kWeightedRow);
  constexpr int kBins = 16;
  constexpr int64_t kDraws = 200000;
  std::vector<int64_t> counts(kBins, 0);
  double sum = 0.0;
  for (int64_t i = 0; i < kDraws; ++i) {
    const double u = uniform_at(key, static_cast<uint64_t>(i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    ++counts[static_cast<int>(u * kBins)];
  }
  EXPECT_NEAR(sum / kDraws, 0.5, 5.0 * 0.2887 / std::sqrt(double{kDraws}));
  EXPECT_LT(chi_square(counts, std::vector<double>(kBins, 1.0 / kBins)), chi_square_bound(kBins - 1));
}

TEST(PhiloxStream, ReadsCounterBlocksInOrderWithTheStreamAsHighCounterWords) {
  const uint64_t key = 0x0123456789abcdefULL;
  const uint64_t stream = 0xfedcba9876543210ULL;
  PhiloxStream reader(key, stream);
  for (uint64_t counter = 0; counter < 5; ++counter) {
    const auto block = philox4x32(key, counter, stream);
    for (int word = 0; word < 4; ++word) EXPECT_EQ(reader.next_u32(), block[word]) << counter << "/" << word;
  }
  PhiloxStream default_stream(key);
  EXPECT_EQ(default_stream.next_u32(), philox4x32(key, 0, 0)[0]);
}

TEST(SplitMixStream, YieldsSplitMix64OutputsHighWordFirst) {
  // SplitMix64 seeded with 0: 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4.
  SplitMixStream stream(0);
  EXPECT_EQ(stream.next_u32(), 0xe220a839u);
  EXPECT_EQ(stream.next_u32(), 0x7b1dcdafu);
  EXPECT_EQ(stream.next_u32(), 0x6e789e6au);
  EXPECT_EQ(stream.next_u32(), 0xa1b965f4u);
}

// The bounded-integer tests run on both sequential streams.
template <typename Stream>
class BoundedDraws : public ::testing::Test {};
using Streams = ::testing::Types<PhiloxStream, SplitMixStream>;
TYPED_TEST_SUITE(BoundedDraws, Streams);

TYPED_TEST(BoundedDraws, RangeOfOneAlwaysGivesZero) {
  TypeParam stream(99);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(stream.bounded(1), 0u);
}

TYPED_TEST(BoundedDraws, StayInRangeAndReachItsTopForSmallLargeAndExtremeRanges) {
  const uint32_t ranges[] = {2,     3,           5,           7,           10,          1000,
                             65537, 0x7fffffffu, 0x80000001u, 0xc0000000u, 0xfffffffeu, 0xffffffffu};
  for (uint32_t range : ranges) {
    TypeParam stream(derive_key(1, 2, Purpose::kFetchShuffle, range));
    uint32_t largest = 0;
    for (int i = 0; i < 20000; ++i) {
      const uint32_t value = stream.bounded(range);
      ASSERT_LT(value, range);
      largest = std::max(largest, value);
    }
    // The top 1% of the range is reached (probability of missing: 0.99^20000).
    EXPECT_GE(largest, range - range / 100 - 1) << "range " << range;
  }
}

TYPED_TEST(BoundedDraws, AreUniformOverSmallRanges) {
  for (uint32_t range : {2u, 3u, 7u, 10u, 100u}) {
    TypeParam stream(derive_key(5, 0, Purpose::kFetchShuffle, range));
    std::vector<int64_t> counts(range, 0);
    const int64_t draws = 2000 * static_cast<int64_t>(range);
    for (int64_t i = 0; i < draws; ++i) ++counts[stream.bounded(range)];
    EXPECT_LT(chi_square(counts, std::vector<double>(range, 1.0 / range)), chi_square_bound(range - 1))
        << "range " << range;
  }
}

TYPED_TEST(BoundedDraws, AreUnbiasedForARangeOfThreeQuartersOfTwoToThe32) {
  // For range = 3 * 2^30, x % range puts half the draws in the first third
  // of the range, and floor(x * range / 2^32) without Lemire's rejection step
  // puts half of them on multiples of 3 (4 inputs share 3 outputs).
  const uint32_t range = 0xc0000000u;
  TypeParam stream(11);
  std::vector<int64_t> thirds(3, 0), residues(3, 0);
  for (int i = 0; i < 60000; ++i) {
    const uint32_t value = stream.bounded(range);
    ++thirds[value / 0x40000000u];
    ++residues[value % 3];
  }
  EXPECT_LT(chi_square(thirds, {1.0 / 3, 1.0 / 3, 1.0 / 3}), chi_square_bound(2));
  EXPECT_LT(chi_square(residues, {1.0 / 3, 1.0 / 3, 1.0 / 3}), chi_square_bound(2));
}

}  // namespace
}  // namespace torch_shards::core
