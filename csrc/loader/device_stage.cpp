#include "loader/device_stage.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <cerrno>
#include <cstdlib>

#include "core/errors.h"
#include "core/local_rank.h"

namespace torch_shards {
namespace {

std::optional<int64_t> local_rank_from_environment() {
  const char* text = std::getenv("LOCAL_RANK");
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  TORCH_CHECK_VALUE(end != text && *end == '\0' && errno == 0 && value >= 0,
                    "environment variable LOCAL_RANK must be a non-negative integer, got '", text, "'");
  return value;
}

// A field on the device: dense tensors copied as they are, CSR as its three parts.
at::Tensor to_device(const at::Tensor& host, c10::Device device, const c10::Stream& copy) {
  if (host.layout() == at::kSparseCsr) {
    return at::sparse_csr_tensor(to_device(host.crow_indices(), device, copy),
                                 to_device(host.col_indices(), device, copy), to_device(host.values(), device, copy),
                                 host.sizes(), host.options().device(device));
  }
  // Allocated on the consumer's stream (the caching allocator ties the memory
  // to it), written on the copy stream, which waited for the consumer's work.
  at::Tensor out = at::empty(host.sizes(), host.options().device(device));
  {
    const c10::StreamGuard on_copy_stream(copy);
    out.copy_(host, /*non_blocking=*/true);
  }
  return out;
}

}  // namespace

std::optional<c10::Device> parse_device(const std::optional<std::string>& spec, const char* who) {
  if (!spec) return std::nullopt;
  try {
    return c10::Device(*spec);
  } catch (const c10::Error&) {
    TORCH_CHECK_VALUE(false, who, ": device must be None, 'cpu', 'cuda' or 'cuda:<index>', got '", *spec, "'");
  }
}

std::optional<c10::Device> resolve_device(std::optional<c10::Device> parsed, const char* who, std::string& warning) {
  warning.clear();
  if (!parsed || parsed->is_cpu()) return std::nullopt;
  const std::string spec = parsed->str();
  TORCH_CHECK_VALUE(parsed->is_cuda(), who, ": device '", spec, "' is not supported (batches go to 'cuda' devices)");
  TORCH_CHECK_VALUE(at::hasCUDA(), who, ": device='", spec,
                    "' but this torch has no CUDA device (torch.cuda.is_available() is False); leave device=None "
                    "to keep batches on the host");
  const c10::impl::VirtualGuardImpl guard(c10::DeviceType::CUDA);
  const int64_t count = guard.deviceCount();
  const int64_t current = guard.getDevice().index();
  const std::optional<int64_t> explicit_index =
      parsed->has_index() ? std::optional<int64_t>(parsed->index()) : std::nullopt;
  TORCH_CHECK_VALUE(!explicit_index || *explicit_index < count, who, ": device='", spec, "' but there are ", count,
                    " CUDA devices");
  const core::DeviceCheck check = core::check_local_rank(explicit_index, current, local_rank_from_environment());
  TORCH_CHECK_VALUE(!check.error, who, ": ", check.problem);
  if (!check.problem.empty()) warning = core::concat(who, ": ", check.problem);
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(explicit_index.value_or(current)));
}

DeviceStage::DeviceStage(c10::Device device)
    : device_(device),
      copy_stream_(c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device, false)) {}

void DeviceStage::release_finished() {
  while (!in_flight_.empty() && in_flight_.front().first.query()) in_flight_.pop_front();
}

DeviceStage::Copy DeviceStage::start(const Batch& host) {
  release_finished();
  const c10::DeviceGuard on_device(device_);
  const c10::Stream consumer = c10::impl::VirtualGuardImpl(device_.type()).getStream(device_);
  // The copy stream starts after the consumer's queued work (which may still
  // read memory the allocator hands out again now).
  c10::Event consumer_ready(device_.type());
  consumer_ready.record(consumer);
  consumer_ready.block(copy_stream_);
  Batch out;
  for (const auto& field : host) out.insert(field.key(), to_device(field.value(), device_, copy_stream_));
  c10::Event copied(device_.type());
  copied.record(copy_stream_);
  c10::Event host_free(device_.type());  // the same point: the host batch may be reused after it
  host_free.record(copy_stream_);
  in_flight_.emplace_back(std::move(host_free), host);
  return Copy{std::move(out), std::move(copied)};
}

Batch DeviceStage::hand_over(Copy copy) const {
  const c10::DeviceGuard on_device(device_);
  const c10::Stream consumer = c10::impl::VirtualGuardImpl(device_.type()).getStream(device_);
  copy.done.block(consumer);  // the consumer's kernels see finished data; the host does not wait
  return std::move(copy.batch);
}

DeviceStageImpl::DeviceStageImpl(const std::string& device) {
  const std::optional<c10::Device> resolved =
      resolve_device(parse_device(device, "DeviceLoader"), "DeviceLoader", warning_);
  if (resolved) stage_ = std::make_unique<DeviceStage>(*resolved);
}

void DeviceStageImpl::put(const Batch& host) {
  if (stage_) {
    copies_.push_back(stage_->start(host));
  } else {
    host_.push_back(host);
  }
}

std::optional<Batch> DeviceStageImpl::take() {
  if (!copies_.empty()) {
    Batch batch = stage_->hand_over(std::move(copies_.front()));
    copies_.pop_front();
    return batch;
  }
  if (host_.empty()) return std::nullopt;
  Batch batch = host_.front();
  host_.pop_front();
  return batch;
}

std::string DeviceStageImpl::device() const { return stage_ ? stage_->device().str() : "cpu"; }

}  // namespace torch_shards
