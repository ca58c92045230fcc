// The AnnData on-disk layout, as every anndata release from 0.7 to 0.13
// writes it (.h5ad files and zarr v2/v3 stores alike): X, layers/<name>,
// obsm/<name>, obsp/<name> and raw/X as dense arrays or CSR groups, obs/var
// dataframes whose index and columns use anndata's element encodings (see
// ObsColumn).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/csr_matrix.h"
#include "io/group.h"

namespace torch_shards::io {

struct MatrixData {
  std::shared_ptr<const Array> dense;    // an array whose first dimension is the rows (X: 2-D), or
  std::shared_ptr<const CsrMatrix> csr;  // a CSR matrix
  int64_t rows = 0, cols = 0;            // cols: a CSR matrix's, or a dense array's second dimension (1-D: 0)
  // The shape of one row: {cols} for a CSR matrix, the dense array's shape past its first dimension.
  std::vector<int64_t> row_shape() const;
};

// One obs column, ready to be read by rows. How each encoding is read:
//   array (numeric, bool)          values as stored
//   categorical                    int64 codes into `categories` (-1: missing), checked against their
//                                  number when read; categories may be strings, numbers, booleans or a
//                                  nullable array (a code pointing at a missing category reads as -1)
//   string-array,                  int64 codes into `categories`, the column's sorted unique strings
//   nullable-string-array          (-1: missing)
//   nullable-integer,              values with missing entries read as 0 / false, and `mask`
//   nullable-boolean               (true where missing, anndata's convention)
//   anndata 0.7 categoricals       (codes with a "categories" attribute) as categorical
// Anything else (awkward-array, nested dataframes, ...) is refused, naming the
// element and its encoding.
struct ObsColumn {
  std::string name;
  std::string encoding;                 // the encoding-type read ("array", "categorical", ...)
  std::shared_ptr<const Array> values;  // per-row values (int64 codes for categorical and string columns)
  std::shared_ptr<const Array> mask;    // nullable-integer / nullable-boolean: bool, true where missing
  bool categorical = false;             // values are codes into categories
  nlohmann::json categories = nlohmann::json::array();  // strings, numbers, booleans; null for a missing one
  bool ordered = false;
};

// A CSR matrix's indptr as its readers use it: compressed chunks cached
// decoded (each read needs a few pointers from chunks that are reread often),
// any other layout as it is.
std::shared_ptr<const Array> cached_indptr(std::shared_ptr<const Array> indptr);

class AnnDataStore {
 public:
  // Throws ReadError if the group does not look like AnnData.
  explicit AnnDataStore(std::shared_ptr<const Group> root);

  int64_t n_obs() const { return n_obs_; }
  int64_t n_vars() const { return n_vars_; }
  const Group& root() const { return *root_; }
  // X (no layer) or layers/<layer>.
  MatrixData matrix(const std::optional<std::string>& layer) const;
  // An element whose rows are the cells, by its path (element_path()): a
  // dense array of any number of dimensions whose first is n_obs, or a CSR
  // matrix of n_obs rows (X and layers: n_vars columns; obsp: n_obs; raw/X:
  // raw/var's). InvalidArgument naming the file, the element and its
  // encoding for anything else: a missing element (with those its group
  // holds), a CSC matrix, a dataframe, an awkward array, an array of strings,
  // a first dimension that is not n_obs.
  MatrixData element(const std::string& path) const;
  // The canonical form of an element path: "X", "layers/<name>",
  // "obsm/<name>", "obsp/<name>" or "raw/X" (a leading "/" dropped).
  // InvalidArgument naming the file for any other path (var, varm, varp and
  // uns have no per-cell rows; obs columns are read by obs_column()).
  std::string element_path(const std::string& path) const;
  std::vector<std::string> obs_columns() const;
  ObsColumn obs_column(const std::string& name) const;
  // The dataframe indexes; a missing (masked) name reads as "".
  std::vector<std::string> obs_names() const;
  std::vector<std::string> var_names() const;

 private:
  // The dense array or CSR matrix parent/name, its encoding checked
  // (conversion: the Python statement that makes a CSC matrix there CSR,
  // for the message refusing one).
  MatrixData matrix_in(const Group& parent, const std::string& name, const std::string& conversion) const;
  // Checks a matrix of n_obs x n_vars (X, layers) is one.
  void check_obs_by_vars(const MatrixData& matrix, const std::string& where) const;
  // A dataframe's index: its name (checked present), length (from metadata) and values.
  std::string index_name(const Group& frame) const;
  int64_t index_length(const Group& frame) const;
  std::vector<std::string> index_of(const Group& frame) const;

  std::shared_ptr<const Group> root_;
  int64_t n_obs_ = 0, n_vars_ = 0;
};

}  // namespace torch_shards::io
