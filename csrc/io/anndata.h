// The AnnData on-disk layout (anndata >= 0.8; .h5ad and zarr stores alike):
// X or layers/<name> as a dense array or a CSR group, obs/var dataframes with
// numeric, boolean, nullable and categorical columns and a string index.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "csr_matrix.h"
#include "group.h"

namespace torch_shards::io {

struct MatrixData {
  std::shared_ptr<const Array> dense;    // a 2-D array, or
  std::shared_ptr<const CsrMatrix> csr;  // a CSR matrix
  int64_t rows = 0, cols = 0;
};

struct ObsColumn {
  std::string name;
  std::shared_ptr<const Array> values;  // the values, or the codes of a categorical column
  bool categorical = false;
  nlohmann::json categories = nlohmann::json::array();  // category values (strings or numbers)
  bool ordered = false;
};

class AnnDataStore {
 public:
  // Throws ReadError if the group does not look like AnnData.
  explicit AnnDataStore(std::shared_ptr<const Group> root);

  int64_t n_obs() const { return n_obs_; }
  int64_t n_vars() const { return n_vars_; }
  const Group& root() const { return *root_; }
  // X (no layer) or layers/<layer>.
  MatrixData matrix(const std::optional<std::string>& layer) const;
  std::vector<std::string> obs_columns() const;
  ObsColumn obs_column(const std::string& name) const;
  std::vector<std::string> obs_names() const;
  std::vector<std::string> var_names() const;

 private:
  MatrixData matrix_in(const Group& parent, const std::string& name) const;
  std::vector<std::string> index_of(const std::string& dataframe) const;

  std::shared_ptr<const Group> root_;
  int64_t n_obs_ = 0, n_vars_ = 0;
};

}  // namespace torch_shards::io
