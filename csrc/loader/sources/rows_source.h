// Rows without fields: a dataset of N rows whose batches carry only their
// "index". It is how the Python door deals any indexable collection (scDataset's
// data_collection): the native side decides which rows each rank and worker
// reads, in which units and batches; Python fetches them from the collection.
#pragma once

#include <string>
#include <vector>

#include "loader/sources/source.h"

namespace torch_shards::sources {

class RowsSource : public Source {
 public:
  // description names what the rows are (in describe(), and so in the ranks' check).
  RowsSource(int64_t num_rows, std::string description);
  int64_t num_rows() const override { return num_rows_; }
  std::vector<FieldSpec> fields() const override { return {}; }
  Batch read(const std::vector<int64_t>& rows, ReadContext& context) const override { return Batch(); }
  std::string describe() const override;

 private:
  int64_t num_rows_;
  std::string description_;
};

}  // namespace torch_shards::sources
