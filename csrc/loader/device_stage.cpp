#include "loader/device_stage.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
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

// A pinned field on the device: dense tensors copied as they are, CSR as its three parts.
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

// The tensors a field is read through (a CSR field's three).
std::vector<at::Tensor> parts_of(const at::Tensor& field) {
  if (field.layout() == at::kSparseCsr) return {field.crow_indices(), field.col_indices(), field.values()};
  return {field};
}

// Pinned batches are copied as they are (their storages held until the copy ends); others are staged.
bool pinned(const Batch& host) {
  for (const auto& field : host) {
    for (const at::Tensor& part : parts_of(field.value())) {
      if (!part.is_cpu() || !part.is_pinned()) return false;
    }
  }
  return true;
}

// The end of a copy on the device: the event recorded after it.
class EventFence : public Fence {
 public:
  explicit EventFence(c10::Event event) : event_(std::move(event)) {}
  bool done() override { return event_.query(); }
  void wait() override { event_.synchronize(); }

 private:
  c10::Event event_;
};

constexpr size_t kAlignment = 64;

size_t aligned(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

at::Tensor bytes_of(const c10::Storage& storage, size_t bytes) {
  at::Tensor out = at::empty({0}, at::TensorOptions().dtype(at::kByte));
  out.set_(storage, 0, {static_cast<int64_t>(bytes)}, {1});
  return out;
}

}  // namespace

StagedBatch stage_batch(const Batch& host, FencedBuffers& buffers) {
  StagedBatch staged;
  size_t total = 0;
  std::vector<at::Tensor> sources;
  for (const auto& field : host) {
    const at::Tensor& value = field.value();
    TORCH_CHECK_TYPE(value.layout() == at::kStrided || value.layout() == at::kSparseCsr, "DeviceStage: field '",
                     field.key(), "' has layout ", value.layout(), " (dense or sparse CSR tensors only)");
    StagedBatch::Field out{field.key(), value.layout() == at::kSparseCsr, value.sizes().vec(), {}};
    for (const at::Tensor& part : parts_of(value)) {
      out.pieces.push_back(StagedBatch::Piece{total, part.scalar_type(), part.sizes().vec()});
      total += aligned(static_cast<size_t>(part.numel()) * part.element_size());
      sources.push_back(part);
    }
    staged.fields.push_back(std::move(out));
  }
  staged.bytes = std::max(total, kAlignment);
  staged.storage = buffers.acquire(staged.bytes);
  const at::Tensor bytes = bytes_of(staged.storage, staged.bytes);
  size_t i = 0;
  for (const StagedBatch::Field& field : staged.fields) {
    for (const StagedBatch::Piece& piece : field.pieces) {
      const at::Tensor& source = sources[i++];
      const int64_t nbytes = source.numel() * static_cast<int64_t>(source.element_size());
      at::Tensor target =
          bytes.narrow(0, static_cast<int64_t>(piece.offset), nbytes).view(piece.dtype).view(piece.sizes);
      target.copy_(source.cpu());  // any strides; a device tensor comes back first
    }
  }
  return staged;
}

Batch unstage(const StagedBatch& staged, const at::Tensor& bytes) {
  TORCH_CHECK(
      bytes.scalar_type() == at::kByte && bytes.dim() == 1 && bytes.numel() >= static_cast<int64_t>(staged.bytes),
      "unstage: needs a uint8 tensor of ", staged.bytes, " bytes");
  Batch out;
  for (const StagedBatch::Field& field : staged.fields) {
    std::vector<at::Tensor> parts;
    for (const StagedBatch::Piece& piece : field.pieces) {
      int64_t numel = 1;
      for (int64_t size : piece.sizes) numel *= size;
      parts.push_back(bytes.narrow(0, static_cast<int64_t>(piece.offset), numel * c10::elementSize(piece.dtype))
                          .view(piece.dtype)
                          .view(piece.sizes));
    }
    if (field.csr) {
      out.insert(field.key, at::sparse_csr_tensor(parts[0], parts[1], parts[2], field.sizes,
                                                  parts[2].options().layout(at::kSparseCsr)));
    } else {
      out.insert(field.key, parts[0]);
    }
  }
  return out;
}

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

DeviceStage::DeviceStage(c10::Device device, int64_t bound_bytes)
    : device_(device),
      copy_stream_(c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device, false)),
      staging_(sources::Memory::kPinned, bound_bytes) {}

DeviceStage::Copy DeviceStage::start(const Batch& host) {
  staging_.reclaim();
  const bool direct = pinned(host);
  // Assembled before the copy stream is told to wait: the host's work overlaps the copies queued.
  std::optional<StagedBatch> staged;
  if (!direct) staged = stage_batch(host, staging_);
  const c10::DeviceGuard on_device(device_);
  const c10::Stream consumer = c10::impl::VirtualGuardImpl(device_.type()).getStream(device_);
  // The copy stream starts after the consumer's queued work (which may still
  // read memory the allocator hands out again now).
  c10::Event consumer_ready(device_.type());
  consumer_ready.record(consumer);
  consumer_ready.block(copy_stream_);
  Batch out;
  std::vector<c10::Storage> held;  // the pinned host batch's storages, until its copy ends
  if (direct) {
    for (const auto& field : host) {
      out.insert(field.key(), to_device(field.value(), device_, copy_stream_));
      for (const at::Tensor& part : parts_of(field.value())) held.push_back(part.storage());
    }
  } else {
    at::Tensor on_device =
        at::empty({static_cast<int64_t>(staged->bytes)}, at::TensorOptions().dtype(at::kByte).device(device_));
    {
      const c10::StreamGuard on_copy_stream(copy_stream_);
      on_device.copy_(bytes_of(staged->storage, staged->bytes), /*non_blocking=*/true);
    }
    out = unstage(*staged, on_device);
  }
  c10::Event copied(device_.type());
  copied.record(copy_stream_);
  c10::Event host_free(device_.type());  // the same point: the host memory may be reused after it
  host_free.record(copy_stream_);
  staging_.retire(staged ? staged->storage : c10::Storage(), std::make_unique<EventFence>(std::move(host_free)),
                  std::move(held));
  return Copy{std::move(out), std::move(copied)};
}

Batch DeviceStage::hand_over(Copy copy) const {
  const c10::DeviceGuard on_device(device_);
  const c10::Stream consumer = c10::impl::VirtualGuardImpl(device_.type()).getStream(device_);
  copy.done.block(consumer);  // the consumer's kernels see finished data; the host does not wait
  return std::move(copy.batch);
}

DeviceStageImpl::DeviceStageImpl(const std::string& device, int64_t prefetch_bytes) {
  TORCH_CHECK_VALUE(prefetch_bytes >= 0, "DeviceLoader: prefetch_bytes must be >= 0, got ", prefetch_bytes);
  const std::optional<c10::Device> resolved =
      resolve_device(parse_device(device, "DeviceLoader"), "DeviceLoader", warning_);
  if (resolved) stage_ = std::make_unique<DeviceStage>(*resolved, prefetch_bytes);
}

c10::Dict<std::string, int64_t> DeviceStageImpl::stats() const {
  const FencedBuffers::Stats s = stage_ ? stage_->staging_stats() : FencedBuffers::Stats{};
  c10::Dict<std::string, int64_t> out;
  out.insert("allocations", s.allocations);
  out.insert("reuses", s.reuses);
  out.insert("waits", s.waits);
  out.insert("in_flight", s.in_flight);
  out.insert("in_flight_bytes", s.in_flight_bytes);
  out.insert("peak_in_flight_bytes", s.peak_in_flight_bytes);
  return out;
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
