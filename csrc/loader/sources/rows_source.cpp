#include "loader/sources/rows_source.h"

#include "core/errors.h"

namespace torch_shards::sources {

RowsSource::RowsSource(int64_t num_rows, std::string description)
    : num_rows_(num_rows), description_(std::move(description)) {
  core::check_argument(num_rows >= 1, "RowsSource: num_rows must be >= 1, got ", num_rows);
}

namespace {

class NoFields : public PlannedRead {
 public:
  Batch fill(const std::vector<at::Tensor>&, ReadContext&) override { return Batch(); }
};

}  // namespace

std::unique_ptr<PlannedRead> RowsSource::plan(const RowRequest&, ReadContext&) const {
  return std::make_unique<NoFields>();
}

std::string RowsSource::describe() const {
  return core::concat("RowsSource(num_rows=", num_rows_, description_.empty() ? "" : ", ", description_, ")");
}

}  // namespace torch_shards::sources
