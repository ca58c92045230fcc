// Tensors read from io arrays: dense rows land directly in their output
// rows; CSR rows become the three arrays of a torch sparse CSR tensor (or
// dense rows).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "io/array.h"
#include "io/csr_matrix.h"
#include "loader/sources/source.h"

namespace torch_shards::sources {

at::ScalarType to_scalar_type(io::DType dtype);

// A CSR row pointer written into `out`, an int32 or int64 tensor of its size.
void write_row_offsets(const std::vector<int64_t>& offsets, at::Tensor& out);

// The output of `rows` rows of a dense array: [rows, *array.shape[1:]].
TensorSpec dense_spec(const io::Array& array, int64_t rows);
// Reads the segments of `array` into `out` (a contiguous tensor of dense_spec's shape).
void read_dense(const io::Array& array, const std::vector<io::Segment>& segments, at::Tensor& out,
                ReadContext& context);
// The segments of a request (sorted by source row, runs merged).
std::vector<io::Segment> request_segments(const RowRequest& request);

// Output bytes of an average row of a CSR matrix delivered sparse (values and column indices at the
// widths read() gives them, a row offset), from its stored sizes: Source::sparse_row_bytes.
int64_t csr_row_bytes(const io::CsrMatrix& matrix);

// Rows of a CSR matrix, planned: the row offsets are read.
struct CsrRead {
  const io::CsrMatrix* matrix = nullptr;
  io::CsrPlan plan;
  bool dense = false;                    // densified rows instead of a sparse tensor
  at::ScalarType index_type = at::kInt;  // of the sparse outputs (int32 when they fit)
  // Dense: the plan's rows are the request's in source order, plan row k
  // landing in output row dests[k] (sparse: the request's order, in place).
  std::vector<int64_t> dests;
  // Written by a collection into its own arrays (fill_placed): fill() then
  // reads nothing and returns an undefined tensor.
  bool claimed = false;

  // Plans reading `request`'s rows; declares the outputs of `field` in `outputs`.
  static CsrRead plan_rows(const io::CsrMatrix& matrix, const RowRequest& request, bool dense, const std::string& field,
                           std::vector<OutputSpec>& outputs, core::ThreadPool& pool);
  // Number of outputs plan_rows declared (3 sparse, 1 dense).
  size_t num_outputs() const { return dense ? 1 : 3; }
  // Writes the rows into outputs[first .. first + num_outputs()) and returns the field's tensor.
  at::Tensor fill(const std::vector<at::Tensor>& outputs, size_t first, ReadContext& context) const;
  // Sparse: writes the rows into a collection's CSR arrays, plan row k's
  // column indices and values from element starts[k] of `columns` and `values`.
  // With `raw_columns`, the column indices go there instead, as stored
  // (matrix->index_dtype()) and checked, at the same element positions, for
  // widen_columns() to convert every part's at once.
  void fill_placed(const std::vector<int64_t>& starts, at::Tensor& columns, at::Tensor& values, ReadContext& context,
                   void* raw_columns = nullptr) const;
  // Converts all of `columns` from the column indices fill_placed() put in
  // `raw_columns` (as this matrix stores them).
  void widen_columns(const void* raw_columns, at::Tensor& columns) const;
};

}  // namespace torch_shards::sources
