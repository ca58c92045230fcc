#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "loader/sources/array_tensors.h"

#include <ATen/Dispatch_v2.h>
#include <ATen/ops/sparse_csr_tensor.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <stdexcept>

#include "core/radix_sort.h"
#include "core/streaming_copy.h"

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

TensorSpec dense_spec(const io::Array& array, int64_t rows) {
  std::vector<int64_t> shape{rows};
  shape.insert(shape.end(), array.info().shape.begin() + 1, array.info().shape.end());
  return TensorSpec{shape, to_scalar_type(array.info().dtype)};
}

void read_dense(const io::Array& array, const std::vector<io::Segment>& segments, at::Tensor& out,
                ReadContext& context) {
  array.read(segments, out.data_ptr(), context.pool);
}

std::vector<io::Segment> request_segments(const RowRequest& request) {
  if (request.dests == nullptr) return io::segments_in_delivery_order(request.rows, request.sorted);
  return io::segments_for_rows(request.rows, *request.dests, request.sorted);
}

void write_row_offsets(const std::vector<int64_t>& offsets, at::Tensor& out) {
  if (out.scalar_type() == at::kInt) {
    auto* narrow = out.data_ptr<int32_t>();
    for (size_t i = 0; i < offsets.size(); ++i) narrow[i] = static_cast<int32_t>(offsets[i]);
  } else {
    std::memcpy(out.data_ptr<int64_t>(), offsets.data(), offsets.size() * sizeof(int64_t));
  }
}

namespace {

// int32 indices halve their memory; they fit when the read's values and the
// column count stay below 2^31 (always, for any realistic fetch).
at::ScalarType csr_index_type(const io::CsrMatrix& matrix, int64_t values) {
  constexpr int64_t kLimit = std::numeric_limits<int32_t>::max();
  return matrix.num_cols() <= kLimit && values <= kLimit ? at::kInt : at::kLong;
}

}  // namespace

int64_t csr_row_bytes(const io::CsrMatrix& matrix) {
  const int64_t values = matrix.stored_values();
  const int64_t index = static_cast<int64_t>(c10::elementSize(csr_index_type(matrix, values)));
  const int64_t per_value = static_cast<int64_t>(c10::elementSize(to_scalar_type(matrix.value_dtype()))) + index;
  int64_t bytes = 0;
  if (__builtin_mul_overflow(values, per_value, &bytes)) return int64_t{1} << 40;  // refused when allocated
  return bytes / std::max<int64_t>(1, matrix.num_rows()) + index;
}

namespace {

// The io dtype column indices are read as into `columns` (int32 or int64).
io::DType column_dtype(const at::Tensor& columns) {
  return columns.scalar_type() == at::kInt ? io::DType::kInt32 : io::DType::kInt64;
}

// visit(k) for k in [begin, end), four a turn: for the scatter below, whose
// one-a-turn loop spent a third of its time on the loop's own instructions.
template <typename Visit>
inline void four_a_turn(int64_t begin, int64_t end, const Visit& visit) {
  int64_t k = begin;
  for (; k + 4 <= end; k += 4) {
    visit(k);
    visit(k + 1);
    visit(k + 2);
    visit(k + 3);
  }
  for (; k < end; ++k) visit(k);
}

// CSR rows scattered into dense output rows (duplicate column entries sum, as
// scipy's toarray() does): plan rows [first, end), whose column indices and
// values start at `columns` and `values`, plan row k landing in output row
// dests[k] (the plan reads the rows in source order). Each row is zeroed just
// before its values land, while it is in cache: one pass over the output
// instead of a memset of the whole fetch and a second, scattered pass. A
// streamed output (ReadContext::streams: large, or crossing to another
// process) has each row built in a small buffer and streamed out
// (core/streaming_copy.h): the output's lines are then never read, only
// written.
template <typename Index>
void scatter_rows(const io::CsrPlan& plan, int64_t first, int64_t end, const Index* columns, const void* values,
                  at::Tensor& out, const std::vector<int64_t>& dests, int64_t num_columns, bool streaming) {
  constexpr size_t kMaxStagedRow = size_t{64} << 10;  // bytes: stays in the L2 cache
  const int64_t base = plan.row_offsets[first];
  AT_DISPATCH_V2(
      out.scalar_type(), "read_csr_dense", AT_WRAP([&] {
        const auto* source = static_cast<const scalar_t*>(values);
        scalar_t* dest = out.data_ptr<scalar_t>();
        const size_t row_bytes = sizeof(scalar_t) * num_columns;
        const bool staged = streaming && row_bytes <= kMaxStagedRow;
        // Staged rows: the buffer starts zeroed and is zeroed again where values landed. Each row is
        // staged as far from a 64-byte line's start as its target is (the buffer's spare line), so that
        // every line streams out with whole loads (copies from cache on one core: 5.7e6 rows of 8000
        // bytes a second against 4.5e6 with loads straddling two lines, with 16-byte stores).
        std::unique_ptr<uint8_t[]> buffer(staged ? new uint8_t[row_bytes + 64]() : nullptr);
        for (int64_t row = first; row < end; ++row) {
          scalar_t* target = dest + dests[static_cast<size_t>(row)] * num_columns;
          scalar_t* line = staged ? reinterpret_cast<scalar_t*>(core::line_aligned_like(buffer.get(), target)) : target;
          if (!staged) std::memset(static_cast<void*>(line), 0, row_bytes);
          const int64_t begin = plan.row_offsets[row] - base, stop = plan.row_offsets[row + 1] - base;
          four_a_turn(begin, stop,
                      [&](int64_t k) { line[columns[k]] = static_cast<scalar_t>(line[columns[k]] + source[k]); });
          if (!staged) continue;
          core::streaming_copy(target, line, row_bytes);
          four_a_turn(begin, stop, [&](int64_t k) { line[columns[k]] = scalar_t{}; });
        }
        if (staged) core::streaming_fence();
      }),
      AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), at::kHalf, at::kBFloat16, at::kBool, AT_EXPAND(AT_BAREBONES_UNSIGNED_TYPES));
}

}  // namespace

CsrRead CsrRead::plan_rows(const io::CsrMatrix& matrix, const RowRequest& request, bool dense, const std::string& field,
                           std::vector<OutputSpec>& outputs, core::ThreadPool& pool) {
  CsrRead read;
  read.matrix = &matrix;
  read.dense = dense;
  const at::ScalarType values = to_scalar_type(matrix.value_dtype());
  if (dense) {
    // Each dense row is written to its own place anyway: the CSR rows are read in source order (a range
    // per block of consecutive rows instead of one per shuffled row), then scattered where they go.
    std::vector<int64_t> positions, scratch;
    const std::vector<int64_t>& order = request.positions_by_row(positions, scratch);
    std::vector<int64_t> sorted(order.size());
    read.dests.resize(order.size());
    for (size_t k = 0; k < order.size(); ++k) {
      sorted[k] = request.rows[static_cast<size_t>(order[k])];
      read.dests[k] = request.dest(static_cast<size_t>(order[k]));
    }
    read.plan = matrix.plan(sorted, pool);
    outputs.push_back(
        OutputSpec{field, OutputSpec::Part::kDense, TensorSpec{{request.num_out_rows(), matrix.num_cols()}, values}});
    return read;
  }
  read.plan = matrix.plan(request.rows, pool, request.sorted);
  read.index_type = csr_index_type(matrix, read.plan.nnz());
  const int64_t count = static_cast<int64_t>(request.rows.size());
  outputs.push_back(OutputSpec{field, OutputSpec::Part::kCsrOffsets, TensorSpec{{count + 1}, read.index_type}});
  outputs.push_back(OutputSpec{field, OutputSpec::Part::kCsrColumns, TensorSpec{{read.plan.nnz()}, read.index_type}});
  outputs.push_back(OutputSpec{field, OutputSpec::Part::kCsrValues, TensorSpec{{read.plan.nnz()}, values}});
  return read;
}

at::Tensor CsrRead::fill(const std::vector<at::Tensor>& outputs, size_t first, ReadContext& context) const {
  if (claimed) return at::Tensor();
  core::ThreadPool& pool = context.pool;
  if (dense) {
    at::Tensor out = outputs[first];
    const int64_t num_columns = matrix->num_cols();
    // Column indices as stored when uint16 (annbatch's, numcodecs'): no widening pass, half the bytes of
    // int32; else as int32 when the columns allow. Read a group of rows at a time, each scattered while
    // its CSR values are in cache.
    const io::DType columns = matrix->index_dtype() == io::DType::kUInt16          ? io::DType::kUInt16
                              : num_columns <= std::numeric_limits<int32_t>::max() ? io::DType::kInt32
                                                                                   : io::DType::kInt64;
    const bool streaming = context.streams(out.nbytes(), out.element_size() * static_cast<size_t>(num_columns));
    matrix->read_groups(plan, columns, pool, [&](int64_t begin, int64_t end, const void* indices, const void* values) {
      if (columns == io::DType::kUInt16) {
        scatter_rows(plan, begin, end, static_cast<const uint16_t*>(indices), values, out, dests, num_columns,
                     streaming);
      } else if (columns == io::DType::kInt32) {
        scatter_rows(plan, begin, end, static_cast<const int32_t*>(indices), values, out, dests, num_columns,
                     streaming);
      } else {
        scatter_rows(plan, begin, end, static_cast<const int64_t*>(indices), values, out, dests, num_columns,
                     streaming);
      }
    });
    return out;
  }
  at::Tensor row_offsets = outputs[first], columns = outputs[first + 1], values = outputs[first + 2];
  const int64_t count = static_cast<int64_t>(plan.row_offsets.size()) - 1;
  write_row_offsets(plan.row_offsets, row_offsets);
  matrix->read(plan, columns.data_ptr(), column_dtype(columns), values.data_ptr(), pool);
  return at::sparse_csr_tensor(row_offsets, columns, values, {count, matrix->num_cols()},
                               values.options().layout(at::kSparseCsr));
}

void CsrRead::fill_placed(const std::vector<int64_t>& starts, at::Tensor& columns, at::Tensor& values,
                          ReadContext& context, void* raw_columns) const {
  if (dense) throw std::logic_error("CsrRead::fill_placed: the rows are read densely");
  if (raw_columns != nullptr) {
    matrix->read_placed(plan, starts, raw_columns, matrix->index_dtype(), values.data_ptr(), context.pool);
    return;
  }
  matrix->read_placed(plan, starts, columns.data_ptr(), column_dtype(columns), values.data_ptr(), context.pool);
}

void CsrRead::widen_columns(const void* raw_columns, at::Tensor& columns) const {
  matrix->convert_indices(static_cast<const uint8_t*>(raw_columns), columns.numel(), column_dtype(columns),
                          columns.data_ptr());
}

}  // namespace torch_shards::sources
