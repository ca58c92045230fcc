#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "loader/sources/anndata_source.h"

#include "core/errors.h"
#include "loader/sources/array_source.h"
#include "loader/sources/array_tensors.h"

namespace torch_shards::sources {

using core::check_argument;

AnnDataSource::AnnDataSource(std::shared_ptr<const io::AnnDataStore> store, const std::optional<std::string>& layer,
                             const std::vector<std::string>& obs, bool dense)
    : store_(std::move(store)), layer_(layer), matrix_(store_->matrix(layer)), dense_(dense) {
  check_argument(store_->n_obs() >= 1, "AnnDataSource: ", store_->root().where(),
                 " has no observations (an empty source)");
  for (const std::string& name : obs) {
    check_argument(name != "X" && name != "index", "AnnDataSource: obs column '", name,
                   "' clashes with a field name (X, index)");
    obs_.push_back(store_->obs_column(name));
  }
}

std::vector<FieldSpec> AnnDataSource::fields() const {
  std::vector<FieldSpec> specs;
  if (matrix_.csr) {
    specs.push_back(FieldSpec{"X", to_scalar_type(matrix_.csr->value_dtype()), {matrix_.cols}, !dense_});
  } else {
    specs.push_back(FieldSpec{"X", to_scalar_type(matrix_.dense->info().dtype), {matrix_.cols}, false});
  }
  for (const io::ObsColumn& column : obs_) {
    specs.push_back(FieldSpec{
        column.name, column.categorical ? at::kLong : to_scalar_type(column.values->info().dtype), {}, false});
  }
  return specs;
}

Batch AnnDataSource::read(const std::vector<int64_t>& rows, ReadContext& context) const {
  const int64_t count = static_cast<int64_t>(rows.size());
  const std::vector<io::Segment> segments = io::segments_in_delivery_order(rows);
  Batch batch;
  batch.insert("X", matrix_.csr ? read_csr(*matrix_.csr, rows, dense_, context)
                                : read_dense(*matrix_.dense, segments, count, context));
  for (const io::ObsColumn& column : obs_) {
    at::Tensor values = read_dense(*column.values, segments, count, context);
    batch.insert(column.name, column.categorical ? values.to(at::kLong) : values);
  }
  return batch;
}

std::string AnnDataSource::describe() const {
  const io::Group& root = store_->root();
  std::string text =
      core::concat("AnnDataSource(", root.file(), " [", storage_bytes(root.file()),
                   " bytes], X=", layer_ ? "layers/" + *layer_ : std::string("X"), " ", store_->n_obs(), "x",
                   store_->n_vars(), matrix_.csr ? (dense_ ? " csr->dense" : " csr") : " dense", ", obs=[");
  for (size_t i = 0; i < obs_.size(); ++i) text += (i ? ", " : "") + obs_[i].name;
  return text + "])";
}

}  // namespace torch_shards::sources
