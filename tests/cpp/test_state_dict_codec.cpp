// The checkpoint layout of a ShardedDataset (loader/state_dict_codec.h): a
// state written and read back, two ranks' states merged, and the errors of
// malformed states.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/resume.h"
#include "loader/iteration.h"
#include "loader/state_dict_codec.h"

namespace torch_shards {
namespace {

DatasetRecord record(int64_t rank, int64_t world_size) {
  DatasetRecord dataset;
  dataset.seed = 7;
  dataset.rank = rank;
  dataset.world_size = world_size;
  dataset.rows = 100;
  dataset.plan_size = 100;
  dataset.batch_size = 5;
  dataset.fetch_factor = 2;
  dataset.drop_last = true;
  dataset.even_batches = std::string("pad");
  dataset.source_description = "a source";
  dataset.strategy_description = "a strategy";
  return dataset;
}

// The text of the c10::ValueError `action` throws (without the C++ backtrace).
template <typename F>
std::string value_error(F action) {
  try {
    action();
  } catch (const c10::ValueError& error) {
    return error.what_without_backtrace();
  }
  return "no c10::ValueError";
}

TEST(StateDictCodec, RoundTripsAResumedEpoch) {
  Iteration iteration;
  iteration.epoch = 3;
  iteration.num_workers = 2;
  iteration.rank_batches = 10;
  iteration.prior = {core::ResumeSegment{4, 1, {2, 3, 4, 5}}};
  const StateDict state = encode_state(record(1, 2), iteration, 4);

  EXPECT_EQ(state_entry(state, "version"), core::kStateVersion);
  EXPECT_EQ(state_entry(state, "seed"), 7);
  EXPECT_EQ(state_entry(state, "rank"), 1);
  EXPECT_EQ(state_entry(state, "world_size"), 2);
  EXPECT_EQ(state_entry(state, "epoch"), 3);
  EXPECT_EQ(state_entry(state, "worker"), -1);
  EXPECT_EQ(state_entry(state, "num_workers"), 2);
  EXPECT_EQ(state_entry(state, "rows"), 100);
  EXPECT_EQ(state_entry(state, "batch_size"), 5);
  EXPECT_EQ(state_entry(state, "fetch_factor"), 2);
  EXPECT_EQ(state_entry(state, "drop_last"), 1);
  EXPECT_EQ(state_entry(state, "even_batches"), even_batches_code(std::string("pad")));
  EXPECT_EQ(even_batches_code(std::string("pad")), 0);
  EXPECT_EQ(even_batches_code(std::string("drop")), 1);
  EXPECT_EQ(even_batches_code(std::nullopt), 2);

  // The loaded segment, then this run's: consumed 4 on 2 ranks of 2 workers.
  const std::vector<core::ResumeSegment> segments = state_segments(state);
  ASSERT_EQ(segments.size(), 2u);
  EXPECT_EQ(segments[0].world_size, 4);
  EXPECT_EQ(segments[0].num_workers, 1);
  EXPECT_EQ(segments[0].consumed, (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(segments[1].world_size, 2);
  EXPECT_EQ(segments[1].num_workers, 2);
  EXPECT_EQ(segments[1].consumed, (std::vector<int64_t>{4}));
}

TEST(StateDictCodec, AFinishedEpochPointsAtTheNext) {
  Iteration iteration;
  iteration.epoch = 3;
  iteration.rank_batches = 10;
  iteration.prior = {core::ResumeSegment{1, 1, {2}}};
  const StateDict state = encode_state(record(0, 1), iteration, 10);
  EXPECT_EQ(state_entry(state, "epoch"), 4);
  EXPECT_TRUE(state_segments(state).empty());
}

TEST(StateDictCodec, MergesTheRanksStates) {
  Iteration iteration;
  iteration.epoch = 0;
  iteration.rank_batches = 10;
  const StateDict rank0 = encode_state(record(0, 2), iteration, 3);
  const StateDict rank1 = encode_state(record(1, 2), iteration, 5);
  const StateDict merged = merge_states({rank1, rank0});
  EXPECT_EQ(state_entry(merged, "rank"), 0);
  EXPECT_EQ(state_entry(merged, "epoch"), 0);
  const std::vector<core::ResumeSegment> segments = state_segments(merged);
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_EQ(segments[0].world_size, 2);
  EXPECT_EQ(segments[0].consumed, (std::vector<int64_t>{3, 5}));

  EXPECT_EQ(value_error([&] { merge_states({rank0}); }),
            "ShardedDataset.merge_state_dicts: needs the state of every one of the 2 ranks, got 1");
}

TEST(StateDictCodec, MalformedStatesAreRefused) {
  Iteration iteration;
  iteration.rank_batches = 10;
  StateDict state = encode_state(record(0, 1), iteration, 3);

  StateDict missing = state.copy();
  ASSERT_EQ(missing.erase("seed"), 1u);
  EXPECT_EQ(value_error([&] { state_entry(missing, "seed"); }),
            "ShardedDataset.load_state_dict: the state has no 'seed' (is it a ShardedDataset state?)");

  StateDict too_many = state.copy();
  too_many.insert_or_assign("segments", 5000);
  EXPECT_EQ(value_error([&] { state_segments(too_many); }),
            "ShardedDataset.load_state_dict: 'segments' must be in [0, 4096], got 5000");

  StateDict no_ranks = state.copy();
  no_ranks.insert_or_assign("segment.0.world_size", 0);
  EXPECT_EQ(value_error([&] { state_segments(no_ranks); }),
            "ShardedDataset.load_state_dict: segment 0 needs world_size >= 1 and num_workers >= 1");

  StateDict lost_segment = state.copy();
  ASSERT_EQ(lost_segment.erase("segment.0.consumed"), 1u);
  EXPECT_EQ(value_error([&] { state_segments(lost_segment); }),
            "ShardedDataset.load_state_dict: the state has no 'segment.0.consumed.0' (is it a ShardedDataset state?)");
}

}  // namespace
}  // namespace torch_shards
