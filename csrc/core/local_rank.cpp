#include "core/local_rank.h"

#include "core/errors.h"

namespace torch_shards::core {

DeviceCheck check_local_rank(std::optional<int64_t> explicit_index, int64_t current_index,
                             std::optional<int64_t> local_rank) {
  if (!local_rank) return {};
  if (explicit_index && *explicit_index != current_index) {
    return {concat("device=cuda:", *explicit_index, " but LOCAL_RANK=", *local_rank,
                   " and the current device is cuda:", current_index,
                   ": call torch.cuda.set_device(local_rank) and pass device='cuda' (or 'cuda:", *local_rank, "')"),
            true};
  }
  if (current_index != *local_rank) {
    return {concat("the current device is cuda:", current_index, " but LOCAL_RANK=", *local_rank,
                   ": every rank of this node may be copying to one GPU; call torch.cuda.set_device(local_rank) "
                   "before building the dataset"),
            false};
  }
  return {};
}

}  // namespace torch_shards::core
