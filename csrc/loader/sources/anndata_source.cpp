#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "loader/sources/anndata_source.h"

#include <algorithm>
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
                             const std::vector<std::string>& obs, bool dense, const FieldElements& fields)
    : store_(std::move(store)), layer_(layer), dense_(dense) {
  const std::string who = core::concat("AnnDataSource(", store_->root().file(), ")");
  FieldElements elements;  // (field, canonical element path)
  for (const auto& [name, path] : fields) {
    check_argument(!name.empty(), who, ": the field reading '", path, "' has an empty name");
    elements.emplace_back(name, store_->element_path(path));
  }
  // The X field, unless a field takes its name or its element (X is then delivered under that name only).
  const auto takes_x = std::find_if(elements.begin(), elements.end(),
                                    [](const auto& field) { return field.first == "X" || field.second == "X"; });
  x_field_ = takes_x == elements.end();
  check_argument(x_field_ || !layer_, who, ": layer='", layer_.value_or(""), "' and fields {'", takes_x->first, "': '",
                 takes_x->second,
                 "'} are ambiguous: layer= says what the \"X\" field reads, and fields= already names a field \"X\" "
                 "or reads the element X; drop layer= and list every field in fields= (e.g. {'X': 'layers/",
                 layer_.value_or(""), "'})");
  std::set<std::string> names{"index"};
  if (x_field_) {
    matrices_.push_back(MatrixField{"X", layer_ ? "layers/" + *layer_ : "X", store_->matrix(layer_)});
    names.insert("X");
  }
  for (const auto& [name, element] : elements) {
    check_argument(name != "index", who, ": field 'index' (element '", element,
                   "') clashes with the batch's \"index\" (each row's global row number)");
    check_argument(names.insert(name).second, who, ": field '", name, "' is given twice");
    matrices_.push_back(MatrixField{name, element, store_->element(element)});
  }
  std::string field_list;
  for (const MatrixField& field : matrices_) field_list += field.name + ", ";
  field_list += "index";
  std::set<std::string> columns;
  for (const std::string& name : obs) {
    check_argument(names.count(name) == 0, who, ": obs column '", name, "' clashes with a field name (", field_list,
                   ")");
    check_argument(columns.insert(name).second, who, ": obs column '", name, "' is asked for twice");
    obs_.push_back(store_->obs_column(name));
  }
  names.insert(columns.begin(), columns.end());
  for (const io::ObsColumn& column : obs_) {
    const std::string mask = mask_field(column.name);
    check_argument(!column.mask || names.insert(mask).second, who, ": the mask field '", mask,
                   "' of nullable obs column '", column.name, "' clashes with another field of the same name");
  }
}

std::vector<FieldSpec> AnnDataSource::fields() const {
  std::vector<FieldSpec> specs;
  for (const MatrixField& field : matrices_) {
    const io::MatrixData& matrix = field.matrix;
    if (matrix.csr) {
      specs.push_back(FieldSpec{field.name, to_scalar_type(matrix.csr->value_dtype()), {matrix.cols}, !dense_});
    } else {
      specs.push_back(FieldSpec{field.name, to_scalar_type(matrix.dense->info().dtype), matrix.row_shape(), false});
    }
  }
  for (const io::ObsColumn& column : obs_) {
    specs.push_back(FieldSpec{column.name, to_scalar_type(column.values->info().dtype), {}, false});
    if (column.mask) specs.push_back(FieldSpec{mask_field(column.name), at::kBool, {}, false});
  }
  return specs;
}

int64_t AnnDataSource::sparse_row_bytes() const {
  int64_t bytes = 0;
  if (dense_) return bytes;  // its CSR matrices are delivered as dense rows
  for (const MatrixField& field : matrices_) {
    if (field.matrix.csr) bytes += csr_row_bytes(*field.matrix.csr);
  }
  return bytes;
}

namespace {

using MatrixField = AnnDataSource::MatrixField;

// Runs visit on what an AnnData source reads: its matrices (each a CsrMatrix
// or an Array) and each obs column's arrays (both kinds have open_files and
// opened_stamps).
template <typename Visit>
void visit_read_arrays(const std::vector<MatrixField>& matrices, const std::vector<io::ObsColumn>& obs,
                       const Visit& visit) {
  for (const MatrixField& field : matrices) {
    if (field.matrix.csr) visit(*field.matrix.csr);
    if (field.matrix.dense) visit(*field.matrix.dense);
  }
  for (const io::ObsColumn& column : obs) {
    visit(*column.values);
    if (column.mask) visit(*column.mask);
  }
}

class AnnDataRead : public PlannedRead {
 public:
  AnnDataRead(const std::vector<MatrixField>& matrices, const std::vector<io::ObsColumn>& obs, bool dense,
              const RowRequest& request, core::ThreadPool& pool)
      : matrices_(matrices), obs_(obs), csr_(matrices.size()) {
    // Segments (a sort of the rows) only for dense arrays: CSR plans its own reads.
    const bool all_csr =
        std::all_of(matrices_.begin(), matrices_.end(), [](const MatrixField& field) { return field.matrix.csr; });
    if (!all_csr || !obs_.empty()) segments_ = request_segments(request);
    const int64_t rows = request.num_out_rows();
    for (size_t m = 0; m < matrices_.size(); ++m) {
      const MatrixField& field = matrices_[m];
      if (field.matrix.csr) {
        csr_[m] = CsrRead::plan_rows(*field.matrix.csr, request, dense, field.name, outputs_, pool);
      } else {
        outputs_.push_back(OutputSpec{field.name, OutputSpec::Part::kDense, dense_spec(*field.matrix.dense, rows)});
      }
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
    for (size_t m = 0; m < matrices_.size(); ++m) {
      const MatrixField& field = matrices_[m];
      if (field.matrix.csr) {
        at::Tensor matrix = csr_[m].fill(tensors, next, context);
        if (matrix.defined()) batch.insert(field.name, matrix);  // else claimed: written by a collection
        next += csr_[m].num_outputs();
      } else {
        at::Tensor out = tensors[next++];
        read_dense(*field.matrix.dense, segments_, out, context);
        batch.insert(field.name, out);
      }
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
    for (size_t m = 0; m < matrices_.size(); ++m) {
      if (matrices_[m].name == field) return matrices_[m].matrix.csr && !csr_[m].dense ? &csr_[m] : nullptr;
    }
    return nullptr;
  }

  void open_files(std::vector<const io::File*>& files) const override {
    visit_read_arrays(matrices_, obs_, [&](const auto& read) { read.open_files(files); });
  }

  bool waits_on_requests() const override {
    bool waits = false;
    visit_read_arrays(matrices_, obs_, [&](const auto& read) { waits = waits || read.remote(); });
    return waits;
  }

 private:
  const std::vector<MatrixField>& matrices_;
  const std::vector<io::ObsColumn>& obs_;
  std::vector<io::Segment> segments_;
  std::vector<CsrRead> csr_;  // per matrix; planned for the CSR ones
};

// "120x50" (rows, then the shape of a row), as describe() shows a field's element.
std::string shape_text(int64_t rows, const std::vector<int64_t>& row_shape) {
  std::string text = std::to_string(rows);
  for (int64_t extent : row_shape) text += "x" + std::to_string(extent);
  return text;
}

}  // namespace

std::unique_ptr<PlannedRead> AnnDataSource::plan(const RowRequest& request, ReadContext& context) const {
  return std::make_unique<AnnDataRead>(matrices_, obs_, dense_, request, context.pool);
}

void AnnDataSource::opened_stamps(io::FileStamps& stamps) const {
  visit_read_arrays(matrices_, obs_, [&](const auto& read) { read.opened_stamps(stamps); });
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
  // Without fields= exactly as before fields existed: a checkpoint's source_hash is a hash of it.
  const io::Group& root = store_->root();
  const auto layout = [&](const io::MatrixData& matrix) {
    return matrix.csr ? (dense_ ? " csr->dense" : " csr") : " dense";
  };
  std::string text = core::concat("AnnDataSource(", root.file(), " [", storage_bytes(root.file()), " bytes], ");
  if (x_field_) {
    text += core::concat("X=", matrices_.front().element, " ", store_->n_obs(), "x", store_->n_vars(),
                         layout(matrices_.front().matrix));
  } else {
    text += core::concat(store_->n_obs(), "x", store_->n_vars());
  }
  if (matrices_.size() > (x_field_ ? 1 : 0)) {
    text += ", fields=[";
    for (size_t m = x_field_ ? 1 : 0; m < matrices_.size(); ++m) {
      const MatrixField& field = matrices_[m];
      text += core::concat(m > (x_field_ ? 1 : 0) ? ", " : "", field.name, "=", field.element, " ",
                           shape_text(field.matrix.rows, field.matrix.row_shape()), layout(field.matrix));
    }
    text += "]";
  }
  text += ", obs=[";
  for (size_t i = 0; i < obs_.size(); ++i) text += (i ? ", " : "") + obs_[i].name;
  return text + "])";
}

}  // namespace torch_shards::sources
