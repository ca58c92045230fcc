// AnnData (.h5ad or zarr store) as a source: "X" (or a layer) dense or CSR,
// plus the requested obs columns: numeric as stored, categorical and string
// columns as int64 codes, nullable columns as values plus "<name>_mask".
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/anndata.h"
#include "loader/sources/source.h"

namespace torch_shards::sources {

class AnnDataSource : public Source {
 public:
  // dense: densify a CSR matrix (natively) instead of returning sparse CSR.
  AnnDataSource(std::shared_ptr<const io::AnnDataStore> store, const std::optional<std::string>& layer,
                const std::vector<std::string>& obs, bool dense);

  int64_t num_rows() const override { return store_->n_obs(); }
  std::vector<FieldSpec> fields() const override;
  std::unique_ptr<PlannedRead> plan(const RowRequest& request, ReadContext& context) const override;
  std::string describe() const override;
  void opened_stamps(io::FileStamps& stamps) const override;
  std::optional<std::vector<ObsColumnKind>> obs_column_kinds() const override;

  const io::AnnDataStore& store() const { return *store_; }
  const std::vector<io::ObsColumn>& obs() const { return obs_; }

 private:
  std::shared_ptr<const io::AnnDataStore> store_;
  std::optional<std::string> layer_;
  io::MatrixData matrix_;
  std::vector<io::ObsColumn> obs_;
  bool dense_;
};

}  // namespace torch_shards::sources
