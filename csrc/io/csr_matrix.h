// A CSR sparse matrix on disk (three 1-D arrays: indptr, indices, data), read
// by rows straight into the CSR arrays of the requested rows, in delivery
// order. Reading is two-phase so callers can allocate the outputs (tensors)
// once the number of non-zeros is known:
//   CsrPlan plan = matrix.plan(rows, pool);   // reads indptr of those rows only
//   ... allocate plan.nnz() indices and values ...
//   matrix.read(plan, indices_out, values_out, pool);
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/function_ref.h"
#include "io/array.h"

namespace torch_shards::io {

struct CsrPlan {
  std::vector<int64_t> row_offsets;   // delivery-order CSR row pointer, size rows + 1
  std::vector<Segment> segments;      // element ranges of indices/data, sorted by source
  std::vector<int64_t> segment_rows;  // the delivery-order row each segment starts with
  int64_t nnz() const { return row_offsets.empty() ? 0 : row_offsets.back(); }
};

class CsrMatrix {
 public:
  // Validates shapes and dtypes (names the arrays on failure).
  CsrMatrix(std::shared_ptr<const Array> indptr, std::shared_ptr<const Array> indices,
            std::shared_ptr<const Array> data, int64_t num_rows, int64_t num_cols);

  int64_t num_rows() const { return num_rows_; }
  int64_t num_cols() const { return num_cols_; }
  DType value_dtype() const { return data_->info().dtype; }
  DType index_dtype() const { return indices_->info().dtype; }
  // Elements of its data array: the values of all its rows (as stored, without reading indptr).
  int64_t stored_values() const { return data_->num_rows(); }
  const Array& data() const { return *data_; }
  std::string where() const;
  // Array::open_files of its three arrays.
  void open_files(std::vector<const File*>& files) const;
  // Whether a read of it waits on requests (Array::remote of its three arrays).
  bool remote() const { return indptr_->remote() || indices_->remote() || data_->remote(); }
  // Array::opened_stamps of its three arrays.
  void opened_stamps(FileStamps& stamps) const;

  // Reads indptr for `rows` (delivery order, duplicates allowed), checks it is
  // monotone and within the arrays, and plans the element reads.
  // `positions_by_row`, when not null, holds the positions of `rows` in
  // ascending row order (the planner's: the rows are then walked through
  // them, not sorted again; a logic_error if they are not in row order).
  CsrPlan plan(const std::vector<int64_t>& rows, core::ThreadPool& pool,
               const std::vector<int64_t>* positions_by_row = nullptr) const;
  // Reads column indices (as `index_dtype`: kInt32, kInt64 or the stored
  // index_dtype(), left as it is) and values (the data dtype) of the planned
  // rows; checks every column index is in [0, num_cols).
  void read(const CsrPlan& plan, void* indices_out, DType index_dtype, void* values_out, core::ThreadPool& pool) const;
  // read(), each planned row placed in arrays that other reads share (the
  // parts of a collection write into the collection's): plan row k's column
  // indices and values start at element starts[k] of indices_out and
  // values_out.
  void read_placed(const CsrPlan& plan, const std::vector<int64_t>& starts, void* indices_out, DType index_dtype,
                   void* values_out, core::ThreadPool& pool) const;
  // The planned rows of a plan of rows in ascending order (each segment's
  // place after the previous one's), read in groups of consecutive plan rows
  // into per-thread memory that stays in cache, the groups spread over the
  // pool: visit(first_row, end_row, indices, values) gets plan rows
  // [first_row, end_row), element k of its arrays being element
  // row_offsets[first_row] + k of the plan, column indices as index_dtype
  // (as read() takes it), checked. No output the size of the whole read.
  using GroupVisitor = core::FunctionRef<void(int64_t, int64_t, const void*, const void*)>;
  void read_groups(const CsrPlan& plan, DType index_dtype, core::ThreadPool& pool, GroupVisitor visit) const;
  // Converts (or copies) `count` column indices as stored at `raw` to
  // index_dtype into `out`, checking each in the same pass. Kept as stored,
  // `out` may be null or `raw` itself: they are then only checked.
  void convert_indices(const uint8_t* raw, int64_t count, DType index_dtype, void* out) const;

 private:
  // plan() of rows whose positions in ascending row order are given.
  CsrPlan plan_in_row_order(const std::vector<int64_t>& rows, const std::vector<int64_t>& sorted,
                            core::ThreadPool& pool) const;
  // The ReadError of indptr entries that are not monotone or out of range at `row`.
  [[noreturn]] void throw_inconsistent(int64_t row, int64_t start, int64_t stop) const;
  // read() (starts == nullptr) and read_placed().
  void read_rows(const CsrPlan& plan, const std::vector<int64_t>* starts, void* indices_out, DType index_dtype,
                 void* values_out, core::ThreadPool& pool) const;

  std::shared_ptr<const Array> indptr_, indices_, data_;
  int64_t num_rows_, num_cols_;
};

}  // namespace torch_shards::io
