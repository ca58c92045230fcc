// Many sources as one row space (e.g. the 14 plates of a 100M-cell dataset):
// global row = offset of its source + local row. Every part must have the
// same fields (names, dtypes, row shapes, sparse or dense). Dense fields are
// read by every part straight into their rows of the output; CSR fields are
// staged per part (in recycled memory) and merged.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "loader/sources/source.h"

namespace torch_shards::sources {

class CollectionSource : public Source {
 public:
  explicit CollectionSource(std::vector<std::shared_ptr<const Source>> parts);

  int64_t num_rows() const override { return offsets_.back(); }
  std::vector<FieldSpec> fields() const override { return fields_; }
  std::unique_ptr<PlannedRead> plan(const RowRequest& request, ReadContext& context) const override;
  std::string describe() const override;
  void opened_stamps(io::FileStamps& stamps) const override {
    for (const auto& part : parts_) part->opened_stamps(stamps);
  }

  const std::vector<std::shared_ptr<const Source>>& parts() const { return parts_; }
  // What the codes of categorical or string obs column `column` mean: the
  // categories every AnnData source in the collection, at any depth, has for
  // it (the constructor checked they agree), so the first one's. InvalidArgument
  // if the collection holds no AnnData source, or they do not read the column,
  // or it is not categorical or string.
  nlohmann::json categories(const std::string& column) const;

 private:
  std::vector<std::shared_ptr<const Source>> parts_;
  std::vector<int64_t> offsets_;  // offsets_[p] = first global row of part p; back() = total
  std::vector<FieldSpec> fields_;
};

}  // namespace torch_shards::sources
