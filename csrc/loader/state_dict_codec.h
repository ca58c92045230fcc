// The layout of a ShardedDataset checkpoint (a StateDict: str -> int): the
// keys a state is written with, read back with errors naming what is missing
// or out of range, and the per-rank states of one epoch merged into one.
// ShardedDatasetImpl's state_dict, load_state_dict and merge_state_dicts
// speak through it; what a state means for a running dataset (its shared
// state, its iterators) stays in dataset.cpp. Exported for the tests
// (tests/cpp/test_state_dict_codec.cpp), not part of the public API.
#pragma once

#include <ATen/core/Dict.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch_shards/export.h>
#include "core/resume.h"
#include "loader/iteration.h"

namespace torch_shards {

using StateDict = c10::Dict<std::string, int64_t>;

// What a state records of the dataset it was taken on, beside where it stands.
struct DatasetRecord {
  int64_t seed = 0;
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t rows = 0;
  int64_t plan_size = 0;
  int64_t batch_size = 1;
  int64_t fetch_factor = 1;
  bool drop_last = false;
  std::optional<std::string> even_batches;  // "pad", "drop" or none
  std::string source_description;           // kept as its stable hash
  std::string strategy_description;         // kept as its stable hash
};

// The state of `dataset` having consumed `consumed` batches of `iteration`
// (a DataLoader worker's own state when the iteration runs in one).
TORCH_SHARDS_API StateDict encode_state(const DatasetRecord& dataset, const Iteration& iteration, int64_t consumed);

// The value at `key`; c10::ValueError naming the key if the state lacks it.
TORCH_SHARDS_API int64_t state_entry(const StateDict& state, const std::string& key);

// The resumed segments a state records; c10::ValueError for a count out of
// [0, 4096] or a segment without ranks or workers.
TORCH_SHARDS_API std::vector<core::ResumeSegment> state_segments(const StateDict& state);

// The 0 ('pad'), 1 ('drop') or 2 (none) a state keeps for even_batches.
TORCH_SHARDS_API int64_t even_batches_code(const std::optional<std::string>& value);

// The states of every rank (even_batches=None, ranks not in lockstep) merged
// into the one state of the job; c10::ValueError for states that do not go
// together.
TORCH_SHARDS_API StateDict merge_states(const std::vector<StateDict>& states);

}  // namespace torch_shards
