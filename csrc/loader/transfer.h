// Batches crossing from a DataLoader worker process to the main process.
//
// torch sends every tensor of a batch on its own: a file descriptor passed
// over a socket per storage, per batch, into fresh shared memory that is
// faulted in again every time. Here the worker assembles its batches in
// recycled shared-memory slabs (shared_slab.h), and a batch, or whole units
// of batches, cross as one small description: the slabs they view (handles
// the main process maps once and keeps), then each field's dtype, offset,
// sizes and strides. The main process rebuilds the same views, no copy. A
// unit crosses whole, with its batch size: the main process cuts it into
// batches (batches.h), so the worker does nothing per batch.
// Storages that are not slabs (tensors a batch_transform made) travel
// beside the description, the torch way.
//
// Recycling across processes (leases). pack() adds one lease per slab to the
// slab's lease word (its first 8 bytes), before the worker lets go of the
// batch; the main process's rebuilt tensors view the slab through an alias
// whose deleter removes that lease once the last of them is gone (whatever
// thread or copy dropped it: DataLoader's pin-memory thread included). The
// worker's pool hands a slab out again only when it holds the only reference
// and no lease is left (buffer_pool.h), so a batch the main process still
// holds is never overwritten. A description made and never rebuilt (the
// loader shut down with it in flight) keeps its lease: the slab is never
// reused, which is safe.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include <torch_shards/export.h>
#include "loader/batches.h"
#include "loader/shared_slab.h"
#include "loader/sources/source.h"

namespace torch_shards {

// Leases outstanding on a slab.
TORCH_SHARDS_API int64_t leases(const c10::Storage& slab);

struct Packed {
  std::vector<int64_t> description;
  std::vector<std::string> names;    // the field names it refers to
  std::vector<c10::Storage> others;  // storages that are not this process's slabs, in the order it numbers them
};

// Describes `units` (dense and sparse CSR fields on the CPU, any strides;
// each with how it is cut into batches) as views of the slabs and other
// storages they use, taking one lease on each slab. `worker` and
// `worker_batches` (the batches each worker of the iteration delivers; -1
// and empty when not known) travel along; `last` says that this worker
// sends nothing after it (the main process may then let go of its slabs once
// their batches are gone; a persistent worker, whose next epoch reuses them,
// does not say it, so they stay mapped). The slabs this process freed since
// the last call travel along too.
TORCH_SHARDS_API Packed pack(const std::vector<UnitCut>& units, int64_t worker,
                             const std::vector<int64_t>& worker_batches, bool last);
// The same for batches, each crossing as it is (a unit of batch size 0).
TORCH_SHARDS_API Packed pack(const std::vector<sources::Batch>& batches, int64_t worker,
                             const std::vector<int64_t>& worker_batches, bool last);

struct Unpacked {
  std::vector<sources::Batch> batches;
  int64_t worker = -1;
  std::vector<int64_t> worker_batches;
};

// The batches of a description made by pack() in another process, as views
// of its slabs (mapped here once) and of `others`, its units cut here (a CSR
// field's rebased row offsets are written into the memory the worker set
// aside for them). InvalidArgument if the description is malformed or does
// not fit its storages (a CSR field's row offsets included); RuntimeError if
// a slab cannot be mapped.
TORCH_SHARDS_API Unpacked unpack(const std::vector<int64_t>& description, const std::vector<std::string>& names,
                                 const std::vector<c10::Storage>& others);

struct UnpackedUnits {
  std::vector<UnitBatches> units;
  int64_t worker = -1;
  std::vector<int64_t> worker_batches;
};

// unpack(), its units left whole, to be cut batch by batch where they are taken.
TORCH_SHARDS_API UnpackedUnits unpack_units(const std::vector<int64_t>& description,
                                            const std::vector<std::string>& names,
                                            const std::vector<c10::Storage>& others);

}  // namespace torch_shards
