// torch's once-per-process warnings that a DataLoader worker would repeat.
//
// torch warns once per process that sparse CSR tensors are in beta
// (TORCH_WARN_ONCE in SparseCsrTensorImpl). The training process shows it when
// it rebuilds a CSR batch; a worker's reader threads, which make every CSR batch
// there, would print it once more per worker process (on stderr: no Python
// warning handler in a native thread). A worker consumes it silently instead.
#pragma once

namespace torch_shards {

// Makes one empty CSR tensor under a warning handler that drops what it is
// given, so that torch's once-per-process warning is spent in this process and
// never printed here. Cheap and idempotent; only ever called in a DataLoader
// worker (ShardedDatasetImpl::iter_worker).
void spend_sparse_csr_beta_warning();

}  // namespace torch_shards
