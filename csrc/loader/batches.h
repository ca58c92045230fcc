// Cutting a unit (the rows of a fetch read at once) into the batches a
// dataset delivers: views of its tensors, no copy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loader/sources/source.h"

namespace torch_shards {

// The rows every field of `batch` holds (dense: size(0), sparse CSR:
// size(0)); throws InvalidArgument naming `who` and the field if a field is
// not a tensor with rows or if they disagree.
int64_t rows_of(const sources::Batch& batch, const std::string& who);

// Batches of batch_size rows (the last may be short). CSR tensors become
// views of their columns and values with row offsets rebased for every batch
// in one shared storage (one allocation; one shared-memory segment when sent
// to another process).
std::vector<sources::Batch> split_into_batches(const sources::Batch& unit, int64_t batch_size);

}  // namespace torch_shards
