#include "loader/state_dict_codec.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

#include "core/epoch_layout.h"
#include "core/stable_hash.h"

namespace torch_shards {
namespace {

constexpr const char* kWho = "ShardedDataset";

std::string segment_key(size_t segment, const std::string& field) {
  return "segment." + std::to_string(segment) + "." + field;
}

void put_segments(StateDict& state, const std::vector<core::ResumeSegment>& segments) {
  state.insert("segments", static_cast<int64_t>(segments.size()));
  for (size_t i = 0; i < segments.size(); ++i) {
    state.insert(segment_key(i, "world_size"), segments[i].world_size);
    state.insert(segment_key(i, "num_workers"), segments[i].num_workers);
    if (segments[i].consumed.size() == 1) {
      state.insert(segment_key(i, "consumed"), segments[i].consumed[0]);
    } else {
      for (size_t rank = 0; rank < segments[i].consumed.size(); ++rank) {
        state.insert(segment_key(i, "consumed." + std::to_string(rank)), segments[i].consumed[rank]);
      }
    }
  }
}

}  // namespace

int64_t even_batches_code(const std::optional<std::string>& value) { return value ? (*value == "pad" ? 0 : 1) : 2; }

int64_t state_entry(const StateDict& state, const std::string& key) {
  TORCH_CHECK_VALUE(state.contains(key), kWho, ".load_state_dict: the state has no '", key,
                    "' (is it a ShardedDataset state?)");
  return state.at(key);
}

std::vector<core::ResumeSegment> state_segments(const StateDict& state) {
  const int64_t count = state_entry(state, "segments");
  TORCH_CHECK_VALUE(count >= 0 && count <= 4096, kWho, ".load_state_dict: 'segments' must be in [0, 4096], got ",
                    count);
  std::vector<core::ResumeSegment> segments;
  for (size_t i = 0; i < static_cast<size_t>(count); ++i) {
    core::ResumeSegment segment;
    segment.world_size = state_entry(state, segment_key(i, "world_size"));
    segment.num_workers = state_entry(state, segment_key(i, "num_workers"));
    TORCH_CHECK_VALUE(segment.world_size >= 1 && segment.num_workers >= 1, kWho, ".load_state_dict: segment ", i,
                      " needs world_size >= 1 and num_workers >= 1");
    if (state.contains(segment_key(i, "consumed"))) {
      segment.consumed = {state.at(segment_key(i, "consumed"))};
    } else {
      for (int64_t rank = 0; rank < segment.world_size; ++rank) {
        segment.consumed.push_back(state_entry(state, segment_key(i, "consumed." + std::to_string(rank))));
      }
    }
    segments.push_back(std::move(segment));
  }
  return segments;
}

StateDict encode_state(const DatasetRecord& dataset, const Iteration& iteration, int64_t consumed) {
  StateDict state;
  state.insert("version", core::kStateVersion);
  state.insert("seed", dataset.seed);
  state.insert("rank", dataset.rank);
  state.insert("world_size", dataset.world_size);
  state.insert("num_workers", iteration.num_workers);
  std::vector<core::ResumeSegment> segments = iteration.prior;
  if (iteration.in_worker && iteration.worker >= 0 && consumed >= 0) {
    // A DataLoader worker's own state: its stream only.
    state.insert("epoch", iteration.epoch);
    state.insert("worker", iteration.worker);
    state.insert("worker_consumed", iteration.consumed_before + consumed);
  } else if (consumed >= iteration.rank_batches) {
    // The epoch is over for this rank (and, in lockstep, for all): the next one starts afresh.
    state.insert("epoch", iteration.epoch + 1);
    state.insert("worker", -1);
    state.insert("worker_consumed", 0);
    segments.clear();
  } else {
    state.insert("epoch", iteration.epoch);
    state.insert("worker", -1);
    state.insert("worker_consumed", 0);
    // This run's segment, also when it consumed nothing of a resumed epoch: every rank's state is then
    // the loaded segments plus its own, so that merge_state_dicts can tell them apart (a fresh epoch
    // that consumed nothing stays without segments).
    if (consumed > 0 || !segments.empty()) {
      segments.push_back(core::ResumeSegment{dataset.world_size, iteration.num_workers, {consumed}});
    }
  }
  put_segments(state, segments);
  state.insert("rows", dataset.rows);
  state.insert("plan_size", dataset.plan_size);
  state.insert("batch_size", dataset.batch_size);
  state.insert("fetch_factor", dataset.fetch_factor);
  state.insert("drop_last", dataset.drop_last);
  state.insert("even_batches", even_batches_code(dataset.even_batches));
  state.insert("source_hash", core::stable_hash(dataset.source_description));
  state.insert("strategy_hash", core::stable_hash(dataset.strategy_description));
  return state;
}

StateDict merge_states(const std::vector<StateDict>& states) {
  TORCH_CHECK_VALUE(!states.empty(), kWho, ".merge_state_dicts: no states");
  const StateDict& first = states.front();
  const int64_t world_size = state_entry(first, "world_size");
  TORCH_CHECK_VALUE(static_cast<int64_t>(states.size()) == world_size, kWho,
                    ".merge_state_dicts: needs the state of every one of the ", world_size, " ranks, got ",
                    states.size());
  std::vector<const StateDict*> by_rank(static_cast<size_t>(world_size), nullptr);
  for (const StateDict& state : states) {
    TORCH_CHECK_VALUE(state_entry(state, "worker") < 0, kWho,
                      ".merge_state_dicts: DataLoader workers' own states cannot be merged");
    // num_workers aside: a rank that took no batch (e.g. never started its DataLoader) knows none.
    for (const char* key : {"version", "seed", "world_size", "rows", "plan_size", "batch_size", "fetch_factor",
                            "drop_last", "even_batches", "source_hash", "strategy_hash"}) {
      TORCH_CHECK_VALUE(state_entry(state, key) == state_entry(first, key), kWho,
                        ".merge_state_dicts: the ranks' states differ in '", key, "' (", state_entry(first, key),
                        " and ", state_entry(state, key), ")");
    }
    const int64_t rank = state_entry(state, "rank");
    TORCH_CHECK_VALUE(rank >= 0 && rank < world_size && by_rank[rank] == nullptr, kWho, ".merge_state_dicts: rank ",
                      rank, " is out of range or given twice");
    by_rank[rank] = &state;
  }
  // Ranks that finished the epoch point at the next one. The others are in it: each state holds the
  // segments loaded before this run (the same for every rank) and, after them, its own segment of this run
  // (a rank that consumed nothing of a fresh epoch has none; states of older versions lack a segment that
  // consumed nothing).
  const StateDict* behind = nullptr;
  for (const StateDict* state : by_rank) {
    if (behind == nullptr || state_entry(*state, "epoch") < state_entry(*behind, "epoch")) behind = state;
  }
  const int64_t epoch = state_entry(*behind, "epoch");
  std::vector<core::ResumeSegment> reference;
  for (const StateDict* state : by_rank) {
    if (state_entry(*state, "epoch") != epoch) continue;
    std::vector<core::ResumeSegment> segments = state_segments(*state);
    if (segments.size() > reference.size()) reference = std::move(segments);
  }
  const bool any_finished = std::any_of(by_rank.begin(), by_rank.end(),
                                        [&](const StateDict* state) { return state_entry(*state, "epoch") != epoch; });
  if (reference.empty() && !any_finished) {  // every rank is at the start of the epoch
    StateDict out = behind->copy();
    out.insert_or_assign("rank", 0);
    return out;
  }
  // With no segments at all, no rank consumed anything of a fresh epoch but those that finished it.
  const std::vector<core::ResumeSegment> prior(reference.begin(), reference.end() - (reference.empty() ? 0 : 1));
  const auto same = [](const core::ResumeSegment& a, const core::ResumeSegment& b) {
    return a.world_size == b.world_size && a.num_workers == b.num_workers && a.consumed == b.consumed;
  };
  const auto starts_with_prior = [&](const std::vector<core::ResumeSegment>& segments) {
    return segments.size() >= prior.size() && std::equal(prior.begin(), prior.end(), segments.begin(), same);
  };
  const core::LoaderOptions options{state_entry(first, "batch_size"), state_entry(first, "fetch_factor"),
                                    state_entry(first, "drop_last") != 0,
                                    state_entry(first, "even_batches") == 0   ? core::EvenBatches::kPad
                                    : state_entry(first, "even_batches") == 1 ? core::EvenBatches::kDrop
                                                                              : core::EvenBatches::kNone};
  // What each rank had left when this run started (the same whatever the workers) and consumed in it.
  const core::Resumption before(state_entry(first, "plan_size"), options, prior, world_size, 1);
  std::vector<int64_t> consumed;
  std::optional<int64_t> run_workers;  // the DataLoader workers of the ranks that consumed batches in this run
  for (int64_t rank = 0; rank < world_size; ++rank) {
    const StateDict& state = *by_rank[rank];
    int64_t workers = state_entry(state, "num_workers");
    if (state_entry(state, "epoch") == epoch + 1 && state_entry(state, "segments") == 0) {
      consumed.push_back(before.rank_batches(rank));  // this rank finished the epoch
    } else {
      TORCH_CHECK_VALUE(state_entry(state, "epoch") == epoch, kWho, ".merge_state_dicts: ranks are in epochs ", epoch,
                        " and ", state_entry(state, "epoch"));
      const std::vector<core::ResumeSegment> segments = state_segments(state);
      TORCH_CHECK_VALUE(
          (segments.size() == reference.size() || segments.size() == prior.size()) && starts_with_prior(segments), kWho,
          ".merge_state_dicts: the ranks' states come from different interruptions of epoch ", epoch);
      // Without a segment of its own, the rank consumed nothing in this run.
      const bool own = segments.size() != prior.size();
      consumed.push_back(own ? segments.back().consumed_by(rank) : 0);
      if (own) {
        TORCH_CHECK_VALUE(segments.back().world_size == world_size, kWho, ".merge_state_dicts: rank ", rank,
                          "'s state was taken on ", world_size, " ranks, but its last segment ran on ",
                          segments.back().world_size);
        workers = segments.back().num_workers;
      }
    }
    if (consumed.back() == 0) continue;
    TORCH_CHECK_VALUE(!run_workers || *run_workers == workers, kWho,
                      ".merge_state_dicts: the ranks consumed their batches through different numbers of DataLoader "
                      "workers (",
                      *run_workers, " and ", workers, " on rank ", rank, ")");
    run_workers = workers;
  }
  StateDict out;
  for (const auto& item : *behind) {
    if (item.key().rfind("segment", 0) != 0) out.insert(item.key(), item.value());
  }
  out.insert_or_assign("rank", 0);
  bool finished = true;  // every rank consumed all it had left: the next epoch starts afresh
  for (int64_t rank = 0; rank < world_size; ++rank) finished = finished && consumed[rank] == before.rank_batches(rank);
  if (finished) {
    out.insert_or_assign("epoch", epoch + 1);
    put_segments(out, {});
    return out;
  }
  // A rank that took no batch in this run counts as having run on the others' workers.
  core::ResumeSegment merged{world_size, run_workers.value_or(state_entry(first, "num_workers")), std::move(consumed)};
  if (std::all_of(merged.consumed.begin(), merged.consumed.end(),
                  [&](int64_t count) { return count == merged.consumed.front(); })) {
    merged.consumed.resize(1);
  }
  out.insert_or_assign("num_workers", merged.num_workers);
  std::vector<core::ResumeSegment> segments = prior;
  segments.push_back(std::move(merged));
  put_segments(out, segments);
  return out;
}

}  // namespace torch_shards
