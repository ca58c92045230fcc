// Batches crossing from a DataLoader worker process to the main process.
//
// torch sends every tensor of a batch on its own (one file descriptor passed
// over a socket per storage and tensor) and into fresh shared memory that
// the worker page-faults in again for every batch. Here a batch, or a whole
// unit of batches, crosses as the few storages its tensors view (usually
// one: a unit is carved from one storage) plus a small int64 description;
// the main process rebuilds the same views without a copy.
//
// Recycling across processes (leases). A DataLoader worker's output storages
// come from its BufferPool in Memory::kSharedPooled: each begins with a
// lease word (kLeaseHeaderBytes, before the first tensor). pack() adds one
// lease per batch description it makes, before the worker lets go of the
// batch; the main process's rebuilt tensors view the storage through an
// alias whose deleter removes that lease once the last of them is gone
// (whatever thread or copy dropped it: DataLoader's pin-memory thread
// included). The pool hands a storage out again only when it holds the only
// reference in the worker and no lease is left (buffer_pool.h), so a batch
// the main process still holds is never overwritten. A description made and
// never rebuilt (the loader shut down with it in flight) keeps its lease: the
// storage is never reused, which is safe.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "loader/sources/source.h"

namespace torch_shards {

class BufferPool;

// Bytes at the start of a pooled shared storage holding its lease count (the
// tensors carved from it start after them, 64-byte aligned).
inline constexpr size_t kLeaseHeaderBytes = 64;

// Leases outstanding on a pooled shared storage.
int64_t leases(const c10::Storage& storage);

// The storages a batch description names (uint8 tensors spanning each whole
// storage), the description, and the field names it refers to.
using Packed = std::tuple<std::vector<at::Tensor>, at::Tensor, std::vector<std::string>>;

// Describes `batches` (dense and sparse CSR fields, any strides) as views of
// the storages they use; storages `pool` recycles in shared memory get one
// lease each. `worker` and `worker_batches` (the batches each worker of the
// iteration delivers) travel along for the main process.
Packed pack(const std::vector<sources::Batch>& batches, const BufferPool* pool, int64_t worker,
            const std::vector<int64_t>& worker_batches);

// The batches of a description made by pack(), as views of `storages` (the
// same storages, rebuilt in this process), with the worker and its
// iteration's batch counts. InvalidArgument if the description does not fit
// the storages.
std::tuple<std::vector<sources::Batch>, int64_t, std::vector<int64_t>> unpack(const std::vector<at::Tensor>& storages,
                                                                              const at::Tensor& description,
                                                                              const std::vector<std::string>& names);

}  // namespace torch_shards
