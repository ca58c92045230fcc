// Dense on-disk arrays as a source: HDF5Source (datasets of one HDF5 file)
// and ZarrSource (a zarr array). Every field is an io::Array with the same
// number of rows.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/array.h"
#include "loader/sources/source.h"

namespace torch_shards::sources {

class ArraySource : public Source {
 public:
  using NamedArray = std::pair<std::string, std::shared_ptr<const io::Array>>;
  // kind names the source in messages ("HDF5Source"); checks that the arrays
  // agree on their number of rows.
  ArraySource(std::string kind, std::vector<NamedArray> arrays);

  int64_t num_rows() const override { return num_rows_; }
  std::vector<FieldSpec> fields() const override;
  std::unique_ptr<PlannedRead> plan(const RowRequest& request, ReadContext& context) const override;
  std::string describe() const override;
  void opened_stamps(io::FileStamps& stamps) const override {
    for (const auto& named : arrays_) named.second->opened_stamps(stamps);
  }

  const std::vector<NamedArray>& arrays() const { return arrays_; }

 private:
  std::string kind_;
  std::vector<NamedArray> arrays_;
  int64_t num_rows_ = 0;
};

// File size in bytes, or the total size of the files of a directory tree.
int64_t storage_bytes(const std::string& path);

}  // namespace torch_shards::sources
