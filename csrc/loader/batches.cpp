#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "loader/batches.h"

#include <ATen/ops/_sparse_csr_tensor_unsafe.h>
#include <ATen/ops/empty.h>

#include <algorithm>

#include "core/errors.h"

namespace torch_shards {
namespace {

// The batches of a unit's sparse CSR tensor: views of its columns and values,
// with row offsets rebased for every batch in one shared storage (one
// allocation, and one shared-memory segment when sent to another process).
template <typename Index>
std::vector<at::Tensor> split_csr(const at::Tensor& tensor, int64_t batch_size) {
  const at::Tensor offsets = tensor.crow_indices();
  const int64_t rows = tensor.size(0);
  const int64_t batches = (rows + batch_size - 1) / batch_size;
  at::Tensor rebased = at::empty({rows + batches}, offsets.options());
  const Index* source = offsets.data_ptr<Index>();
  Index* dest = rebased.data_ptr<Index>();
  std::vector<at::Tensor> out;
  for (int64_t b = 0, first_row = 0; b < batches; ++b, first_row += batch_size) {
    const int64_t count = std::min(batch_size, rows - first_row);
    const Index first = source[first_row], last = source[first_row + count];
    Index* slot = dest + first_row + b;  // batch b's count + 1 offsets
    for (int64_t r = 0; r <= count; ++r) slot[r] = source[first_row + r] - first;
    out.push_back(at::_sparse_csr_tensor_unsafe(rebased.narrow(0, first_row + b, count + 1),
                                                tensor.col_indices().narrow(0, first, last - first),
                                                tensor.values().narrow(0, first, last - first), {count, tensor.size(1)},
                                                tensor.values().options().layout(at::kSparseCsr)));
  }
  return out;
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

std::vector<sources::Batch> split_into_batches(const sources::Batch& unit, int64_t batch_size) {
  const int64_t rows = rows_of(unit, "split_into_batches");
  const int64_t batches = (rows + batch_size - 1) / batch_size;
  std::vector<sources::Batch> out(static_cast<size_t>(batches));
  if (batches == 1) return {unit};
  for (const auto& item : unit) {
    const at::Tensor& tensor = item.value();
    if (tensor.layout() == at::kSparseCsr) {
      std::vector<at::Tensor> parts = tensor.crow_indices().scalar_type() == at::kInt
                                          ? split_csr<int32_t>(tensor, batch_size)
                                          : split_csr<int64_t>(tensor, batch_size);
      for (int64_t b = 0; b < batches; ++b) out[b].insert(item.key(), parts[b]);
      continue;
    }
    for (int64_t b = 0; b < batches; ++b) {
      out[b].insert(item.key(), tensor.narrow(0, b * batch_size, std::min(batch_size, rows - b * batch_size)));
    }
  }
  return out;
}

}  // namespace torch_shards
