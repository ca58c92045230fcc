// Rows of in-memory tensors: one field per tensor. CPU tensors are gathered
// straight into the output, row by row, on the read's threads; tensors on
// another device are gathered there with index_select.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "loader/sources/source.h"

namespace torch_shards::sources {

class TensorSource : public Source {
 public:
  explicit TensorSource(Batch fields);
  int64_t num_rows() const override { return num_rows_; }
  std::vector<FieldSpec> fields() const override;
  std::unique_ptr<PlannedRead> plan(const RowRequest& request, ReadContext& context) const override;
  std::string describe() const override;

  const Batch& tensors() const { return fields_; }

 private:
  Batch fields_;
  int64_t num_rows_ = 0;
};

// Copies rows[i] of `source` (rows of row_bytes bytes, contiguous) to row
// request.dest(i) of `out`, runs of consecutive rows at once, on the pool; in
// the order of `order` (positions i, e.g. by ascending source row:
// core::sort_positions_by_row), or as listed when it is null; with
// non-temporal stores when `streaming` (ReadContext::streams).
void gather_rows(const uint8_t* source, size_t row_bytes, const RowRequest& request, const std::vector<int64_t>* order,
                 uint8_t* out, core::ThreadPool& pool, bool streaming);

}  // namespace torch_shards::sources
