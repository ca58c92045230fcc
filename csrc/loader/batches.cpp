#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "loader/batches.h"

#include <ATen/ops/_sparse_csr_tensor_unsafe.h>
#include <ATen/ops/add.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/resolve_conj.h>
#include <ATen/ops/resolve_neg.h>
#include <ATen/ops/sparse_csr_tensor.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/to.h>

#include <algorithm>
#include <typeinfo>

#include "core/errors.h"

namespace torch_shards {

int64_t batch_bytes(const sources::Batch& batch) {
  int64_t bytes = 0;
  const auto add = [&](const at::Tensor& tensor) { bytes += tensor.numel() * static_cast<int64_t>(tensor.itemsize()); };
  for (const auto& item : batch) {
    const at::Tensor& tensor = item.value();
    if (tensor.layout() == at::kSparseCsr) {
      add(tensor.values());
      add(tensor.col_indices());
      add(tensor.crow_indices());
    } else {
      add(tensor);
    }
  }
  return bytes;
}

sources::Batch with_views_resolved(const sources::Batch& batch) {
  const auto lazy = [](const at::Tensor& tensor) { return tensor.defined() && (tensor.is_conj() || tensor.is_neg()); };
  if (std::none_of(batch.begin(), batch.end(), [&](const auto& item) { return lazy(item.value()); })) return batch;
  sources::Batch out;
  for (const auto& item : batch) {
    out.insert(item.key(), lazy(item.value()) ? item.value().resolve_conj().resolve_neg() : item.value());
  }
  return out;
}

namespace {

// Rows [first, first + count) of `base`, sharing its storage. A plain tensor
// (a strided TensorImpl, no grad, no conjugate or negative bit: what the
// readers make) gets its view made directly: a narrow goes through the
// dispatcher and autograd and records view metadata for every batch (4.5% of
// the C++ door's time at block 64), none of which such a batch needs. Any
// other tensor (a fetch_transform's result may require grad, be a subclass)
// is narrowed, keeping its autograd history.
at::Tensor rows_view(const at::Tensor& base, int64_t first, int64_t count) {
  const c10::TensorImpl* source = base.unsafeGetTensorImpl();
  const bool plain = typeid(*source) == typeid(c10::TensorImpl) && base.layout() == at::kStrided &&
                     !base.requires_grad() && !base.is_conj() && !base.is_neg() && !source->is_python_dispatch();
  if (!plain) return base.narrow(0, first, count);
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(source->storage()), source->key_set(), source->dtype());
  c10::SmallVector<int64_t, 4> sizes(source->sizes().begin(), source->sizes().end());
  sizes[0] = count;
  impl->set_sizes_and_strides(sizes, source->strides(), source->storage_offset() + first * source->stride(0));
  return at::Tensor(std::move(impl));
}

// Batch b of a unit's sparse CSR field (rows [first_row, first_row + count)): views of its columns and
// values, with its row offsets rebased into `rebased` (rows + batches entries: batch b's count + 1 from
// first_row + b). The offsets are checked as they are read (ordered, within the stored values): a unit
// received from a DataLoader worker is cut when the loop takes each batch, after it was checked whole,
// and views reaching outside its values must never be made, whatever wrote its memory since.
template <typename Index>
at::Tensor csr_batch(const at::Tensor& tensor, const at::Tensor& offsets, const at::Tensor& columns,
                     const at::Tensor& values, const at::Tensor& rebased, int64_t b, int64_t first_row, int64_t count) {
  const Index* source = offsets.const_data_ptr<Index>() + first_row;
  Index* slot = rebased.mutable_data_ptr<Index>() + first_row + b;
  const Index first = source[0], last = source[count];
  const int64_t stored = std::min(columns.size(0), values.size(0));
  bool ordered = first >= 0 && last <= stored;
  for (int64_t r = 0; r < count; ++r) ordered &= source[r] <= source[r + 1];
  TORCH_CHECK_VALUE(ordered, "split_into_batches: the row offsets of a CSR field's rows ", first_row, "-",
                    first_row + count, " are out of order or past its ", stored, " stored values");
  for (int64_t r = 0; r <= count; ++r) slot[r] = source[r] - first;
  return at::_sparse_csr_tensor_unsafe(rows_view(rebased, first_row + b, count + 1),
                                       rows_view(columns, first, last - first), rows_view(values, first, last - first),
                                       {count, tensor.size(1)}, values.options().layout(at::kSparseCsr));
}

}  // namespace

int64_t rows_of(const sources::Batch& batch, const std::string& who) {
  core::check_argument(!batch.empty(), who, ": a batch needs at least one field, got an empty dict");
  int64_t rows = -1;
  std::string first;
  for (const auto& item : batch) {
    const at::Tensor& tensor = item.value();
    core::check_argument(tensor.defined() && tensor.dim() >= 1, who, ": field '", item.key(),
                         "' must be a tensor with rows (at least one dimension)");
    if (rows < 0) {
      rows = tensor.size(0);
      first = item.key();
    }
    core::check_argument(tensor.size(0) == rows, who, ": field '", item.key(), "' has ", tensor.size(0),
                         " rows but field '", first, "' has ", rows);
  }
  return rows;
}

UnitBatches::UnitBatches(const UnitCut& cut) : batch_size_(cut.batch_size) {
  for (const auto& item : cut.unit) {
    names_.push_back(item.key());
    fields_.push_back(Field{item.value(), {}, {}, {}, {}});
  }
  if (batch_size_ == 0) return;  // one batch, as it is
  rows_ = rows_of(cut.unit, "split_into_batches");
  batches_ = (rows_ + batch_size_ - 1) / batch_size_;
  whole_ = batches_ == 1;
  if (whole_) return;
  for (size_t f = 0; f < fields_.size(); ++f) {
    Field& field = fields_[f];
    const at::Tensor& tensor = field.tensor;
    if (tensor.layout() != at::kSparseCsr) continue;
    field.offsets = tensor.crow_indices();
    field.columns = tensor.col_indices();
    field.values = tensor.values();
    const auto given = cut.offsets.find(names_[f]);
    field.rebased =
        given != cut.offsets.end() ? given->value() : at::empty({rows_ + batches_}, field.offsets.options());
    TORCH_INTERNAL_ASSERT(field.rebased.numel() == rows_ + batches_ &&
                          field.rebased.scalar_type() == field.offsets.scalar_type() && field.rebased.is_contiguous());
  }
}

void UnitBatches::cut(int64_t b, std::vector<at::Tensor>& out) const {
  TORCH_INTERNAL_ASSERT(b >= 0 && b < batches_);
  if (whole_) {
    for (const Field& field : fields_) out.push_back(field.tensor);
    return;
  }
  const int64_t first_row = b * batch_size_, count = std::min(batch_size_, rows_ - first_row);
  for (const Field& field : fields_) {
    if (!field.offsets.defined()) {
      out.push_back(rows_view(field.tensor, first_row, count));
    } else if (field.offsets.scalar_type() == at::kInt) {
      out.push_back(csr_batch<int32_t>(field.tensor, field.offsets, field.columns, field.values, field.rebased, b,
                                       first_row, count));
    } else {
      out.push_back(csr_batch<int64_t>(field.tensor, field.offsets, field.columns, field.values, field.rebased, b,
                                       first_row, count));
    }
  }
}

std::vector<sources::Batch> split_into_batches(const sources::Batch& unit, int64_t batch_size,
                                               const sources::Batch& offsets) {
  const UnitBatches batches(UnitCut{unit, batch_size, offsets});
  if (batches.size() == 1) return {unit};
  std::vector<sources::Batch> out(static_cast<size_t>(batches.size()));
  std::vector<at::Tensor> fields;
  const std::vector<std::string>& names = batches.names();
  for (int64_t b = 0; b < batches.size(); ++b) {
    fields.clear();
    batches.cut(b, fields);
    for (size_t f = 0; f < names.size(); ++f) out[b].insert(names[f], std::move(fields[f]));
  }
  return out;
}

std::vector<sources::Batch> cut_unit(const UnitCut& cut) {
  if (cut.batch_size == 0) return {cut.unit};
  return split_into_batches(cut.unit, cut.batch_size, cut.offsets);
}

sources::Batch concat_batches(const std::vector<sources::Batch>& parts) {
  core::check_argument(!parts.empty(), "concat_batches: no batches");
  if (parts.size() == 1) return parts.front();
  sources::Batch out;
  for (const auto& item : parts.front()) {
    const std::string& name = item.key();
    std::vector<at::Tensor> pieces;
    for (const sources::Batch& part : parts) pieces.push_back(part.at(name));
    if (item.value().layout() != at::kSparseCsr) {
      out.insert(name, at::cat(pieces, 0));
      continue;
    }
    // Pieces may differ in index width (int32 where they fit): joined as the widest.
    at::ScalarType index = at::kInt;
    for (const at::Tensor& piece : pieces) {
      if (piece.crow_indices().scalar_type() == at::kLong) index = at::kLong;
    }
    std::vector<at::Tensor> offsets, columns, values;
    int64_t rows = 0, stored = 0;
    for (const at::Tensor& piece : pieces) {
      const at::Tensor crow = piece.crow_indices().to(index);
      // Each piece's offsets start at its first stored value; shifted after the previous pieces' values.
      const at::Tensor shifted = crow.sub(crow.select(0, 0)).add(stored);
      offsets.push_back(rows == 0 ? shifted : shifted.narrow(0, 1, shifted.size(0) - 1));
      columns.push_back(piece.col_indices().to(index));
      values.push_back(piece.values());
      rows += piece.size(0);
      stored += piece.col_indices().size(0);
    }
    out.insert(name,
               at::sparse_csr_tensor(at::cat(offsets, 0), at::cat(columns, 0), at::cat(values, 0),
                                     {rows, item.value().size(1)}, values.front().options().layout(at::kSparseCsr)));
  }
  return out;
}

}  // namespace torch_shards
