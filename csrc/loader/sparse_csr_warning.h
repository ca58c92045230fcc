// Where torch's once-per-process warning that sparse CSR tensors are in beta
// (TORCH_WARN_ONCE in SparseCsrTensorImpl) is shown, for a source with CSR
// fields.
//
// The reader threads make every CSR batch. The first they made raised the
// warning there, where no Python warning handler is installed: c10 printed it
// on stderr, past Python's warning filters, in the training process and once
// more in every DataLoader worker. It is raised now on the thread that starts
// the iteration instead, through that thread's handler (Python's warnings,
// when called from Python: shown once, filtered as the user filters them), and
// spent silently in a DataLoader worker, whose training process shows it.
#pragma once

#include "loader/sources/source.h"

namespace torch_shards {

// In the training process (or a C++ loop), before the reader threads start:
// raises torch's warning on the calling thread if the source has a CSR field
// (a no-op once the warning has been raised in this process).
void raise_sparse_csr_warning_here(const sources::Source& source);

// In a DataLoader worker: spends the warning under a handler that drops it,
// if the source has a CSR field.
void spend_sparse_csr_warning_silently(const sources::Source& source);

}  // namespace torch_shards
