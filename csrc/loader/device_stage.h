// Batches delivered on an accelerator: host batches (in pinned memory) are
// copied on a side stream, an event is recorded after each copy, and the
// consumer's current stream waits on it, so no host synchronisation happens in
// the loop and the consumer's kernels see finished data. Written against
// torch's device-generic stream and event API (c10::Stream, c10::Event through
// the device guard): one build for CPU-only and CUDA torch, no CUDA headers.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <torch_shards/source.h>

namespace torch_shards {

// A device as the doors write it ("cpu", "cuda", "cuda:1"); ValueError for anything else.
std::optional<c10::Device> parse_device(const std::optional<std::string>& spec, const char* who);

// The device batches go to: nullopt keeps them on the host ("cpu" included);
// "cuda" without an index is the current device. Raises ValueError for a
// device this torch cannot reach and, under LOCAL_RANK, for an explicit index
// that is not the current device. When the current device is not LOCAL_RANK
// (damacy's cross-check), `warning` says so (else it is left empty): each door
// warns its own way (torch's custom-class and operator calls do not turn a
// TORCH_WARN into a Python warning).
std::optional<c10::Device> resolve_device(std::optional<c10::Device> device, const char* who, std::string& warning);

// Copies batches to one device. A host batch is kept until its copy's event
// has completed, so its (recycled, pinned) buffers are reused only then.
class DeviceStage {
 public:
  explicit DeviceStage(c10::Device device);
  DeviceStage(const DeviceStage&) = delete;
  DeviceStage& operator=(const DeviceStage&) = delete;

  // A batch whose copy to the device was started, and the event that ends it.
  struct Copy {
    Batch batch;
    c10::Event done;
  };
  // Starts the copy of a host batch (on the copy stream; the host does not wait).
  Copy start(const Batch& host);
  // The batch, once the device's current stream waits for its copy: kernels
  // queued after this see finished data. Hand over in the order started.
  Batch hand_over(Copy copy) const;
  // start + hand_over: the batch on the device, for the consumer's stream.
  Batch deliver(const Batch& host) { return hand_over(start(host)); }
  c10::Device device() const { return device_; }

 private:
  void release_finished();

  c10::Device device_;
  c10::Stream copy_stream_;
  std::deque<std::pair<c10::Event, Batch>> in_flight_;  // host batches whose copies may still run
};

// torch.classes.torch_shards.DeviceStage: the same copy for batches that reach
// the main process on the host (DataLoader workers; ts.DeviceLoader).
class DeviceStageImpl : public torch::CustomClassHolder {
 public:
  explicit DeviceStageImpl(const std::string& device);
  // Starts copying a batch (kept as it is for device "cpu").
  void put(const Batch& host);
  // The oldest batch put, handed over to the current stream; nullopt if none.
  std::optional<Batch> take();
  int64_t pending() const { return static_cast<int64_t>(host_.size() + copies_.size()); }
  std::string device() const;
  // The LOCAL_RANK cross-check's warning (resolve_device), or empty.
  const std::string& warning() const { return warning_; }

 private:
  std::string warning_;
  std::unique_ptr<DeviceStage> stage_;  // null: batches stay on the host
  std::deque<DeviceStage::Copy> copies_;
  std::deque<Batch> host_;  // device "cpu"
};

}  // namespace torch_shards
