// Batches delivered on an accelerator: host batches (in pinned memory) are
// copied on a side stream, an event is recorded after each copy, and the
// consumer's current stream waits on it, so no host synchronisation happens in
// the loop and the consumer's kernels see finished data. Written against
// torch's device-generic stream and event API (c10::Stream, c10::Event through
// the device guard): one build for CPU-only and CUDA torch, no CUDA headers.
//
// Host memory: a batch already in pinned memory (ShardedDataset(device=),
// whose outputs come pinned from the dataset's BufferPool) is copied field by
// field and held until its copy's event completed, so its storage goes back
// to that pool only then. Any other batch (ts.DeviceLoader's, from DataLoader
// workers' shared memory) is first assembled into one pinned staging storage
// from FencedBuffers (buffer_pool.h), its fields one after another (CSR: its
// row offsets, column indices and values), then copied in one transfer and
// cut into the device batch's tensors (CSR as torch.sparse_csr_tensor). The
// staging storage goes back to its pool once the copy's event completed: no
// pinned allocation per batch after the first rounds, and the staged bytes in
// flight stay within the bound (prefetch_bytes).
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
#include <vector>

#include <torch_shards/export.h>
#include <torch_shards/source.h>

#include "loader/buffer_pool.h"

namespace torch_shards {

// A batch laid out in one storage for one copy: its fields in order, each
// tensor (a CSR field's three) 64-byte aligned.
struct StagedBatch {
  struct Piece {
    size_t offset = 0;
    at::ScalarType dtype = at::kByte;
    std::vector<int64_t> sizes;
  };
  struct Field {
    std::string key;
    bool csr = false;
    std::vector<int64_t> sizes;  // the field's sizes (a CSR field's dense sizes)
    std::vector<Piece> pieces;   // dense: one; CSR: row offsets, column indices, values
  };
  c10::Storage storage;
  size_t bytes = 0;
  std::vector<Field> fields;
};

// Copies every field of `host` (dense or sparse CSR tensors, any strides) into
// one storage from `buffers`. The caller retires the storage once it is read.
TORCH_SHARDS_API StagedBatch stage_batch(const Batch& host, FencedBuffers& buffers);
// The batch as views of `bytes`, a uint8 tensor of staged.bytes bytes holding
// the staged storage's contents on any device (a CSR field as a sparse CSR tensor).
TORCH_SHARDS_API Batch unstage(const StagedBatch& staged, const at::Tensor& bytes);

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
  // bound_bytes: the staged bytes in flight (FencedBuffers).
  explicit DeviceStage(c10::Device device, int64_t bound_bytes = int64_t{1} << 30);
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
  FencedBuffers::Stats staging_stats() const { return staging_.stats(); }

 private:
  c10::Device device_;
  c10::Stream copy_stream_;
  FencedBuffers staging_;  // pinned; also holds the pinned host batches copied directly until their copies end
};

// torch.classes.torch_shards.DeviceStage: the same copy for batches that reach
// the main process on the host (DataLoader workers; ts.DeviceLoader).
class DeviceStageImpl : public torch::CustomClassHolder {
 public:
  DeviceStageImpl(const std::string& device, int64_t prefetch_bytes);
  // Starts copying a batch (kept as it is for device "cpu").
  void put(const Batch& host);
  // The oldest batch put, handed over to the current stream; nullopt if none.
  std::optional<Batch> take();
  int64_t pending() const { return static_cast<int64_t>(host_.size() + copies_.size()); }
  std::string device() const;
  // The LOCAL_RANK cross-check's warning (resolve_device), or empty.
  const std::string& warning() const { return warning_; }
  // The staging memory's counts (FencedBuffers::Stats by name; zeros for device "cpu").
  c10::Dict<std::string, int64_t> stats() const;

 private:
  std::string warning_;
  std::unique_ptr<DeviceStage> stage_;  // null: batches stay on the host
  std::deque<DeviceStage::Copy> copies_;
  std::deque<Batch> host_;  // device "cpu"
};

}  // namespace torch_shards
