// Resuming interrupted epochs: the split of a rank's consumed batches among
// its workers, the remaining batches, and the exactly-once guarantee over
// chains of interruptions on changing topologies (simulated DataLoaders).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "core/epoch_layout.h"
#include "core/errors.h"
#include "core/resume.h"
#include "core/stream_dealing.h"

namespace torch_shards::core {
namespace {

struct Delivered {
  int64_t batch;  // global batch
  bool padding;
  bool operator<(const Delivered& other) const {
    return std::tie(batch, padding) < std::tie(other.batch, other.padding);
  }
  bool operator==(const Delivered& other) const { return batch == other.batch && padding == other.padding; }
};

// A worker's batches in delivery order, after `skip` of them.
std::vector<Delivered> worker_stream(const Dealing& dealing, int64_t fetch_factor, int64_t rank, int64_t worker,
                                     int64_t workers, int64_t skip) {
  std::vector<Delivered> out;
  for (int64_t i = 0; i < dealing.worker_units(rank, worker, workers); ++i) {
    const WorkUnit unit = dealing.worker_unit(rank, worker, workers, i);
    for (int64_t b = 0; b < unit.num_batches; ++b) {
      out.push_back({unit.fetch * fetch_factor + unit.first_batch + b, unit.padding});
    }
  }
  out.erase(out.begin(), out.begin() + skip);
  return out;
}

// What a rank's loop receives from a DataLoader with `workers` workers: one
// batch from each worker in turn, skipping exhausted ones.
std::vector<Delivered> interleave(const std::vector<std::vector<Delivered>>& streams) {
  std::vector<Delivered> out;
  for (size_t round = 0;; ++round) {
    bool any = false;
    for (const auto& stream : streams) {
      if (round < stream.size()) {
        out.push_back(stream[round]);
        any = true;
      }
    }
    if (!any) return out;
  }
}

std::vector<Delivered> rank_order(const Resumption& resumption, int64_t fetch_factor, int64_t rank, int64_t workers) {
  std::vector<std::vector<Delivered>> streams;
  for (int64_t w = 0; w < workers; ++w) {
    streams.push_back(worker_stream(resumption.dealing(), fetch_factor, rank, w, workers, resumption.skip(rank, w)));
    EXPECT_EQ(static_cast<int64_t>(streams.back().size()), resumption.worker_batches(rank, w));
  }
  return interleave(streams);
}

TEST(Resume, SplitAmongWorkersFollowsTheDataLoadersOrder) {
  std::mt19937_64 random(1);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t workers = 1 + static_cast<int64_t>(random() % 5);
    std::vector<int64_t> batches(static_cast<size_t>(workers));
    for (auto& b : batches) b = static_cast<int64_t>(random() % 9);
    std::vector<std::vector<Delivered>> streams;
    for (int64_t w = 0; w < workers; ++w) {
      streams.emplace_back();
      for (int64_t i = 0; i < batches[w]; ++i) streams.back().push_back({w, false});
    }
    const auto order = interleave(streams);
    for (size_t consumed = 0; consumed <= order.size(); ++consumed) {
      std::vector<int64_t> expected(static_cast<size_t>(workers), 0);
      for (size_t i = 0; i < consumed; ++i) ++expected[order[i].batch];
      EXPECT_EQ(split_among_workers(batches, static_cast<int64_t>(consumed)), expected);
    }
  }
  EXPECT_THROW(split_among_workers({2, 3}, 6), InvalidArgument);
  EXPECT_THROW(split_among_workers({2, 3}, -1), InvalidArgument);
}

TEST(Resume, BatchSetRemovesRanges) {
  BatchSet set = BatchSet::all(20);
  set.remove({{3, 5}, {4, 8}, {15, 30}, {0, 1}});
  EXPECT_EQ(set.ranges(), (std::vector<std::pair<int64_t, int64_t>>{{1, 3}, {8, 15}}));
  EXPECT_EQ(set.size(), 9);
  set.remove({{1, 15}});
  EXPECT_EQ(set.size(), 0);
}

TEST(Resume, NoSegmentsIsTheFreshEpoch) {
  const EpochLayout layout(100, LoaderOptions{7, 3, false, EvenBatches::kPad}, 3);
  const Resumption resumption(layout, {}, 3, 2);
  for (int64_t rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(resumption.rank_batches(rank), layout.rank_batches(rank));
    for (int64_t unit = 0; unit < layout.rank_units(rank); ++unit) {
      const WorkUnit a = resumption.dealing().rank_unit(rank, unit), b = layout.rank_unit(rank, unit);
      EXPECT_EQ(std::tie(a.fetch, a.first_batch, a.num_batches, a.padding),
                std::tie(b.fetch, b.first_batch, b.num_batches, b.padding));
    }
  }
}

// Runs an epoch interrupted after random numbers of batches on random
// topologies; checks every real global batch is delivered exactly once
// across all segments, ranks step equally often under pad / drop, and that
// resuming on the same topology continues every worker's own stream.
TEST(Resume, ChainsOfInterruptionsDeliverEveryBatchExactlyOnce) {
  std::mt19937_64 random(7);
  const EvenBatches evens[] = {EvenBatches::kPad, EvenBatches::kDrop, EvenBatches::kNone};
  for (int trial = 0; trial < 600; ++trial) {
    const int64_t plan = 1 + static_cast<int64_t>(random() % 200);
    const LoaderOptions options{1 + static_cast<int64_t>(random() % 6), 1 + static_cast<int64_t>(random() % 4),
                                random() % 3 == 0, evens[random() % 3]};
    const int64_t ff = options.fetch_factor;
    const auto topology = [&] {
      return std::pair<int64_t, int64_t>{1 + static_cast<int64_t>(random() % 4),
                                         1 + static_cast<int64_t>(random() % 4)};
    };
    auto [world, workers] = topology();
    const EpochLayout layout(plan, options, world);
    std::vector<ResumeSegment> segments;
    std::multiset<int64_t> real;
    std::multiset<Delivered> all_delivered;
    const int interruptions = static_cast<int>(random() % 4);
    for (int segment = 0; segment <= interruptions; ++segment) {
      if (segment > 0 && random() % 2) std::tie(world, workers) = topology();
      const Resumption resumption(layout, segments, world, workers);
      std::vector<std::vector<Delivered>> orders;
      int64_t shortest = -1;
      for (int64_t rank = 0; rank < world; ++rank) {
        orders.push_back(rank_order(resumption, ff, rank, workers));
        EXPECT_EQ(static_cast<int64_t>(orders.back().size()), resumption.rank_batches(rank));
        const int64_t size = static_cast<int64_t>(orders.back().size());
        shortest = shortest < 0 ? size : std::min(shortest, size);
      }
      if (options.even_batches != EvenBatches::kNone) {
        for (const auto& order : orders) EXPECT_EQ(static_cast<int64_t>(order.size()), shortest);
      }
      // Ranks in lockstep consume the same number of batches; the last segment reads to the end.
      const bool last = segment == interruptions;
      const int64_t consumed = shortest <= 0 ? 0 : static_cast<int64_t>(random() % (shortest + 1));
      for (int64_t rank = 0; rank < world; ++rank) {
        const int64_t take = last ? static_cast<int64_t>(orders[rank].size()) : consumed;
        for (int64_t i = 0; i < take; ++i) {
          all_delivered.insert(orders[rank][i]);
          if (!orders[rank][i].padding) real.insert(orders[rank][i].batch);
        }
      }
      if (!last) segments.push_back({world, workers, {consumed}});
    }
    const auto context = ::testing::Message() << "trial " << trial << ": plan " << plan << ", batch "
                                              << options.batch_size << ", fetch factor " << ff;
    for (int64_t batch : real) EXPECT_EQ(real.count(batch), 1u) << context << ", batch " << batch;
    const int64_t batches = layout.num_global_batches();
    if (options.even_batches != EvenBatches::kDrop) {
      EXPECT_EQ(static_cast<int64_t>(real.size()), batches) << context;
    } else {
      EXPECT_LE(batches - static_cast<int64_t>(real.size()), 2 * 4 * (interruptions + 1)) << context;
    }
  }
}

TEST(Resume, SameTopologyContinuesTheUninterruptedEpoch) {
  std::mt19937_64 random(3);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t plan = 1 + static_cast<int64_t>(random() % 150);
    const LoaderOptions options{1 + static_cast<int64_t>(random() % 5), 1 + static_cast<int64_t>(random() % 4), false,
                                EvenBatches::kPad};
    const int64_t world = 1 + static_cast<int64_t>(random() % 3), workers = 1 + static_cast<int64_t>(random() % 3);
    const EpochLayout layout(plan, options, world);
    std::multiset<Delivered> uninterrupted, resumed;
    const Resumption fresh(layout, {}, world, workers);
    for (int64_t rank = 0; rank < world; ++rank) {
      for (const auto& batch : rank_order(fresh, options.fetch_factor, rank, workers)) uninterrupted.insert(batch);
    }
    std::vector<ResumeSegment> segments;
    for (int stop = 0; stop < 3; ++stop) {
      const Resumption resumption(layout, segments, world, workers);
      const int64_t left = resumption.rank_batches(0);
      const int64_t consumed = stop == 2 ? left : static_cast<int64_t>(random() % (left + 1));
      for (int64_t rank = 0; rank < world; ++rank) {
        const auto order = rank_order(resumption, options.fetch_factor, rank, workers);
        for (int64_t i = 0; i < consumed; ++i) resumed.insert(order[i]);
      }
      segments.push_back({world, workers, {consumed}});
    }
    EXPECT_EQ(resumed, uninterrupted) << "trial " << trial;
  }
}

TEST(Resume, WhatARankDeliversDoesNotDependOnItsWorkers) {
  std::mt19937_64 random(11);
  const EvenBatches evens[] = {EvenBatches::kPad, EvenBatches::kDrop, EvenBatches::kNone};
  for (int trial = 0; trial < 200; ++trial) {
    const LoaderOptions options{1 + static_cast<int64_t>(random() % 5), 1 + static_cast<int64_t>(random() % 4), false,
                                evens[random() % 3]};
    const int64_t world = 1 + static_cast<int64_t>(random() % 4), workers = 1 + static_cast<int64_t>(random() % 4);
    const EpochLayout layout(1 + static_cast<int64_t>(random() % 150), options, world);
    const Resumption fresh(layout, {}, world, workers);
    int64_t shortest = fresh.rank_batches(0);
    for (int64_t rank = 1; rank < world; ++rank) shortest = std::min(shortest, fresh.rank_batches(rank));
    const std::vector<ResumeSegment> segments{{world, workers, {static_cast<int64_t>(random() % (shortest + 1))}}};
    for (const int64_t next_world : {world, world + 1}) {
      const Resumption one(layout, segments, next_world, 1);
      for (int64_t next_workers = 2; next_workers <= 4; ++next_workers) {
        const Resumption other(layout, segments, next_world, next_workers);
        for (int64_t rank = 0; rank < next_world; ++rank) {
          EXPECT_EQ(other.rank_batches(rank), one.rank_batches(rank)) << "trial " << trial;
        }
      }
    }
  }
}

// Chains of interruptions on few topologies, often repeated, with per-rank
// counts and interruptions that consumed nothing: resuming from the compacted
// segments deals every rank's batches in the same order as from the segments
// themselves, on any next topology; with one worker per rank a run of one
// topology becomes one segment.
TEST(Resume, CompactedSegmentsResumeExactlyAsTheSegments) {
  std::mt19937_64 random(11);
  const EvenBatches evens[] = {EvenBatches::kPad, EvenBatches::kDrop, EvenBatches::kNone};
  int64_t merged_runs_with_workers = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t plan = 1 + static_cast<int64_t>(random() % 300);
    const LoaderOptions options{1 + static_cast<int64_t>(random() % 5), 1 + static_cast<int64_t>(random() % 4),
                                random() % 3 == 0, evens[random() % 3]};
    const auto topology = [&] {
      return std::pair<int64_t, int64_t>{1 + static_cast<int64_t>(random() % 3),
                                         1 + static_cast<int64_t>(random() % 3)};
    };
    auto [world, workers] = topology();
    const EpochLayout layout(plan, options, world);
    std::vector<ResumeSegment> segments;
    const int interruptions = 1 + static_cast<int>(random() % 8);
    for (int segment = 0; segment < interruptions; ++segment) {
      if (segment > 0 && random() % 4 == 0) std::tie(world, workers) = topology();
      const Resumption resumption(layout, segments, world, workers);
      std::vector<int64_t> consumed;
      for (int64_t rank = 0; rank < world; ++rank) {
        const int64_t left = resumption.rank_batches(rank);
        consumed.push_back(random() % 3 == 0 || left == 0 ? 0 : static_cast<int64_t>(random() % (left + 1)));
      }
      if (random() % 2) consumed.assign(1, *std::min_element(consumed.begin(), consumed.end()));  // lockstep
      segments.push_back({world, workers, consumed});
    }
    const Resumption full(layout, segments, 1, 1);
    const std::vector<ResumeSegment>& compacted = full.compacted_segments();
    const auto context = ::testing::Message() << "trial " << trial << ", " << segments.size() << " segments";
    ASSERT_LE(compacted.size(), segments.size()) << context;
    size_t runs = 0;
    for (size_t s = 0; s < segments.size(); ++s) {
      runs += s == 0 || !segments[s].same_topology(segments[s - 1].world_size, segments[s - 1].num_workers);
    }
    if (std::all_of(segments.begin(), segments.end(), [](const ResumeSegment& s) { return s.num_workers == 1; })) {
      EXPECT_EQ(compacted.size(), runs) << context;
    }
    merged_runs_with_workers += compacted.size() < segments.size() && segments.back().num_workers > 1;
    const auto [next_world, next_workers] = topology();
    for (const auto& [w, k] : {std::pair<int64_t, int64_t>{next_world, next_workers}, {world, workers}}) {
      const Resumption a(layout, segments, w, k), b(layout, compacted, w, k);
      EXPECT_EQ(a.remaining(), b.remaining()) << context;
      for (int64_t rank = 0; rank < w; ++rank) {
        EXPECT_EQ(rank_order(a, options.fetch_factor, rank, k), rank_order(b, options.fetch_factor, rank, k))
            << context << ", resumed on " << w << " ranks of " << k << " workers, rank " << rank;
      }
    }
  }
  EXPECT_GT(merged_runs_with_workers, 0);  // also merged where workers allow it
}

TEST(Resume, InterruptionsThatConsumedNothingAddNoSegment) {
  const EpochLayout layout(1000, LoaderOptions{4, 2, false, EvenBatches::kPad}, 2);
  std::vector<ResumeSegment> segments{{2, 1, {3}}};
  for (int restart = 0; restart < 2000; ++restart) segments.push_back({2, 3, {0}});
  segments.push_back({2, 3, {5}});
  const std::vector<ResumeSegment> compacted = Resumption(layout, segments, 2, 3).compacted_segments();
  ASSERT_EQ(compacted.size(), 2u);
  EXPECT_EQ(compacted[1].consumed, std::vector<int64_t>{5});
}

TEST(Resume, ConsumingMoreThanARankHasIsAnError) {
  const EpochLayout layout(40, LoaderOptions{4, 2, false, EvenBatches::kPad}, 2);
  EXPECT_THROW(Resumption(layout, {{2, 1, {6}}}, 2, 1), InvalidArgument);
  EXPECT_THROW(Resumption(layout, {{2, 1, {1, 2, 3}}}, 2, 1), InvalidArgument);
}

}  // namespace
}  // namespace torch_shards::core

namespace torch_shards::core {
namespace {

// An endless DataLoader loop (cycle=True) takes one batch from each worker in
// turn and never skips one: epoch after epoch, each dealt by StreamDealing at
// the loop's position, every epoch is one run of the loop holding each of the
// rank's batches once, whatever the shares round-robin units would give.
TEST(StreamDealing, EachEpochIsOneRunOfTheEndlessLoop) {
  std::mt19937_64 random(11);
  const EvenBatches evens[] = {EvenBatches::kPad, EvenBatches::kDrop, EvenBatches::kNone};
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t plan = 1 + static_cast<int64_t>(random() % 150);
    const LoaderOptions options{1 + static_cast<int64_t>(random() % 5), 1 + static_cast<int64_t>(random() % 5),
                                random() % 3 == 0, evens[random() % 3]};
    const int64_t world = 1 + static_cast<int64_t>(random() % 3), workers = 1 + static_cast<int64_t>(random() % 5);
    const int64_t rank = static_cast<int64_t>(random() % world);
    const auto layout = std::make_shared<const EpochLayout>(plan, options, world);
    // The rank's batches of one epoch (one worker takes them all).
    std::vector<Delivered> expected = worker_stream(*layout, options.fetch_factor, rank, 0, 1, 0);
    std::sort(expected.begin(), expected.end());
    const int64_t per_epoch = static_cast<int64_t>(expected.size());
    if (per_epoch == 0) continue;
    // Every worker's stream over four epochs, each epoch dealt at the loop's position.
    std::vector<std::vector<Delivered>> streams(static_cast<size_t>(workers));
    for (int64_t epoch = 0; epoch < 4; ++epoch) {
      const StreamDealing dealing(layout, epoch * per_epoch);
      int64_t total = 0;
      for (int64_t w = 0; w < workers; ++w) {
        const auto stream = worker_stream(dealing, options.fetch_factor, rank, w, workers, 0);
        EXPECT_EQ(static_cast<int64_t>(stream.size()), dealing.worker_batches(rank, w, workers));
        streams[w].insert(streams[w].end(), stream.begin(), stream.end());
        total += static_cast<int64_t>(stream.size());
        for (int64_t i = 0; i < dealing.worker_units(rank, w, workers); ++i) {
          EXPECT_GT(dealing.worker_unit(rank, w, workers, i).num_batches, 0);
        }
      }
      EXPECT_EQ(total, per_epoch);
    }
    // The loop: position p from worker p % workers, until the four epochs are taken.
    std::vector<size_t> next(static_cast<size_t>(workers), 0);
    for (int64_t epoch = 0; epoch < 4; ++epoch) {
      std::vector<Delivered> run;
      for (int64_t p = epoch * per_epoch; p < (epoch + 1) * per_epoch; ++p) {
        const auto w = static_cast<size_t>(p % workers);
        ASSERT_LT(next[w], streams[w].size()) << "trial " << trial << ": worker " << w << " ran dry";
        run.push_back(streams[w][next[w]++]);
      }
      std::sort(run.begin(), run.end());
      EXPECT_EQ(run, expected) << "trial " << trial << ", epoch " << epoch;
    }
    for (int64_t w = 0; w < workers; ++w) EXPECT_EQ(next[w], streams[w].size());
  }
}

TEST(StreamDealing, SharesAreContiguousRunsOfTheRanksBatches) {
  // 20 batches in units of 16 and 4 (one rank): round-robin units would give worker 0 sixteen, worker 1 four.
  const auto layout = std::make_shared<const EpochLayout>(5000, LoaderOptions{250, 16, false, EvenBatches::kPad}, 1);
  const StreamDealing at_start(layout, 0), one_in(layout, 1);
  EXPECT_EQ(at_start.worker_batches(0, 0, 2), 10);
  EXPECT_EQ(at_start.worker_batches(0, 1, 2), 10);
  const WorkUnit first = at_start.worker_unit(0, 1, 2, 0);
  EXPECT_EQ(std::tie(first.fetch, first.first_batch, first.num_batches), std::make_tuple(0, 10, 6));
  // 3 workers from position 1: the loop's batches go to workers 1, 2, 0, 1, ...: 7, 7 and 6 of them.
  const StreamDealing three(layout, 1);
  EXPECT_EQ(three.worker_batches(0, 0, 3), 6);
  EXPECT_EQ(three.worker_batches(0, 1, 3), 7);
  EXPECT_EQ(three.worker_batches(0, 2, 3), 7);
  EXPECT_EQ(one_in.worker_batches(0, 0, 2), 10);
  EXPECT_THROW(StreamDealing(layout, -1), InvalidArgument);
  EXPECT_THROW(at_start.worker_units(0, 2, 2), InvalidArgument);
}

}  // namespace
}  // namespace torch_shards::core
