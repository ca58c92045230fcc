// Cutting a unit (the rows of a fetch read at once) into the batches a
// dataset delivers: views of its tensors, no copy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch_shards/export.h>
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

// A unit and how it is cut into batches: what crosses from a DataLoader
// worker (transfer.h), cut only where the batches are taken.
struct UnitCut {
  sources::Batch unit;
  // Rows per batch; 0: the unit is one batch, as it is (no row to count: it may hold none).
  int64_t batch_size = 0;
  sources::Batch offsets;  // split_into_batches' offsets for the unit's CSR fields (may be empty)
};

// The batches of one unit, cut one at a time where they are taken: batches
// of batch_size rows (the last may be short), views of the unit's tensors.
// CSR tensors become views of their columns and values, with row offsets
// rebased for each batch into `offsets[field]` when given (rows + batches
// entries of the field's index dtype: the reader carves it from the unit's
// own storage), else into one new tensor per field. A unit of one batch (or
// batch size 0) is that batch, its tensors as they are. Throws
// InvalidArgument (rows_of) if the unit's fields disagree on their rows.
class TORCH_SHARDS_API UnitBatches {
 public:
  explicit UnitBatches(const UnitCut& cut);

  int64_t size() const { return batches_; }
  // The fields' names, in the unit's order.
  const std::vector<std::string>& names() const { return names_; }
  // Batch b's tensors (b in [0, size())), in names()' order, appended to `out`.
  void cut(int64_t b, std::vector<at::Tensor>& out) const;

 private:
  struct Field {
    at::Tensor tensor;  // the unit's
    // A CSR field's parts (each accessor of a sparse tensor makes a new view: taken once, not per batch).
    at::Tensor offsets, columns, values, rebased;
  };
  std::vector<std::string> names_;
  std::vector<Field> fields_;
  int64_t rows_ = 0, batch_size_ = 0, batches_ = 1;
  bool whole_ = true;  // one batch: the unit itself
};

// Every batch of a unit at once (UnitBatches), as dicts.
std::vector<sources::Batch> split_into_batches(const sources::Batch& unit, int64_t batch_size,
                                               const sources::Batch& offsets = sources::Batch());

// The unit's batches: split_into_batches(unit, batch_size, offsets), or the unit itself for batch_size 0.
std::vector<sources::Batch> cut_unit(const UnitCut& cut);

// The pieces of one unit (in order) as one batch: dense fields concatenated,
// CSR fields joined with their row offsets shifted.
sources::Batch concat_batches(const std::vector<sources::Batch>& parts);

}  // namespace torch_shards
