#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "loader/sources/anndata_source.h"

#include <set>

#include "core/errors.h"
#include "loader/sources/array_source.h"
#include "loader/sources/array_tensors.h"

namespace torch_shards::sources {

using core::check_argument;

namespace {
std::string mask_field(const std::string& column) { return column + "_mask"; }
}  // namespace

AnnDataSource::AnnDataSource(std::shared_ptr<const io::AnnDataStore> store, const std::optional<std::string>& layer,
                             const std::vector<std::string>& obs, bool dense)
    : store_(std::move(store)), layer_(layer), matrix_(store_->matrix(layer)), dense_(dense) {
  std::set<std::string> names;
  for (const std::string& name : obs) {
    check_argument(name != "X" && name != "index", "AnnDataSource: obs column '", name,
                   "' clashes with a field name (X, index)");
    check_argument(names.insert(name).second, "AnnDataSource: obs column '", name, "' is asked for twice");
    obs_.push_back(store_->obs_column(name));
  }
  for (const io::ObsColumn& column : obs_) {
    const std::string mask = mask_field(column.name);
    check_argument(!column.mask || (names.insert(mask).second && mask != "X" && mask != "index"),
                   "AnnDataSource: the mask field '", mask, "' of nullable obs column '", column.name,
                   "' clashes with another field of the same name");
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
    specs.push_back(FieldSpec{column.name, to_scalar_type(column.values->info().dtype), {}, false});
    if (column.mask) specs.push_back(FieldSpec{mask_field(column.name), at::kBool, {}, false});
  }
  return specs;
}

namespace {

// Runs visit on what an AnnData source reads: its matrix (a CsrMatrix or an
// Array) and each obs column's arrays (both kinds have open_files and
// opened_stamps).
template <typename Visit>
void visit_read_arrays(const io::MatrixData& matrix, const std::vector<io::ObsColumn>& obs, const Visit& visit) {
  if (matrix.csr) visit(*matrix.csr);
  if (matrix.dense) visit(*matrix.dense);
  for (const io::ObsColumn& column : obs) {
    visit(*column.values);
    if (column.mask) visit(*column.mask);
  }
}

class AnnDataRead : public PlannedRead {
 public:
  AnnDataRead(const io::MatrixData& matrix, const std::vector<io::ObsColumn>& obs, bool dense,
              const RowRequest& request, core::ThreadPool& pool)
      : matrix_(matrix), obs_(obs) {
    // Segments (a sort of the rows) only for dense arrays: CSR plans its own reads.
    if (!matrix_.csr || !obs_.empty()) segments_ = request_segments(request);
    const int64_t rows = request.num_out_rows();
    if (matrix_.csr) {
      csr_ = CsrRead::plan_rows(*matrix_.csr, request, dense, "X", outputs_, pool);
    } else {
      outputs_.push_back(OutputSpec{"X", OutputSpec::Part::kDense, dense_spec(*matrix_.dense, rows)});
    }
    for (const io::ObsColumn& column : obs_) {
      outputs_.push_back(OutputSpec{column.name, OutputSpec::Part::kDense, dense_spec(*column.values, rows)});
      if (column.mask) {
        outputs_.push_back(
            OutputSpec{mask_field(column.name), OutputSpec::Part::kDense, dense_spec(*column.mask, rows)});
      }
    }
  }

  Batch fill(const std::vector<at::Tensor>& tensors, ReadContext& context) override {
    Batch batch;
    size_t next = 0;
    if (matrix_.csr) {
      at::Tensor x = csr_.fill(tensors, 0, context);
      if (x.defined()) batch.insert("X", x);  // else claimed: written by a collection
      next = csr_.num_outputs();
    } else {
      at::Tensor out = tensors[next++];
      read_dense(*matrix_.dense, segments_, out, context);
      batch.insert("X", out);
    }
    for (const io::ObsColumn& column : obs_) {
      at::Tensor values = tensors[next++];
      read_dense(*column.values, segments_, values, context);
      batch.insert(column.name, values);
      if (column.mask) {
        at::Tensor mask = tensors[next++];
        read_dense(*column.mask, segments_, mask, context);
        batch.insert(mask_field(column.name), mask);
      }
    }
    return batch;
  }

  CsrRead* shared_csr(const std::string& field) override {
    return matrix_.csr && !csr_.dense && field == "X" ? &csr_ : nullptr;
  }

  void open_files(std::vector<const io::File*>& files) const override {
    visit_read_arrays(matrix_, obs_, [&](const auto& read) { read.open_files(files); });
  }

 private:
  const io::MatrixData& matrix_;
  const std::vector<io::ObsColumn>& obs_;
  std::vector<io::Segment> segments_;
  CsrRead csr_;
};

}  // namespace

std::unique_ptr<PlannedRead> AnnDataSource::plan(const RowRequest& request, ReadContext& context) const {
  return std::make_unique<AnnDataRead>(matrix_, obs_, dense_, request, context.pool);
}

void AnnDataSource::opened_stamps(io::FileStamps& stamps) const {
  visit_read_arrays(matrix_, obs_, [&](const auto& read) { read.opened_stamps(stamps); });
}

std::optional<std::vector<ObsColumnKind>> AnnDataSource::obs_column_kinds() const {
  std::vector<ObsColumnKind> kinds;
  for (const io::ObsColumn& column : obs_) {
    kinds.push_back(ObsColumnKind{column.name, column.encoding, column.categorical ? &column.categories : nullptr,
                                  store_->root().file(), ""});
  }
  return kinds;
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
