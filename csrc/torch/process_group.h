// Collectives over a torch.distributed process group, resolved by name from
// C++ (c10d::resolve_process_group), on CPU tensors for gloo and on the
// current CUDA device for NCCL-only groups. Used once, at construction:
// loading never communicates.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torch_shards {

// Rank 0's seed, on every rank of the group.
int64_t broadcast_seed(int64_t seed, const std::string& group_name);

// Every rank's string, in rank order.
std::vector<std::string> all_gather_strings(const std::string& value, const std::string& group_name);

// All-gathers each rank's fingerprint ("key: value" lines) and, if any rank's
// differs from rank 0's, throws the same ValueError-worthy message on every
// rank, naming the first differing rank and line. `who` prefixes the message.
void check_same_on_all_ranks(const std::string& fingerprint, const std::string& group_name, const std::string& who);

// The first difference between two fingerprints, or "" if equal (exposed for tests).
std::string first_difference(const std::string& reference, const std::string& other, int64_t other_rank);

}  // namespace torch_shards
