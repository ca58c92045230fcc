#include "anndata.h"

#include "../core/errors.h"

namespace torch_shards::io {

using core::concat;
using core::ReadError;
using nlohmann::json;

namespace {

std::string encoding_type(const json& attributes) {
  const auto found = attributes.find("encoding-type");
  return found != attributes.end() && found->is_string() ? found->get<std::string>() : std::string();
}

std::vector<int64_t> shape_attribute(const json& attributes, const char* key, const std::string& where) {
  const auto found = attributes.find(key);
  if (found == attributes.end() || !found->is_array() || found->size() != 2) {
    throw ReadError(concat(where, ": sparse matrix without a valid '", key, "' attribute"));
  }
  return {(*found)[0].get<int64_t>(), (*found)[1].get<int64_t>()};
}

}  // namespace

AnnDataStore::AnnDataStore(std::shared_ptr<const Group> root) : root_(std::move(root)) {
  if (!root_->has_group("obs") || (!root_->has_array("X") && !root_->has_group("X") && !root_->has_group("layers"))) {
    throw ReadError(concat(root_->where(), ": not an AnnData store (needs obs and X or layers)"));
  }
  if (!root_->has_group("var") && !root_->has_array("X") && !root_->has_group("X")) {
    throw ReadError(concat(root_->where(), ": not an AnnData store (no var)"));
  }
  if (root_->has_array("obs")) {
    throw ReadError(concat(root_->where(),
                           ": obs is a compound dataset (AnnData < 0.7 layout); re-save the file "
                           "with a recent anndata"));
  }
  n_obs_ = static_cast<int64_t>(index_of("obs").size());
  n_vars_ = root_->has_group("var") ? static_cast<int64_t>(index_of("var").size()) : matrix(std::nullopt).cols;
}

std::vector<std::string> AnnDataStore::index_of(const std::string& dataframe) const {
  auto frame = root_->group(dataframe);
  const json attributes = frame->attributes();
  const auto index = attributes.find("_index");
  const std::string name = index != attributes.end() && index->is_string() ? index->get<std::string>() : "_index";
  if (!frame->has_array(name)) throw ReadError(concat(frame->where(), ": dataframe index '", name, "' is missing"));
  return frame->read_strings(name);
}

std::vector<std::string> AnnDataStore::obs_names() const { return index_of("obs"); }
std::vector<std::string> AnnDataStore::var_names() const { return index_of("var"); }

MatrixData AnnDataStore::matrix_in(const Group& parent, const std::string& name) const {
  const std::string where = parent.file() + ":" + parent.child_path(name);
  MatrixData matrix;
  if (parent.has_array(name)) {
    matrix.dense = parent.array(name);
    const auto& shape = matrix.dense->info().shape;
    if (shape.size() != 2) throw ReadError(concat(where, ": expected a 2-D matrix, got ", shape.size(), " dimensions"));
    matrix.rows = shape[0];
    matrix.cols = shape[1];
  } else if (parent.has_group(name)) {
    auto group = parent.group(name);
    const json attributes = group->attributes();
    const std::string encoding = encoding_type(attributes);
    const auto legacy = attributes.find("h5sparse_format");
    const std::string legacy_format =
        legacy != attributes.end() && legacy->is_string() ? legacy->get<std::string>() : "";
    if (encoding == "csc_matrix" || legacy_format == "csc") {
      throw core::InvalidArgument(concat(where,
                                         ": is a CSC (column-compressed) matrix; rows are read from CSR: "
                                         "convert with adata.X = adata.X.tocsr() and save again"));
    }
    if (encoding != "csr_matrix" && legacy_format != "csr") {
      throw ReadError(
          concat(where, ": unsupported matrix encoding '", encoding, "' (expected a dense array or csr_matrix)"));
    }
    const auto shape = shape_attribute(attributes, encoding == "csr_matrix" ? "shape" : "h5sparse_shape", where);
    matrix.rows = shape[0];
    matrix.cols = shape[1];
    matrix.csr = std::make_shared<CsrMatrix>(group->array("indptr"), group->array("indices"), group->array("data"),
                                             shape[0], shape[1]);
  } else {
    throw ReadError(concat(where, ": no such matrix"));
  }
  if (n_obs_ != 0 && matrix.rows != n_obs_) {
    throw ReadError(concat(where, ": has ", matrix.rows, " rows but obs has ", n_obs_));
  }
  return matrix;
}

MatrixData AnnDataStore::matrix(const std::optional<std::string>& layer) const {
  if (!layer) {
    if (!root_->has_array("X") && !root_->has_group("X")) {
      throw core::InvalidArgument(concat(root_->where(), ": has no X; pass layer= to read one of the layers"));
    }
    return matrix_in(*root_, "X");
  }
  if (!root_->has_group("layers") ||
      !(root_->group("layers")->has_array(*layer) || root_->group("layers")->has_group(*layer))) {
    std::string available;
    if (root_->has_group("layers")) {
      for (const auto& name : root_->group("layers")->children()) available += (available.empty() ? "" : ", ") + name;
    }
    throw core::InvalidArgument(
        concat(root_->where(), ": no layer '", *layer, "' (layers: ", available.empty() ? "none" : available, ")"));
  }
  return matrix_in(*root_->group("layers"), *layer);
}

std::vector<std::string> AnnDataStore::obs_columns() const {
  const json attributes = root_->group("obs")->attributes();
  std::vector<std::string> columns;
  const auto order = attributes.find("column-order");
  if (order != attributes.end() && order->is_array()) {
    for (const auto& name : *order) {
      if (name.is_string()) columns.push_back(name.get<std::string>());
    }
  } else if (order != attributes.end() && order->is_string()) {
    columns.push_back(order->get<std::string>());  // a single column stored as a scalar
  }
  return columns;
}

ObsColumn AnnDataStore::obs_column(const std::string& name) const {
  auto obs = root_->group("obs");
  const std::string where = obs->file() + ":" + obs->child_path(name);
  ObsColumn column;
  column.name = name;
  if (obs->has_group(name)) {
    auto group = obs->group(name);
    const json attributes = group->attributes();
    const std::string encoding = encoding_type(attributes);
    if (encoding == "categorical") {
      column.categorical = true;
      column.values = group->array("codes");
      const auto ordered = attributes.find("ordered");
      column.ordered = ordered != attributes.end() && ordered->is_boolean() && ordered->get<bool>();
      try {
        for (auto& value : group->read_strings("categories")) column.categories.push_back(value);
      } catch (const ReadError&) {  // numeric categories
        core::ThreadPool inline_pool(0);
        auto categories = group->array("categories");
        const auto bytes = categories->read_range(0, categories->num_rows(), inline_pool);
        for (int64_t i = 0; i < categories->num_rows(); ++i) {
          double value = 0;
          switch (categories->info().dtype) {
            case DType::kFloat64:
              value = reinterpret_cast<const double*>(bytes.data())[i];
              break;
            case DType::kFloat32:
              value = reinterpret_cast<const float*>(bytes.data())[i];
              break;
            case DType::kInt64:
              value = static_cast<double>(reinterpret_cast<const int64_t*>(bytes.data())[i]);
              break;
            case DType::kInt32:
              value = reinterpret_cast<const int32_t*>(bytes.data())[i];
              break;
            default:
              throw ReadError(concat(where, "/categories: unsupported category dtype"));
          }
          column.categories.push_back(value);
        }
      }
    } else if (encoding == "nullable-integer" || encoding == "nullable-boolean" || encoding == "nullable-float") {
      column.values = group->array("values");
      auto mask = group->array("mask");
      core::ThreadPool inline_pool(0);
      const auto missing = mask->read_range(0, mask->num_rows(), inline_pool);
      for (size_t i = 0; i < missing.size(); ++i) {
        if (missing[i]) {
          throw core::InvalidArgument(concat(where, ": has missing values (row ", i,
                                             "); fill them (adata.obs[...].fillna) before reading it as a tensor"));
        }
      }
    } else {
      throw core::InvalidArgument(concat(where, ": unsupported column encoding '", encoding, "'"));
    }
  } else if (obs->has_array(name)) {
    const std::string encoding = encoding_type(obs->array_attributes(name));
    if (encoding == "string-array") {
      throw core::InvalidArgument(concat(where,
                                         ": is a string column; make it categorical "
                                         "(adata.obs[name] = adata.obs[name].astype('category')) to read codes"));
    }
    column.values = obs->array(name);
  } else {
    std::string available;
    for (const auto& column_name : obs_columns()) available += (available.empty() ? "" : ", ") + column_name;
    throw core::InvalidArgument(
        concat(where, ": no such obs column (columns: ", available.empty() ? "none" : available, ")"));
  }
  if (column.values->info().shape.size() != 1 || column.values->num_rows() != n_obs_) {
    throw ReadError(concat(where, ": expected ", n_obs_, " values (one per obs row)"));
  }
  return column;
}

}  // namespace torch_shards::io
