#include "process_group.h"

#include <ATen/ops/tensor.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <vector>

namespace torch_shards {
namespace {

// Collectives run on CPU tensors when the group has a CPU backend (gloo),
// else on the current CUDA device (NCCL-only groups).
at::Device collective_device(c10d::ProcessGroup& group) {
  if (group.hasBackendForDeviceType(c10::DeviceType::CPU)) return at::Device(c10::DeviceType::CPU);
  const auto* cuda = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return cuda->getDevice();
}

}  // namespace

int64_t broadcast_seed(int64_t seed, const std::string& group_name) {
  auto group = c10d::resolve_process_group(group_name);
  const at::Device device = collective_device(*group);
  std::vector<at::Tensor> tensors{at::tensor({seed}, at::TensorOptions().dtype(at::kLong)).to(device)};
  c10d::BroadcastOptions options;
  options.rootRank = 0;
  group->broadcast(tensors, options)->wait();
  return tensors[0].cpu().item<int64_t>();
}

}  // namespace torch_shards
