#include "loader/process_group.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "core/errors.h"

namespace torch_shards {
namespace {

// Collectives run on CPU tensors unless the group's only backend is NCCL,
// then on the current CUDA device. (getBackendName: present in every torch
// this builds against, unlike hasBackendForDeviceType.)
at::Device collective_device(c10d::ProcessGroup& group) {
  const std::string backend = group.getBackendName();
  if (backend.find("nccl") == std::string::npos || backend.find("gloo") != std::string::npos) {
    return at::Device(c10::DeviceType::CPU);
  }
  const auto* cuda = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return cuda->getDevice();
}

std::vector<at::Tensor> all_gather(c10d::ProcessGroup& group, const at::Tensor& input) {
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < group.getSize(); ++r) outputs[0].push_back(at::empty_like(input));
  std::vector<at::Tensor> inputs{input};
  group.allgather(outputs, inputs)->wait();
  return outputs[0];
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

}  // namespace

int64_t broadcast_seed(c10d::ProcessGroup& group, int64_t seed) {
  const at::Device device = collective_device(group);
  std::vector<at::Tensor> tensors{at::tensor({seed}, at::TensorOptions().dtype(at::kLong)).to(device)};
  c10d::BroadcastOptions options;
  options.rootRank = 0;
  group.broadcast(tensors, options)->wait();
  return tensors[0].cpu().item<int64_t>();
}

std::vector<std::string> all_gather_strings(c10d::ProcessGroup& group, const std::string& value) {
  const at::Device device = collective_device(group);
  // Lengths first (all-gather needs equal sizes), then the bytes padded to the longest.
  const at::Tensor length =
      at::tensor({static_cast<int64_t>(value.size())}, at::TensorOptions().dtype(at::kLong)).to(device);
  std::vector<int64_t> lengths;
  for (const at::Tensor& gathered : all_gather(group, length)) lengths.push_back(gathered.cpu().item<int64_t>());
  const int64_t longest = std::max<int64_t>(1, *std::max_element(lengths.begin(), lengths.end()));
  at::Tensor bytes = at::zeros({longest}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(bytes.data_ptr<uint8_t>(), value.data(), value.size());
  std::vector<std::string> values;
  const auto gathered = all_gather(group, bytes.to(device));
  for (size_t rank = 0; rank < gathered.size(); ++rank) {
    const at::Tensor host = gathered[rank].cpu();
    values.emplace_back(reinterpret_cast<const char*>(host.data_ptr<uint8_t>()), static_cast<size_t>(lengths[rank]));
  }
  return values;
}

std::string first_difference(const std::string& reference, const std::string& other, int64_t other_rank) {
  if (reference == other) return "";
  const auto expected = lines_of(reference), got = lines_of(other);
  for (size_t i = 0; i < std::max(expected.size(), got.size()); ++i) {
    const std::string a = i < expected.size() ? expected[i] : "(nothing)";
    const std::string b = i < got.size() ? got[i] : "(nothing)";
    if (a == b) continue;
    const size_t colon = a.find(": ");
    const std::string key =
        colon == std::string::npos ? std::string("line ") + std::to_string(i + 1) : a.substr(0, colon);
    const std::string value_a = colon == std::string::npos ? a : a.substr(colon + 2);
    const size_t colon_b = b.find(": ");
    const std::string value_b = colon_b == std::string::npos ? b : b.substr(colon_b + 2);
    return core::concat("rank ", other_rank, " differs from rank 0 in '", key, "': rank 0 has ", value_a, ", rank ",
                        other_rank, " has ", value_b);
  }
  return core::concat("rank ", other_rank, " differs from rank 0");
}

}  // namespace torch_shards
