// Many sources as one row space (e.g. the 14 plates of a 100M-cell dataset):
// global row = offset of its source + local row. Every part must have the
// same fields (names, dtypes, row shapes, sparse or dense). Dense fields are
// read by every part straight into their rows of the output; CSR fields are
// staged per part (in recycled memory) and merged.
//
// A categorical (or string) obs column whose parts have different
// categories (anndata writes each file's categorical with only the values
// in it) is read as one categorical over the union of them: each part's
// codes are mapped in place, in the output, to the union's.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "loader/sources/source.h"

namespace torch_shards::sources {

// The categories of many parts' codes as one list: the parts in order, each
// part's categories in its own order, each placed at its first appearance
// (categories compare as JSON values: 2 and 2.0 are one). The first part's
// codes are the union's.
class CategoryUnion {
 public:
  // Adds a part's categories; returns the table from its codes to the
  // union's, or an empty table where they are the same codes.
  std::vector<int64_t> add(const nlohmann::json& categories);
  const nlohmann::json& categories() const { return categories_; }
  // The union, once every part is added (the lookup of categories freed).
  nlohmann::json release() && { return std::move(categories_); }

 private:
  nlohmann::json categories_ = nlohmann::json::array();
  std::unordered_map<std::string, int64_t> codes_;  // category_key -> code in the union
};

// A part's code through its table to the union's (-1, a missing value,
// stays). A code past the table (never read: codes are checked against their
// categories as they are read) throws ReadError naming the column.
[[noreturn]] void throw_code_past_table(int64_t code, size_t categories, const std::string& column);
inline int64_t united_code(int64_t code, const std::vector<int64_t>& table, const std::string& column) {
  if (code < 0) return code;
  if (static_cast<uint64_t>(code) >= table.size()) throw_code_past_table(code, table.size(), column);
  return table[static_cast<size_t>(code)];
}

class CollectionSource : public Source {
 public:
  explicit CollectionSource(std::vector<std::shared_ptr<const Source>> parts);

  int64_t num_rows() const override { return offsets_.back(); }
  std::vector<FieldSpec> fields() const override { return fields_; }
  std::unique_ptr<PlannedRead> plan(const RowRequest& request, ReadContext& context) const override;
  std::string describe() const override;
  int64_t sparse_row_bytes() const override;  // its parts', weighted by their rows
  void opened_stamps(io::FileStamps& stamps) const override {
    for (const auto& part : parts_) part->opened_stamps(stamps);
  }

  std::optional<std::vector<ObsColumnKind>> obs_column_kinds() const override;

  const std::vector<std::shared_ptr<const Source>>& parts() const { return parts_; }
  // What the codes of categorical or string obs column `column` mean: the
  // union of the categories its parts with rows have for it (CategoryUnion;
  // a nested collection's are its own union). InvalidArgument if the
  // collection holds no AnnData source, or they do not read the column, or
  // it is not categorical or string.
  nlohmann::json categories(const std::string& column) const;

  // An obs column of the parts, as their first with rows delivers it; a
  // categorical one with the union of their categories and, per part, the
  // table from its codes to the union's (empty: the same codes).
  struct UnitedColumn {
    ObsColumnKind kind;  // file and where: the first part's; categories: unset (`categories` holds them)
    bool categorical = false;
    nlohmann::json categories;                 // the union
    std::vector<std::vector<int64_t>> tables;  // one per part where categorical
  };
  const std::vector<UnitedColumn>& obs_columns() const { return obs_columns_; }

 private:
  void unite_obs_columns();

  std::vector<std::shared_ptr<const Source>> parts_;
  std::vector<int64_t> offsets_;  // offsets_[p] = first global row of part p; back() = total
  std::vector<FieldSpec> fields_;
  std::vector<UnitedColumn> obs_columns_;
  bool has_obs_ = false;  // a part has obs (its columns may be none)
};

}  // namespace torch_shards::sources
