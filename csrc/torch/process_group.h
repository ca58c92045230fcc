// Collectives over a torch.distributed process group, resolved by name from
// C++ (c10d::resolve_process_group). Used once, at construction; loading never
// communicates.
#pragma once

#include <cstdint>
#include <string>

namespace torch_shards {

// Rank 0's seed, on every rank of the group.
int64_t broadcast_seed(int64_t seed, const std::string& group_name);

}  // namespace torch_shards
