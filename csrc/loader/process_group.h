// Collectives over a torch.distributed process group: CPU tensors for groups
// with a CPU backend (gloo), the current CUDA device for NCCL-only groups.
// Used once, when a dataset or sampler is made: loading never communicates.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace torch_shards {

// Rank 0's seed, on every rank of the group.
int64_t broadcast_seed(c10d::ProcessGroup& group, int64_t seed);

// Every rank's string, in rank order.
std::vector<std::string> all_gather_strings(c10d::ProcessGroup& group, const std::string& value);

// The first difference between two fingerprints ("key: value" lines) of
// processes 0 and `other`, or "" if equal.
std::string first_difference(const std::string& reference, const std::string& other, int64_t other_rank);

}  // namespace torch_shards
