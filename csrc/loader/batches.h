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

// The bytes of the elements `batch`'s fields hold (CSR: values, column and
// row indices).
int64_t batch_bytes(const sources::Batch& batch);

// `batch` with every conjugate or negative view (x.conj(), x.conj().imag)
// materialised: such a view's bit says how to read its memory, and code that
// copies, shares or describes that memory directly (a TensorSource's rows, a
// worker's packed batches) would deliver it unconjugated, unnegated. The same
// tensors where no field has the bit.
sources::Batch with_views_resolved(const sources::Batch& batch);

// Batches of batch_size rows (the last may be short): views of the unit's
// tensors. CSR tensors become views of their columns and values, with row
// offsets rebased for every batch into `offsets[field]` when given (rows +
// batches entries of the field's index dtype: the reader carves it from the
// unit's own storage), else into one new tensor per field.
std::vector<sources::Batch> split_into_batches(const sources::Batch& unit, int64_t batch_size,
                                               const sources::Batch& offsets = sources::Batch());

// A unit and how it is cut into batches: what crosses from a DataLoader
// worker (transfer.h), cut only where the batches are taken.
struct UnitCut {
  sources::Batch unit;
  // Rows per batch; 0: the unit is one batch, as it is (no row to count: it may hold none).
  int64_t batch_size = 0;
  sources::Batch offsets;  // split_into_batches' offsets for the unit's CSR fields (may be empty)
};

// The unit's batches: split_into_batches(unit, batch_size, offsets), or the unit itself for batch_size 0.
std::vector<sources::Batch> cut_unit(const UnitCut& cut);

// The pieces of one unit (in order) as one batch: dense fields concatenated,
// CSR fields joined with their row offsets shifted.
sources::Batch concat_batches(const std::vector<sources::Batch>& parts);

}  // namespace torch_shards
