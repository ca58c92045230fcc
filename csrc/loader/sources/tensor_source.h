// Rows of in-memory tensors: one field per tensor, gathered with index_select.
#pragma once

#include <string>
#include <vector>

#include "loader/sources/source.h"

namespace torch_shards::sources {

class TensorSource : public Source {
 public:
  explicit TensorSource(Batch fields);
  int64_t num_rows() const override { return num_rows_; }
  std::vector<FieldSpec> fields() const override;
  Batch read(const std::vector<int64_t>& rows, ReadContext& context) const override;
  std::string describe() const override;

  const Batch& tensors() const { return fields_; }

 private:
  Batch fields_;
  int64_t num_rows_ = 0;
};

}  // namespace torch_shards::sources
