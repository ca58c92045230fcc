// damacy's cross-check of the GPU a rank copies to against LOCAL_RANK, as
// pure logic (the device stage asks the device, this decides).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace torch_shards::core {

struct DeviceCheck {
  std::string problem;  // "" when consistent
  bool error = false;   // raise (else warn)
};

// explicit_index: the index the user wrote ("cuda:1"), if any; current_index:
// the current CUDA device; local_rank: LOCAL_RANK, when set. An explicit index
// other than the current device under LOCAL_RANK is an error; a current device
// other than LOCAL_RANK a warning.
DeviceCheck check_local_rank(std::optional<int64_t> explicit_index, int64_t current_index,
                             std::optional<int64_t> local_rank);

}  // namespace torch_shards::core
