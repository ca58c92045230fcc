// The Python and TorchScript doors' plumbing of ShardedDatasetImpl and
// BatchIteratorImpl: what csrc/bindings (torch.classes) and csrc/python
// (torch_shards._C) reach beyond the training-loop API of
// include/torch_shards/dataset.h, which declares these members private (a
// C++ program sees the training loop only). Not installed.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch_shards/dataset.h>
#include "loader/batches.h"
#include "loader/iteration.h"

namespace torch_shards {

struct DatasetDoor {
  using State = ShardedDatasetImpl::State;  // pickling (TorchScript)

  // Datasets
  // @{
  // A dataset sharing `shared_state` (the words it shares with its DataLoader
  // workers: epoch counter, delivery counters) with the main process's, as
  // the Python door rebuilds it in worker processes; nullopt: a new one.
  static c10::intrusive_ptr<ShardedDatasetImpl> make(c10::intrusive_ptr<SourceImpl> source,
                                                     c10::intrusive_ptr<StrategyImpl> strategy,
                                                     const DatasetOptions& options,
                                                     const std::optional<at::Tensor>& shared_state) {
    return c10::make_intrusive<ShardedDatasetImpl>(std::move(source), std::move(strategy), options, shared_state,
                                                   ShardedDatasetImpl::DoorKey());
  }
  static c10::intrusive_ptr<BatchIteratorImpl> iter_worker(ShardedDatasetImpl& dataset, int64_t worker,
                                                           int64_t num_workers, int64_t generation_seed,
                                                           bool shared_memory, bool recycled = false,
                                                           std::optional<int64_t> stream_start = std::nullopt) {
    return dataset.iter_worker(worker, num_workers, generation_seed, shared_memory, recycled, stream_start);
  }
  static const std::string& device_warning(const ShardedDatasetImpl& dataset) { return dataset.device_warning(); }
  static void synchronize(ShardedDatasetImpl& dataset, const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
    dataset.synchronize(group);
  }
  static bool synchronized(const ShardedDatasetImpl& dataset) { return dataset.synchronized(); }
  static const std::string& topology_source(const ShardedDatasetImpl& dataset) { return dataset.topology_source(); }
  static const at::Tensor& shared_state(const ShardedDatasetImpl& dataset) { return dataset.shared_state(); }
  static void workers_starting(ShardedDatasetImpl& dataset) { dataset.workers_starting(); }
  static State state(const ShardedDatasetImpl& dataset) { return dataset.state(); }
  static c10::intrusive_ptr<ShardedDatasetImpl> from_state(const State& state) {
    return ShardedDatasetImpl::from_state(state);
  }
  // @}

  // Iterators
  // @{
  static bool wait(BatchIteratorImpl& iterator, int64_t timeout_ms) { return iterator.wait(timeout_ms); }
  static std::optional<Batch> poll(BatchIteratorImpl& iterator, int64_t timeout_ms) {
    return iterator.poll(timeout_ms);
  }
  static std::vector<UnitCut> take_units(BatchIteratorImpl& iterator, int64_t timeout_ms, int64_t max_bytes) {
    return iterator.take_units(timeout_ms, max_bytes);
  }
  static const std::vector<int64_t>& worker_batches(const BatchIteratorImpl& iterator) {
    return iterator.worker_batches();
  }
  static const Iteration& iteration(const BatchIteratorImpl& iterator) { return iterator.iteration(); }
  // @}
};

}  // namespace torch_shards
