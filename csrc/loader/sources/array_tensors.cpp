#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "loader/sources/array_tensors.h"

#include <ATen/Dispatch_v2.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sparse_csr_tensor.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cstring>
#include <limits>

namespace torch_shards::sources {

at::ScalarType to_scalar_type(io::DType dtype) {
  switch (dtype) {
    case io::DType::kBool:
      return at::kBool;
    case io::DType::kInt8:
      return at::kChar;
    case io::DType::kUInt8:
      return at::kByte;
    case io::DType::kInt16:
      return at::kShort;
    case io::DType::kUInt16:
      return at::kUInt16;
    case io::DType::kInt32:
      return at::kInt;
    case io::DType::kUInt32:
      return at::kUInt32;
    case io::DType::kInt64:
      return at::kLong;
    case io::DType::kUInt64:
      return at::kUInt64;
    case io::DType::kFloat16:
      return at::kHalf;
    case io::DType::kBFloat16:
      return at::kBFloat16;
    case io::DType::kFloat32:
      return at::kFloat;
    case io::DType::kFloat64:
      return at::kDouble;
    case io::DType::kComplex64:
      return at::kComplexFloat;
    case io::DType::kComplex128:
      return at::kComplexDouble;
  }
  return at::kFloat;
}

at::Tensor read_dense(const io::Array& array, const std::vector<io::Segment>& segments, int64_t rows,
                      ReadContext& context) {
  std::vector<int64_t> shape{rows};
  shape.insert(shape.end(), array.info().shape.begin() + 1, array.info().shape.end());
  at::Tensor out = context.tensors.empty(shape, to_scalar_type(array.info().dtype));
  array.read(segments, out.data_ptr(), context.pool);
  return out;
}

namespace {
// int32 indices halve their memory; they fit when the read's values and the
// column count stay below 2^31 (always, for any realistic fetch).
at::ScalarType csr_index_type(const io::CsrMatrix& matrix, int64_t values) {
  constexpr int64_t kLimit = std::numeric_limits<int32_t>::max();
  return matrix.num_cols() <= kLimit && values <= kLimit ? at::kInt : at::kLong;
}

// CSR rows scattered into a dense [rows, columns] tensor (duplicate column
// entries sum, as scipy's toarray() does). Each row is zeroed just before its
// values land, while it is in cache: one pass over the output instead of a
// memset of the whole fetch and a second, scattered pass. Column indices are
// read as int32 when the columns allow (half the bytes of int64); the
// scratch buffers live on with the thread (no allocation per fetch).
template <typename Index>
void scatter_rows(const io::CsrPlan& plan, const Index* columns, const uint8_t* values, at::Tensor& out, int64_t rows,
                  int64_t num_columns, core::ThreadPool& pool) {
  constexpr int64_t kRowsPerTask = 256;
  AT_DISPATCH_V2(out.scalar_type(), "read_csr_dense", AT_WRAP([&] {
                   const auto* source = reinterpret_cast<const scalar_t*>(values);
                   scalar_t* dest = out.data_ptr<scalar_t>();
                   pool.parallel_for((rows + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t task) {
                     for (int64_t row = task * kRowsPerTask; row < std::min(rows, (task + 1) * kRowsPerTask); ++row) {
                       scalar_t* line = dest + row * num_columns;
                       std::memset(static_cast<void*>(line), 0, sizeof(scalar_t) * num_columns);
                       for (int64_t k = plan.row_offsets[row]; k < plan.row_offsets[row + 1]; ++k) {
                         line[columns[k]] = static_cast<scalar_t>(line[columns[k]] + source[k]);
                       }
                     }
                   });
                 }),
                 AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), at::kHalf, at::kBFloat16, at::kBool,
                 AT_EXPAND(AT_BAREBONES_UNSIGNED_TYPES));
}

at::Tensor read_csr_dense(const io::CsrMatrix& matrix, const io::CsrPlan& plan, ReadContext& context) {
  core::ThreadPool& pool = context.pool;
  const int64_t rows = static_cast<int64_t>(plan.row_offsets.size()) - 1;
  const int64_t num_columns = matrix.num_cols();
  const at::ScalarType dtype = to_scalar_type(matrix.value_dtype());
  at::Tensor out = context.tensors.empty({rows, num_columns}, dtype);
  thread_local std::vector<uint8_t> value_bytes, column_bytes;
  const size_t nnz = static_cast<size_t>(plan.nnz());
  const bool narrow = num_columns <= std::numeric_limits<int32_t>::max();
  const size_t index_size = narrow ? sizeof(int32_t) : sizeof(int64_t);
  value_bytes.resize(std::max<size_t>(nnz * at::elementSize(dtype), 1));
  column_bytes.resize(std::max<size_t>(nnz * index_size, 1));
  matrix.read(plan, column_bytes.data(), index_size, value_bytes.data(), pool);
  if (narrow) {
    scatter_rows(plan, reinterpret_cast<const int32_t*>(column_bytes.data()), value_bytes.data(), out, rows,
                 num_columns, pool);
  } else {
    scatter_rows(plan, reinterpret_cast<const int64_t*>(column_bytes.data()), value_bytes.data(), out, rows,
                 num_columns, pool);
  }
  return out;
}

}  // namespace

at::Tensor read_csr(const io::CsrMatrix& matrix, const std::vector<int64_t>& rows, bool dense, ReadContext& context) {
  core::ThreadPool& pool = context.pool;
  const io::CsrPlan plan = matrix.plan(rows, pool);
  if (dense) return read_csr_dense(matrix, plan, context);
  const at::ScalarType index_type = csr_index_type(matrix, plan.nnz());
  const int64_t count = static_cast<int64_t>(rows.size());
  at::Tensor row_offsets = context.tensors.empty({count + 1}, index_type);
  if (index_type == at::kInt) {
    auto* out = row_offsets.data_ptr<int32_t>();
    for (int64_t i = 0; i <= count; ++i) out[i] = static_cast<int32_t>(plan.row_offsets[i]);
  } else {
    std::memcpy(row_offsets.data_ptr<int64_t>(), plan.row_offsets.data(), (count + 1) * sizeof(int64_t));
  }
  at::Tensor columns = context.tensors.empty({plan.nnz()}, index_type);
  at::Tensor values = context.tensors.empty({plan.nnz()}, to_scalar_type(matrix.value_dtype()));
  matrix.read(plan, columns.data_ptr(), columns.element_size(), values.data_ptr(), pool);
  return at::sparse_csr_tensor(row_offsets, columns, values, {count, matrix.num_cols()},
                               values.options().layout(at::kSparseCsr));
}

}  // namespace torch_shards::sources
