// EpochLayout against DESIGN.md's distribution contract: an independent model
// of the global batches and their dealing is built for every configuration of
// an exhaustive grid, and the layout's O(1) answers are compared with it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/epoch_layout.h"
#include "core/errors.h"

namespace torch_shards::core {
namespace {

using Batch = std::pair<int64_t, int64_t>;  // (fetch, batch within the fetch)

struct Config {
  int64_t plan_size;
  LoaderOptions options;
  int64_t world_size;
  int64_t num_workers;

  std::string str() const {
    std::ostringstream out;
    out << "plan_size=" << plan_size << " batch_size=" << options.batch_size << " fetch_factor=" << options.fetch_factor
        << " drop_last=" << options.drop_last << " even_batches=" << to_string(options.even_batches)
        << " world_size=" << world_size << " num_workers=" << num_workers;
    return out.str();
  }
};

// Calls check for every configuration of the grid, stopping at the first that fails.
void for_each_config(const std::function<void(const Config&)>& check) {
  for (int64_t plan_size : {1, 2, 7, 16, 17, 63, 64, 65, 100, 257}) {
    for (int64_t batch_size : {1, 3, 8}) {
      for (int64_t fetch_factor : {1, 2, 5}) {
        for (int64_t world_size = 1; world_size <= 5; ++world_size) {
          for (int64_t num_workers = 1; num_workers <= 4; ++num_workers) {
            for (bool drop_last : {false, true}) {
              for (EvenBatches even : {EvenBatches::kPad, EvenBatches::kDrop, EvenBatches::kNone}) {
                const Config config{plan_size, {batch_size, fetch_factor, drop_last, even}, world_size, num_workers};
                SCOPED_TRACE(config.str());
                check(config);
                if (::testing::Test::HasFailure()) return;
              }
            }
          }
        }
      }
    }
  }
}

// The contract, written out naively: the global batches in order, how many
// rounds of whole fetches are dealt, and the tail batches dealt one at a time.
struct Contract {
  std::vector<Batch> batches;
  std::vector<int64_t> batch_rows;
  int64_t num_fetches = 0;
  int64_t rounds = 0;
  std::vector<Batch> tail;

  explicit Contract(const Config& config) {
    const int64_t b = config.options.batch_size;
    const int64_t f = b * config.options.fetch_factor;
    int64_t full_fetches = 0;
    for (int64_t begin = 0; begin < config.plan_size; begin += f, ++num_fetches) {
      const int64_t rows = std::min(f, config.plan_size - begin);
      full_fetches += rows == f;
      for (int64_t batch = 0; batch * b < rows; ++batch) {
        const int64_t batch_size = std::min(b, rows - batch * b);
        if (config.options.drop_last && batch_size < b) continue;
        batches.emplace_back(num_fetches, batch);
        batch_rows.push_back(batch_size);
      }
    }
    rounds = full_fetches / config.world_size;
    for (const Batch& batch : batches) {
      if (batch.first >= rounds * config.world_size) tail.push_back(batch);
    }
  }

  int64_t tail_size() const { return static_cast<int64_t>(tail.size()); }
};

// Every unit a rank delivers, gathered from its workers.
std::vector<WorkUnit> worker_units_of_rank(const EpochLayout& layout, int64_t rank, int64_t num_workers) {
  std::vector<WorkUnit> units;
  for (int64_t worker = 0; worker < num_workers; ++worker) {
    for (int64_t i = 0; i < layout.worker_units(rank, worker, num_workers); ++i) {
      units.push_back(layout.worker_unit(rank, worker, num_workers, i));
    }
  }
  return units;
}

TEST(EpochLayout, NumGlobalBatchesIsPlanOverBatchSizeRoundedUpOrDownWithDropLast) {
  for_each_config([](const Config& config) {
    const EpochLayout layout(config.plan_size, config.options, config.world_size);
    const Contract contract(config);
    const int64_t b = config.options.batch_size;
    const int64_t expected = config.options.drop_last ? config.plan_size / b : (config.plan_size + b - 1) / b;
    EXPECT_EQ(layout.num_global_batches(), expected);
    EXPECT_EQ(static_cast<int64_t>(contract.batches.size()), expected);
    EXPECT_EQ(layout.num_fetches(), contract.num_fetches);
    EXPECT_EQ(layout.fetch_size(), b * config.options.fetch_factor);
    int64_t total = 0;
    for (int64_t fetch = 0; fetch < layout.num_fetches(); ++fetch) {
      EXPECT_EQ(layout.fetch_begin(fetch), fetch * layout.fetch_size());
      total += layout.fetch_rows(fetch);
      EXPECT_EQ(layout.fetch_batches(fetch), std::count_if(contract.batches.begin(), contract.batches.end(),
                                                           [&](const Batch& batch) { return batch.first == fetch; }));
    }
    EXPECT_EQ(total, config.plan_size);
  });
}

TEST(EpochLayout, EveryGlobalBatchDeliveredExactlyOnceAcrossRanksAndWorkers) {
  for_each_config([](const Config& config) {
    const EpochLayout layout(config.plan_size, config.options, config.world_size);
    const Contract contract(config);
    std::map<Batch, int64_t> delivered;
    for (int64_t rank = 0; rank < config.world_size; ++rank) {
      for (const WorkUnit& unit : worker_units_of_rank(layout, rank, config.num_workers)) {
        if (unit.padding) continue;
        for (int64_t batch = unit.first_batch; batch < unit.first_batch + unit.num_batches; ++batch) {
          ++delivered[{unit.fetch, batch}];
        }
      }
    }
    // With even_batches="drop" the long ranks lose their surplus batch: the
    // last T mod W batches of the tail round-robin.
    const int64_t t = contract.tail_size();
    const int64_t dropped = config.options.even_batches == EvenBatches::kDrop ? t % config.world_size : 0;
    const std::set<Batch> missing(contract.tail.end() - dropped, contract.tail.end());
    for (const Batch& batch : contract.batches) {
      const int64_t expected = missing.count(batch) ? 0 : 1;
      EXPECT_EQ(delivered[batch], expected) << "batch " << batch.second << " of fetch " << batch.first;
    }
    EXPECT_EQ(delivered.size(), contract.batches.size()) << "a batch outside the epoch was delivered";
  });
}

TEST(EpochLayout, WholeFetchesGoToRankFetchModWorldSizeThenTailBatchesOneAtATime) {
  for_each_config([](const Config& config) {
    const EpochLayout layout(config.plan_size, config.options, config.world_size);
    const Contract contract(config);
    const int64_t w = config.world_size;
    EXPECT_EQ(layout.whole_fetch_rounds(), contract.rounds);
    EXPECT_EQ(layout.num_tail_batches(), contract.tail_size());
    for (int64_t rank = 0; rank < w; ++rank) {
      for (int64_t unit = 0; unit < layout.rank_units(rank); ++unit) {
        const WorkUnit got = layout.rank_unit(rank, unit);
        if (unit < contract.rounds) {
          EXPECT_EQ(got.fetch, unit * w + rank);
          EXPECT_EQ(got.first_batch, 0);
          EXPECT_EQ(got.num_batches, config.options.fetch_factor);
          EXPECT_EQ(layout.fetch_rows(got.fetch), layout.fetch_size()) << "a whole-fetch unit is not full";
          EXPECT_FALSE(got.padding);
          continue;
        }
        EXPECT_EQ(got.num_batches, 1);
        const int64_t position = rank + (unit - contract.rounds) * w;  // in the tail round-robin
        if (position < contract.tail_size()) {
          EXPECT_FALSE(got.padding);
          EXPECT_EQ(Batch(got.fetch, got.first_batch), contract.tail[position]) << "rank " << rank << " unit " << unit;
        } else {
          EXPECT_TRUE(got.padding) << "rank " << rank << " unit " << unit;
        }
      }
    }
  });
}

TEST(EpochLayout, EvenBatchesGivesEveryRankTheSameCountWithinWorldSizeOfTheTotal) {
  for_each_config([](const Config& config) {
    const EpochLayout layout(config.plan_size, config.options, config.world_size);
    const int64_t total = layout.num_global_batches();
    const int64_t w = config.world_size;
    std::vector<int64_t> counts;
    for (int64_t rank = 0; rank < w; ++rank) {
      int64_t from_units = 0;
      for (int64_t unit = 0; unit < layout.rank_units(rank); ++unit)
        from_units += layout.rank_unit(rank, unit).num_batches;
      EXPECT_EQ(layout.rank_batches(rank), from_units) << "rank " << rank;
      counts.push_back(layout.rank_batches(rank));
    }
    const auto [least, most] = std::minmax_element(counts.begin(), counts.end());
    switch (config.options.even_batches) {
      case EvenBatches::kPad:
        EXPECT_EQ(*least, *most);
        EXPECT_GE(*least * w, total);
        EXPECT_LT(*least * w - total, w);
        break;
      case EvenBatches::kDrop:
        EXPECT_EQ(*least, *most);
        EXPECT_LE(*least * w, total);
        EXPECT_LT(total - *least * w, w);
        break;
      case EvenBatches::kNone: {
        EXPECT_LE(*most - *least, 1);
        int64_t sum = 0;
        for (int64_t count : counts) sum += count;
        EXPECT_EQ(sum, total);
        // The first ranks of the round-robin are the long ones.
        EXPECT_TRUE(std::is_sorted(counts.rbegin(), counts.rend()));
        break;
      }
    }
  });
}

TEST(EpochLayout, PaddingRepeatsARealTailBatchAtMostOncePerRank) {
  for_each_config([](const Config& config) {
    const EpochLayout layout(config.plan_size, config.options, config.world_size);
    const Contract contract(config);
    const std::set<Batch> tail(contract.tail.begin(), contract.tail.end());
    int64_t padding_total = 0;
    for (int64_t rank = 0; rank < config.world_size; ++rank) {
      int64_t padding = 0;
      for (int64_t unit = 0; unit < layout.rank_units(rank); ++unit) {
        const WorkUnit got = layout.rank_unit(rank, unit);
        if (!got.padding) continue;
        ++padding;
        EXPECT_EQ(got.num_batches, 1);
        EXPECT_TRUE(tail.count({got.fetch, got.first_batch})) << "padding repeats no tail batch";
      }
      EXPECT_LE(padding, 1) << "rank " << rank;
      if (config.options.even_batches != EvenBatches::kPad) {
        EXPECT_EQ(padding, 0);
      }
      padding_total += padding;
    }
    const int64_t t = contract.tail_size();
    const int64_t w = config.world_size;
    if (config.options.even_batches == EvenBatches::kPad) {
      EXPECT_EQ(padding_total, (w - t % w) % w);
    }
  });
}

TEST(EpochLayout, WorkersSplitTheirRanksUnitsRoundRobinAndCountsAddUp) {
  for_each_config([](const Config& config) {
    const EpochLayout layout(config.plan_size, config.options, config.world_size);
    const int64_t k = config.num_workers;
    for (int64_t rank = 0; rank < config.world_size; ++rank) {
      int64_t units = 0, batches = 0;
      for (int64_t worker = 0; worker < k; ++worker) {
        const int64_t worker_units = layout.worker_units(rank, worker, k);
        int64_t worker_batches = 0;
        for (int64_t i = 0; i < worker_units; ++i) {
          const WorkUnit got = layout.worker_unit(rank, worker, k, i);
          const WorkUnit expected = layout.rank_unit(rank, worker + i * k);
          EXPECT_EQ(got.fetch, expected.fetch);
          EXPECT_EQ(got.first_batch, expected.first_batch);
          worker_batches += got.num_batches;
        }
        EXPECT_EQ(layout.worker_batches(rank, worker, k), worker_batches) << "rank " << rank << " worker " << worker;
        units += worker_units;
        batches += worker_batches;
      }
      EXPECT_EQ(units, layout.rank_units(rank)) << "rank " << rank;
      EXPECT_EQ(batches, layout.rank_batches(rank)) << "rank " << rank;
      // Workers' unit counts differ by at most one, the first workers taking more.
      for (int64_t worker = 1; worker < k; ++worker) {
        const int64_t previous = layout.worker_units(rank, worker - 1, k);
        const int64_t current = layout.worker_units(rank, worker, k);
        EXPECT_TRUE(previous == current || previous == current + 1) << "rank " << rank << " worker " << worker;
      }
    }
  });
}

TEST(EpochLayout, OnlyTheEpochsLastBatchIsShortAndDropLastRemovesIt) {
  for_each_config([](const Config& config) {
    const EpochLayout layout(config.plan_size, config.options, config.world_size);
    const Contract contract(config);
    const int64_t b = config.options.batch_size;
    int64_t rows = 0;
    for (size_t i = 0; i < contract.batches.size(); ++i) {
      const auto [fetch, batch] = contract.batches[i];
      const int64_t got = layout.batch_rows(fetch, batch);
      EXPECT_EQ(got, contract.batch_rows[i]);
      if (i + 1 < contract.batches.size() || config.options.drop_last) {
        EXPECT_EQ(got, b);
      }
      rows += got;
    }
    if (config.options.drop_last) {
      EXPECT_EQ(rows, config.plan_size / b * b);
    } else {
      EXPECT_EQ(rows, config.plan_size);
    }
  });
}

TEST(EpochLayout, SmallExampleDealsAsTheContractDescribes) {
  // 100 entries, batches of 4, fetches of 8: 12 whole fetches (4 rounds of 3)
  // and a last fetch of 4 entries, i.e. one tail batch.
  for (EvenBatches even : {EvenBatches::kPad, EvenBatches::kDrop, EvenBatches::kNone}) {
    const EpochLayout layout(100, {4, 2, false, even}, 3);
    EXPECT_EQ(layout.num_global_batches(), 25);
    EXPECT_EQ(layout.whole_fetch_rounds(), 4);
    EXPECT_EQ(layout.num_tail_batches(), 1);
    EXPECT_EQ(layout.rank_unit(1, 2).fetch, 7);
    const std::vector<int64_t> expected = even == EvenBatches::kPad    ? std::vector<int64_t>{9, 9, 9}
                                          : even == EvenBatches::kDrop ? std::vector<int64_t>{8, 8, 8}
                                                                       : std::vector<int64_t>{9, 8, 8};
    for (int64_t rank = 0; rank < 3; ++rank) EXPECT_EQ(layout.rank_batches(rank), expected[rank]) << rank;
  }
  const EpochLayout padded(100, {4, 2, false, EvenBatches::kPad}, 3);
  const WorkUnit tail = padded.rank_unit(0, 4);
  EXPECT_EQ(tail.fetch, 12);
  EXPECT_EQ(tail.first_batch, 0);
  EXPECT_FALSE(tail.padding);
  EXPECT_TRUE(padded.rank_unit(1, 4).padding);
  EXPECT_TRUE(padded.rank_unit(2, 4).padding);
}

TEST(EpochLayout, DropLastRemovesOnlyTheShortBatch) {
  const EpochLayout kept(10, {3, 16, false, EvenBatches::kNone}, 1);
  const EpochLayout dropped(10, {3, 16, true, EvenBatches::kNone}, 1);
  EXPECT_EQ(kept.num_global_batches(), 4);
  EXPECT_EQ(kept.batch_rows(0, 3), 1);
  EXPECT_EQ(dropped.num_global_batches(), 3);
  EXPECT_EQ(dropped.fetch_batches(0), 3);
  // A plan a multiple of batch_size loses nothing.
  EXPECT_EQ(EpochLayout(12, {3, 2, true, EvenBatches::kNone}, 2).num_global_batches(), 4);
  // A plan shorter than one batch has no batch at all with drop_last.
  const EpochLayout empty(2, {3, 2, true, EvenBatches::kPad}, 4);
  EXPECT_EQ(empty.num_global_batches(), 0);
  for (int64_t rank = 0; rank < 4; ++rank) EXPECT_EQ(empty.rank_batches(rank), 0);
}

TEST(EpochLayout, HugePlansAreCountedExactlyWithoutOverflow) {
  const int64_t plan_size = 1000000000007;  // 10^12 + 7
  for (EvenBatches even : {EvenBatches::kPad, EvenBatches::kDrop, EvenBatches::kNone}) {
    const EpochLayout layout(plan_size, {1000, 16, false, even}, 7);
    const int64_t total = (plan_size + 999) / 1000;
    EXPECT_EQ(layout.num_global_batches(), total);
    int64_t sum = 0;
    for (int64_t rank = 0; rank < 7; ++rank) {
      sum += layout.rank_batches(rank);
      int64_t workers = 0;
      for (int64_t worker = 0; worker < 5; ++worker) workers += layout.worker_batches(rank, worker, 5);
      EXPECT_EQ(workers, layout.rank_batches(rank));
    }
    if (even == EvenBatches::kNone) {
      EXPECT_EQ(sum, total);
    }
    if (even != EvenBatches::kNone) {
      EXPECT_LT(std::abs(sum - total), 7);
    }
    // Rank 0's first tail unit is a single batch of an existing fetch.
    const WorkUnit first_tail = layout.rank_unit(0, layout.whole_fetch_rounds());
    EXPECT_EQ(first_tail.num_batches, 1);
    EXPECT_LT(first_tail.fetch, layout.num_fetches());
  }
}

// --- Options ----------------------------------------------------------------

void expect_invalid_options(const LoaderOptions& options, int64_t world_size, const std::string& mention) {
  try {
    check_loader_options(options, world_size);
    ADD_FAILURE() << "expected InvalidArgument mentioning '" << mention << "'";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find(mention), std::string::npos) << error.what();
  }
  EXPECT_THROW(EpochLayout(100, options, world_size), InvalidArgument);
}

TEST(LoaderOptions, InvalidBatchSizeFetchFactorOrWorldSizeIsRefused) {
  expect_invalid_options({0, 16, false, EvenBatches::kPad}, 1, "batch_size must be >= 1, got 0");
  expect_invalid_options({-4, 16, false, EvenBatches::kPad}, 1, "batch_size must be >= 1, got -4");
  expect_invalid_options({8, 0, false, EvenBatches::kPad}, 1, "fetch_factor must be >= 1, got 0");
  expect_invalid_options({8, 16, false, EvenBatches::kPad}, 0, "world_size must be in [1, 2**20], got 0");
  expect_invalid_options({8, 16, false, EvenBatches::kPad}, -1, "world_size");
}

TEST(LoaderOptions, FetchSizeMustFitIn31Bits) {
  expect_invalid_options({65536, 32768, false, EvenBatches::kPad}, 1, "batch_size * fetch_factor");
  expect_invalid_options({std::numeric_limits<int64_t>::max(), 2, false, EvenBatches::kPad}, 1,
                         "batch_size * fetch_factor");
  EXPECT_NO_THROW(check_loader_options({65535, 32768, false, EvenBatches::kPad}, 1));
  EXPECT_NO_THROW(check_loader_options({std::numeric_limits<int32_t>::max(), 1, false, EvenBatches::kPad}, 1));
}

TEST(LoaderOptions, EmptyPlanIsRefused) {
  try {
    EpochLayout(0, LoaderOptions{}, 1);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("at least one entry"), std::string::npos) << error.what();
  }
}

TEST(LoaderOptions, EvenBatchesParsesItsThreeNamesAndRefusesOthers) {
  for (EvenBatches value : {EvenBatches::kPad, EvenBatches::kDrop, EvenBatches::kNone}) {
    EXPECT_EQ(parse_even_batches(to_string(value)), value);
  }
  EXPECT_EQ(parse_even_batches("drop"), EvenBatches::kDrop);
  try {
    parse_even_batches("Pad");
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("even_batches"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("'Pad'"), std::string::npos) << error.what();
  }
  EXPECT_THROW(parse_even_batches(""), InvalidArgument);
}

}  // namespace
}  // namespace torch_shards::core
