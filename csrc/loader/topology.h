// Where this process stands in a distributed job: its rank and world size,
// the process group its ranks share (if any), and the seed they agree on.
// One implementation for the dataset and the sampler, for every door.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace torch_shards {

struct Topology {
  int64_t rank = 0;
  int64_t world_size = 1;
  // The group when its ranks are exactly these ranks (size == world_size and
  // its rank == rank): the one to agree and check over. Null otherwise.
  c10::intrusive_ptr<c10d::ProcessGroup> group;
};

// Explicit values first, then the group's, then the RANK / WORLD_SIZE
// environment variables (torchrun), else 0 and 1. `who` and the parameter
// names (world_size / num_replicas) appear in errors.
Topology resolve_topology(std::optional<int64_t> rank, std::optional<int64_t> world_size,
                          const c10::intrusive_ptr<c10d::ProcessGroup>& group, const std::string& who,
                          const char* world_size_name = "world_size");

// The seed: the given one, or a fresh draw (rank 0's, broadcast over the
// topology's group when there is one).
int64_t resolve_seed(std::optional<int64_t> seed, const Topology& topology);

}  // namespace torch_shards
