// Rows without fields: a dataset of N rows whose batches carry only their
// "index". It is how the Python door deals any indexable collection (scDataset's
// data_collection): the native side decides which rows each rank and worker
// reads, in which units and batches; Python fetches them from the collection.
#pragma once

#include <memory>
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
  // Nothing to read: the unit's "index" is its batch.
  std::unique_ptr<PlannedRead> plan(const RowRequest& request, ReadContext& context) const override;
  std::string describe() const override;

 private:
  int64_t num_rows_;
  std::string description_;
};

}  // namespace torch_shards::sources
