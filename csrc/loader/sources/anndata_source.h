// AnnData (.h5ad or zarr store) as a source: "X" (or a layer) dense or CSR,
// any other per-cell elements (layers, obsm, obsp, raw/X) as named fields,
// plus the requested obs columns: numeric as stored, categorical and string
// columns as int64 codes, nullable columns as values plus "<name>_mask".
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/anndata.h"
#include "loader/sources/source.h"

namespace torch_shards::sources {

class AnnDataSource : public Source {
 public:
  // A batch field read from an element of the AnnData (io::AnnDataStore::element).
  struct MatrixField {
    std::string name;     // of the field
    std::string element;  // "X", "layers/counts", "obsm/X_pca", ...
    io::MatrixData matrix;
  };
  using FieldElements = std::vector<std::pair<std::string, std::string>>;  // (field, element path), in order

  // layer: the "X" field reads layers/<layer>. fields: more fields, each an
  // element; the "X" field is left out when one of them is named "X" or reads
  // the element X (with layer: refused, as ambiguous). dense: densify CSR
  // matrices (natively) instead of returning sparse CSR.
  AnnDataSource(std::shared_ptr<const io::AnnDataStore> store, const std::optional<std::string>& layer,
                const std::vector<std::string>& obs, bool dense, const FieldElements& fields = {});

  int64_t num_rows() const override { return store_->n_obs(); }
  std::vector<FieldSpec> fields() const override;
  std::unique_ptr<PlannedRead> plan(const RowRequest& request, ReadContext& context) const override;
  std::string describe() const override;
  int64_t sparse_row_bytes() const override;
  void opened_stamps(io::FileStamps& stamps) const override;
  std::optional<std::vector<ObsColumnKind>> obs_column_kinds() const override;

  const io::AnnDataStore& store() const { return *store_; }
  const std::vector<io::ObsColumn>& obs() const { return obs_; }

 private:
  std::shared_ptr<const io::AnnDataStore> store_;
  std::optional<std::string> layer_;
  std::vector<MatrixField> matrices_;  // the fields read from elements, in batch order
  bool x_field_ = true;                // matrices_ starts with the "X" field of X (or layers/<layer>)
  std::vector<io::ObsColumn> obs_;
  bool dense_;
};

}  // namespace torch_shards::sources
