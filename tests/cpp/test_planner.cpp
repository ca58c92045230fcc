// Planner and UnitCursor: the rows of each fetch (read sorted, then permuted
// by (seed, epoch, fetch)), and every worker's walk through its units, which
// together deliver the epoch's plan exactly once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "core/planner.h"
#include "core/strategy.h"
#include "statistics.h"

namespace torch_shards::core {
namespace {

using stats::chi_square;
using stats::chi_square_bound;

// A plan given as an explicit list, to control each fetch's contents.
class FixedPlan : public SamplingPlan {
 public:
  FixedPlan(std::vector<int64_t> entries, bool shuffles) : entries_(std::move(entries)), shuffles_(shuffles) {}
  int64_t size() const override { return static_cast<int64_t>(entries_.size()); }
  bool shuffles_within_fetch() const override { return shuffles_; }
  void fill(uint64_t, int64_t, int64_t begin, int64_t count, int64_t* rows) const override {
    std::copy(entries_.begin() + begin, entries_.begin() + begin + count, rows);
  }

 private:
  std::vector<int64_t> entries_;
  bool shuffles_;
};

std::shared_ptr<const Planner> make_planner(std::shared_ptr<const SamplingPlan> plan, int64_t batch_size,
                                            int64_t fetch_factor, int64_t world_size = 1,
                                            EvenBatches even = EvenBatches::kNone, bool drop_last = false) {
  return std::make_shared<Planner>(std::move(plan), LoaderOptions{batch_size, fetch_factor, drop_last, even},
                                   world_size);
}

std::vector<int64_t> plan_slice(const SamplingPlan& plan, uint64_t seed, int64_t epoch, int64_t begin, int64_t count) {
  std::vector<int64_t> rows(static_cast<size_t>(count));
  plan.fill(seed, epoch, begin, count, rows.data());
  return rows;
}

std::vector<int64_t> fetch(const Planner& planner, uint64_t seed, int64_t epoch, int64_t fetch_number) {
  std::vector<int64_t> rows;
  planner.fetch_rows(seed, epoch, fetch_number, rows);
  return rows;
}

std::vector<int64_t> sorted(std::vector<int64_t> values) {
  std::sort(values.begin(), values.end());
  return values;
}

// Whether `sorted` lists every position of `rows` once, in ascending order of their rows.
bool orders_rows(const std::vector<int64_t>& rows, const std::vector<int64_t>& sorted) {
  if (sorted.size() != rows.size()) return false;
  std::vector<bool> seen(rows.size(), false);
  for (size_t k = 0; k < sorted.size(); ++k) {
    const int64_t position = sorted[k];
    if (position < 0 || position >= static_cast<int64_t>(rows.size()) || seen[position]) return false;
    seen[position] = true;
    if (k > 0 && rows[position] < rows[sorted[k - 1]]) return false;
  }
  return true;
}

// --- Planner::fetch_rows ----------------------------------------------------

TEST(Planner, StreamingWithoutShuffleDeliversEachFetchInPlanOrder) {
  const auto plan = Streaming(false, std::vector<int64_t>{90, 3, 44, 12, 7, 61, 25, 38, 70, 5, 81}).bind(100);
  const auto planner = make_planner(plan, 2, 2);  // fetches of 4, the last of 3
  ASSERT_EQ(planner->layout().num_fetches(), 3);
  for (int64_t f = 0; f < 3; ++f) {
    const int64_t begin = planner->layout().fetch_begin(f);
    EXPECT_EQ(fetch(*planner, 5, 1, f), plan_slice(*plan, 5, 1, begin, planner->layout().fetch_rows(f)));
  }
  EXPECT_EQ(fetch(*planner, 5, 1, 2), (std::vector<int64_t>{70, 81, 90}));
}

TEST(Planner, ShufflingFetchHoldsThePlanSliceRowsInAPermutedOrder) {
  const auto plan = BlockShuffling(8).bind(1003);
  const auto planner = make_planner(plan, 5, 4);  // fetches of 20, the last of 3
  int64_t in_plan_order = 0;
  for (int64_t f = 0; f < planner->layout().num_fetches(); ++f) {
    const auto slice = plan_slice(*plan, 9, 2, planner->layout().fetch_begin(f), planner->layout().fetch_rows(f));
    const auto rows = fetch(*planner, 9, 2, f);
    ASSERT_EQ(sorted(rows), sorted(slice)) << "fetch " << f;
    in_plan_order += rows == slice || rows == sorted(slice);
  }
  EXPECT_LE(in_plan_order, 1);  // only the 3-row fetch may come out unchanged by chance
}

TEST(Planner, AShuffledFetchsSortedPositionsOrderItsRowsWhichTheyLeaveUnchanged) {
  // Readers read a shuffled fetch in ascending row order through the
  // positions the planner derives from its shuffle: they must order the
  // rows (repeated rows included), and asking for them must not change the
  // rows or their order.
  std::vector<int64_t> repeats;
  for (int64_t i = 0; i < 300; ++i) repeats.push_back((i * 37) % 50);
  const std::vector<std::pair<std::string, std::shared_ptr<const SamplingPlan>>> plans = {
      {"BlockShuffling(8)", BlockShuffling(8).bind(1003)},
      {"Streaming(shuffle)", Streaming(true).bind(500)},
      {"repeated rows", std::make_shared<FixedPlan>(repeats, true)},
  };
  for (const auto& [name, plan] : plans) {
    const auto planner = make_planner(plan, 7, 9);
    for (int64_t f = 0; f < planner->layout().num_fetches(); ++f) {
      SCOPED_TRACE(name + ", fetch " + std::to_string(f));
      std::vector<int64_t> rows, positions{-1};
      planner->fetch_rows(4, 1, f, rows, &positions);
      EXPECT_EQ(rows, fetch(*planner, 4, 1, f));
      EXPECT_TRUE(orders_rows(rows, positions));
    }
  }
  std::vector<int64_t> rows, positions{-1};
  make_planner(Streaming(false).bind(100), 5, 2)->fetch_rows(4, 1, 3, rows, &positions);
  EXPECT_TRUE(positions.empty()) << "a fetch in plan order has no sorted positions";
}

TEST(Planner, StreamingWithShuffleShufflesWithinFetchesOnly) {
  const auto planner = make_planner(Streaming(true).bind(100), 10, 2);
  for (int64_t f = 0; f < 5; ++f) {
    const auto rows = fetch(*planner, 1, 0, f);
    std::vector<int64_t> expected(20);
    std::iota(expected.begin(), expected.end(), 20 * f);
    EXPECT_EQ(sorted(rows), expected);
    EXPECT_NE(rows, expected);
  }
}

TEST(Planner, FetchOrderDependsOnlyOnTheRowsOfTheFetchNotOnTheirPlanOrder) {
  // Two plans whose fetches (of 12) hold the same multisets in different
  // orders, duplicates included, as weighted sampling produces.
  std::vector<int64_t> entries = {5, 9, 9, 1, 30, 2, 2, 2, 7, 11, 40, 3, 8, 6, 4, 6, 100, 50, 13, 12};
  std::vector<int64_t> reordered = entries;
  std::reverse(reordered.begin(), reordered.begin() + 12);
  std::rotate(reordered.begin() + 12, reordered.begin() + 15, reordered.end());
  const auto first = make_planner(std::make_shared<FixedPlan>(entries, true), 4, 3);
  const auto second = make_planner(std::make_shared<FixedPlan>(reordered, true), 4, 3);
  for (int64_t f = 0; f < 2; ++f) EXPECT_EQ(fetch(*first, 3, 3, f), fetch(*second, 3, 3, f)) << "fetch " << f;
}

TEST(Planner, FetchOrderIsReproducibleAndChangesWithSeedEpochAndFetchNumber) {
  // Every fetch holds rows 0..15, so only the permutation tells them apart.
  std::vector<int64_t> entries(64);
  for (size_t i = 0; i < entries.size(); ++i) entries[i] = static_cast<int64_t>(i % 16);
  const auto plan = std::make_shared<FixedPlan>(entries, true);
  const auto planner = make_planner(plan, 4, 4);
  const auto other = make_planner(plan, 4, 4, 3);  // topology does not matter
  std::set<std::vector<int64_t>> orders;
  for (int64_t f = 0; f < 4; ++f) {
    EXPECT_EQ(fetch(*planner, 7, 0, f), fetch(*planner, 7, 0, f));
    EXPECT_EQ(fetch(*planner, 7, 0, f), fetch(*other, 7, 0, f));
    orders.insert(fetch(*planner, 7, 0, f));
  }
  for (int64_t epoch = 1; epoch < 4; ++epoch) orders.insert(fetch(*planner, 7, epoch, 0));
  for (uint64_t seed = 8; seed < 11; ++seed) orders.insert(fetch(*planner, seed, 0, 0));
  EXPECT_EQ(orders.size(), 10u);
}

TEST(Planner, WithinFetchShuffleIsUniformOverAllOrders) {
  // A Fisher-Yates off by one (e.g. Sattolo's algorithm) misses orders or
  // weights them unevenly.
  for (int64_t n : {3, 4}) {
    std::vector<int64_t> entries(static_cast<size_t>(n));
    std::iota(entries.begin(), entries.end(), 0);
    const auto planner = make_planner(std::make_shared<FixedPlan>(entries, true), n, 1);
    std::map<std::vector<int64_t>, int64_t> counts;
    const int64_t orders = n == 3 ? 6 : 24;
    const int64_t draws = 2000 * orders;
    for (int64_t seed = 0; seed < draws; ++seed) ++counts[fetch(*planner, static_cast<uint64_t>(seed), 0, 0)];
    ASSERT_EQ(static_cast<int64_t>(counts.size()), orders) << "some orders never occur for n=" << n;
    std::vector<int64_t> observed;
    for (const auto& [order, count] : counts) observed.push_back(count);
    EXPECT_LT(chi_square(observed, std::vector<double>(orders, 1.0 / orders)), chi_square_bound(orders - 1));
  }
}

// --- UnitCursor -------------------------------------------------------------

struct Delivery {
  WorkUnit unit;
  std::vector<int64_t> rows;
  std::vector<int64_t> sorted;  // the rows' positions in ascending row order (shuffled fetches), else empty
};

std::vector<Delivery> walk(UnitCursor& cursor) {
  std::vector<Delivery> out;
  Delivery delivery;
  while (cursor.next(delivery.unit, delivery.rows, &delivery.sorted)) out.push_back(delivery);
  return out;
}

struct NamedStrategy {
  std::string name;
  std::shared_ptr<Strategy> strategy;
};

std::vector<NamedStrategy> strategies_without_repeats(int64_t n) {
  std::vector<int64_t> indices;
  for (int64_t row = n - 1; row >= 0; row -= 2) indices.push_back(row);
  return {
      {"Streaming", std::make_shared<Streaming>(false)},
      {"Streaming(shuffle)", std::make_shared<Streaming>(true)},
      {"BlockShuffling(1)", std::make_shared<BlockShuffling>(1)},
      {"BlockShuffling(8)", std::make_shared<BlockShuffling>(8)},
      {"BlockShuffling(3, indices)", std::make_shared<BlockShuffling>(3, indices)},
  };
}

// Checks, for every rank and worker, that units and rows agree with the
// planner's fetches and layout, and gathers the rows of non-padding units.
std::vector<int64_t> deliver_epoch(const std::shared_ptr<const Planner>& planner, uint64_t seed, int64_t epoch,
                                   int64_t num_workers) {
  const EpochLayout& layout = planner->layout();
  std::vector<int64_t> delivered;
  for (int64_t rank = 0; rank < layout.world_size(); ++rank) {
    for (int64_t worker = 0; worker < num_workers; ++worker) {
      UnitCursor cursor(planner, seed, epoch, rank, worker, num_workers);
      EXPECT_EQ(cursor.num_units(), layout.worker_units(rank, worker, num_workers));
      int64_t batches = 0;
      for (const Delivery& delivery : walk(cursor)) {
        const WorkUnit& unit = delivery.unit;
        batches += unit.num_batches;
        const auto fetch_rows = fetch(*planner, seed, epoch, unit.fetch);
        int64_t expected_rows = 0;
        for (int64_t b = unit.first_batch; b < unit.first_batch + unit.num_batches; ++b) {
          expected_rows += layout.batch_rows(unit.fetch, b);
        }
        const int64_t begin = unit.first_batch * layout.batch_size();
        EXPECT_EQ(static_cast<int64_t>(delivery.rows.size()), expected_rows);
        if (begin + static_cast<int64_t>(delivery.rows.size()) > static_cast<int64_t>(fetch_rows.size())) {
          ADD_FAILURE() << "unit rows run past the end of fetch " << unit.fetch;
          continue;
        }
        EXPECT_TRUE(std::equal(delivery.rows.begin(), delivery.rows.end(), fetch_rows.begin() + begin))
            << "unit rows are not the fetch's batches";
        if (planner->plan().shuffles_within_fetch()) {
          EXPECT_TRUE(orders_rows(delivery.rows, delivery.sorted))
              << "the unit's sorted positions do not order its rows (fetch " << unit.fetch << ", batches "
              << unit.first_batch << "+" << unit.num_batches << ")";
        } else {
          EXPECT_TRUE(delivery.sorted.empty()) << "sorted positions of a fetch that is not shuffled";
        }
        if (!unit.padding) delivered.insert(delivered.end(), delivery.rows.begin(), delivery.rows.end());
      }
      EXPECT_EQ(cursor.position(), cursor.num_units());
      EXPECT_EQ(batches, layout.worker_batches(rank, worker, num_workers));
    }
  }
  return delivered;
}

TEST(UnitCursor, EveryPlanEntryDeliveredExactlyOnceAcrossRanksAndWorkers) {
  for (int64_t n : {1, 17, 64, 100, 257}) {
    for (const auto& [name, strategy] : strategies_without_repeats(n)) {
      const auto plan = strategy->bind(n);
      const auto whole = plan_slice(*plan, 11, 3, 0, plan->size());
      for (int64_t batch_size : {1, 3, 8}) {
        for (int64_t fetch_factor : {1, 2, 5}) {
          for (int64_t world_size = 1; world_size <= 4; ++world_size) {
            for (EvenBatches even : {EvenBatches::kNone, EvenBatches::kPad}) {
              for (int64_t num_workers = 1; num_workers <= 3; ++num_workers) {
                SCOPED_TRACE(::testing::Message()
                             << name << " n=" << n << " batch_size=" << batch_size << " fetch_factor=" << fetch_factor
                             << " world_size=" << world_size << " even_batches=" << to_string(even)
                             << " num_workers=" << num_workers);
                const auto planner = make_planner(plan, batch_size, fetch_factor, world_size, even);
                EXPECT_EQ(sorted(deliver_epoch(planner, 11, 3, num_workers)), sorted(whole));
                if (::testing::Test::HasFailure()) return;
              }
            }
          }
        }
      }
    }
  }
}

TEST(UnitCursor, WeightedDrawsWithRepeatsAreDeliveredAsTheirExactMultiset) {
  std::vector<double> weights(50);
  for (size_t row = 0; row < weights.size(); ++row) weights[row] = static_cast<double>(row % 4);
  for (int64_t block_size : {1, 4}) {
    const auto plan = BlockWeightedSampling(weights, 301, block_size).bind(50);
    const auto whole = plan_slice(*plan, 2, 0, 0, plan->size());
    for (int64_t world_size : {1, 2, 3}) {
      for (int64_t num_workers : {1, 2}) {
        const auto planner = make_planner(plan, 4, 3, world_size);
        EXPECT_EQ(sorted(deliver_epoch(planner, 2, 0, num_workers)), sorted(whole))
            << "block_size=" << block_size << " world_size=" << world_size << " num_workers=" << num_workers;
      }
    }
  }
}

TEST(UnitCursor, EvenBatchesDropDeliversRowsAtMostOnceAndLosesLessThanABatchPerRank) {
  const auto plan = BlockShuffling(4).bind(103);  // batches of 5: 20 full and one of 3 rows
  const auto whole = plan_slice(*plan, 1, 1, 0, plan->size());
  for (int64_t world_size : {1, 2, 3, 4}) {
    for (bool drop_last : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "world_size=" << world_size << " drop_last=" << drop_last);
      const auto planner = make_planner(plan, 5, 2, world_size, EvenBatches::kDrop, drop_last);
      const auto delivered = deliver_epoch(planner, 1, 1, 2);
      EXPECT_EQ(std::set<int64_t>(delivered.begin(), delivered.end()).size(), delivered.size()) << "a row repeats";
      if (drop_last) {
        EXPECT_EQ(delivered.size() % 5, 0u) << "the short batch was delivered";
      }
      // At most W - 1 batches dropped to even the ranks, plus the short batch with drop_last.
      EXPECT_LE(whole.size() - delivered.size(), static_cast<size_t>(5 * (world_size - 1) + 3));
      if (world_size == 1) {
        EXPECT_EQ(delivered.size(), drop_last ? 100u : 103u);
      }
    }
  }
}

TEST(UnitCursor, SingleRankSingleWorkerStreamingDeliversThePlanInOrder) {
  const auto plan = Streaming(false, std::vector<int64_t>{8, 6, 4, 2, 0, 1, 3, 5, 7, 9, 11}).bind(12);
  UnitCursor cursor(make_planner(plan, 2, 2), 0, 0, 0, 0, 1);
  std::vector<int64_t> rows;
  for (const Delivery& delivery : walk(cursor)) rows.insert(rows.end(), delivery.rows.begin(), delivery.rows.end());
  EXPECT_EQ(rows, plan_slice(*plan, 0, 0, 0, plan->size()));
}

TEST(UnitCursor, GlobalBatchesAreTheSameWhateverTheTopology) {
  const auto plan = BlockShuffling(3).bind(211);
  auto batches_of = [&](int64_t world_size, int64_t num_workers) {
    const auto planner = make_planner(plan, 4, 3, world_size);
    std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> batches;
    for (int64_t rank = 0; rank < world_size; ++rank) {
      for (int64_t worker = 0; worker < num_workers; ++worker) {
        UnitCursor cursor(planner, 6, 6, rank, worker, num_workers);
        for (const Delivery& delivery : walk(cursor)) {
          for (int64_t b = 0; b < delivery.unit.num_batches; ++b) {
            const auto first = delivery.rows.begin() + std::min<int64_t>(4 * b, delivery.rows.size());
            const auto last = delivery.rows.begin() + std::min<int64_t>(4 * b + 4, delivery.rows.size());
            batches[{delivery.unit.fetch, delivery.unit.first_batch + b}] = std::vector<int64_t>(first, last);
          }
        }
      }
    }
    return batches;
  };
  const auto reference = batches_of(1, 1);
  EXPECT_EQ(reference.size(), 53u);
  EXPECT_EQ(batches_of(3, 2), reference);
  EXPECT_EQ(batches_of(4, 3), reference);
}

TEST(UnitCursor, SkipResumesExactlyWhereTheFullWalkWouldBe) {
  const auto planner = make_planner(BlockShuffling(4).bind(300), 4, 3, 2, EvenBatches::kPad);
  UnitCursor full_cursor(planner, 3, 1, 1, 0, 2);
  const auto full = walk(full_cursor);
  ASSERT_GT(full.size(), 3u);
  const int64_t total = static_cast<int64_t>(full.size());
  for (int64_t skipped = 0; skipped <= total + 2; ++skipped) {
    UnitCursor cursor(planner, 3, 1, 1, 0, 2);
    cursor.skip(skipped / 2);
    cursor.skip(skipped - skipped / 2);
    EXPECT_EQ(cursor.position(), std::min(skipped, total));
    const auto rest = walk(cursor);
    ASSERT_EQ(static_cast<int64_t>(rest.size()), std::max<int64_t>(0, total - skipped)) << "skipped " << skipped;
    for (size_t i = 0; i < rest.size(); ++i) {
      EXPECT_EQ(rest[i].unit.fetch, full[skipped + i].unit.fetch);
      EXPECT_EQ(rest[i].unit.first_batch, full[skipped + i].unit.first_batch);
      EXPECT_EQ(rest[i].rows, full[skipped + i].rows);
    }
  }
  UnitCursor cursor(planner, 3, 1, 1, 0, 2);
  EXPECT_THROW(cursor.skip(-1), InvalidArgument);
}

TEST(UnitCursor, PeekShowsTheUnitNextReturnsWithoutMoving) {
  const auto planner = make_planner(BlockShuffling(4).bind(300), 4, 3, 2, EvenBatches::kPad);
  const std::shared_ptr<const Dealing> dealing(planner, &planner->layout());
  for (const int64_t skip_batches : {0, 1, 5}) {  // 1 and 5: resumed inside a fetch of 3 batches
    UnitCursor cursor(planner, dealing, 3, 1, 1, 0, 2, skip_batches);
    Delivery delivery;
    WorkUnit peeked;
    int64_t units = 0;
    while (cursor.peek(peeked)) {
      const int64_t position = cursor.position();
      EXPECT_TRUE(cursor.peek(peeked));  // peeking twice moves nothing
      EXPECT_EQ(cursor.position(), position);
      ASSERT_TRUE(cursor.next(delivery.unit, delivery.rows));
      EXPECT_EQ(peeked.fetch, delivery.unit.fetch);
      EXPECT_EQ(peeked.first_batch, delivery.unit.first_batch);
      EXPECT_EQ(peeked.num_batches, delivery.unit.num_batches);
      EXPECT_EQ(peeked.padding, delivery.unit.padding);
      ++units;
    }
    EXPECT_FALSE(cursor.next(delivery.unit, delivery.rows));
    EXPECT_GT(units, 3) << "skipped " << skip_batches;
  }
}

TEST(UnitCursor, OutOfRangeRankWorkerOrWorkerCountIsRefused) {
  const auto planner = make_planner(Streaming().bind(10), 2, 2, 2);
  EXPECT_THROW(UnitCursor(planner, 0, 0, 2, 0, 1), InvalidArgument);
  EXPECT_THROW(UnitCursor(planner, 0, 0, -1, 0, 1), InvalidArgument);
  EXPECT_THROW(UnitCursor(planner, 0, 0, 0, 0, 0), InvalidArgument);
  EXPECT_THROW(UnitCursor(planner, 0, 0, 0, 3, 3), InvalidArgument);
  EXPECT_THROW(UnitCursor(planner, 0, 0, 0, -1, 3), InvalidArgument);
  try {
    UnitCursor(planner, 0, 0, 5, 0, 1);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("rank"), std::string::npos) << error.what();
  }
  EXPECT_NO_THROW(UnitCursor(planner, 0, 0, 1, 2, 3));
}

}  // namespace
}  // namespace torch_shards::core
