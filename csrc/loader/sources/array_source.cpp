#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "loader/sources/array_source.h"

#include <algorithm>
#include <filesystem>

#include "core/errors.h"
#include "io/storage/url.h"
#include "loader/sources/array_tensors.h"

namespace torch_shards::sources {

using core::check_argument;

ArraySource::ArraySource(std::string kind, std::vector<NamedArray> arrays)
    : kind_(std::move(kind)), arrays_(std::move(arrays)) {
  check_argument(!arrays_.empty(), kind_, ": needs at least one dataset");
  num_rows_ = arrays_.front().second->num_rows();
  for (const auto& [name, array] : arrays_) {
    check_argument(name != "index", kind_, ": the field name 'index' is reserved for row indices");
    check_argument(!array->info().shape.empty(), kind_, ": ", array->where(), " has no dimensions");
    check_argument(array->num_rows() == num_rows_, kind_, ": all datasets must have the same number of rows, ",
                   array->where(), " has ", array->num_rows(), " but ", arrays_.front().second->where(), " has ",
                   num_rows_);
  }
}

std::vector<FieldSpec> ArraySource::fields() const {
  std::vector<FieldSpec> specs;
  for (const auto& [name, array] : arrays_) {
    const auto& shape = array->info().shape;
    specs.push_back(FieldSpec{name, to_scalar_type(array->info().dtype), {shape.begin() + 1, shape.end()}, false});
  }
  return specs;
}

namespace {

class ArrayRead : public PlannedRead {
 public:
  ArrayRead(const std::vector<ArraySource::NamedArray>& arrays, const RowRequest& request)
      : arrays_(arrays), segments_(request_segments(request)) {
    for (const auto& [name, array] : arrays_) {
      outputs_.push_back(OutputSpec{name, OutputSpec::Part::kDense, dense_spec(*array, request.num_out_rows())});
    }
  }

  Batch fill(const std::vector<at::Tensor>& tensors, ReadContext& context) override {
    Batch batch;
    for (size_t i = 0; i < arrays_.size(); ++i) {
      at::Tensor out = tensors[i];
      read_dense(*arrays_[i].second, segments_, out, context);
      batch.insert(arrays_[i].first, out);
    }
    return batch;
  }

  void open_files(std::vector<const io::File*>& files) const override {
    for (const auto& named : arrays_) named.second->open_files(files);
  }

  bool waits_on_requests() const override {
    return std::any_of(arrays_.begin(), arrays_.end(), [](const auto& named) { return named.second->remote(); });
  }

 private:
  const std::vector<ArraySource::NamedArray>& arrays_;
  std::vector<io::Segment> segments_;
};

}  // namespace

std::unique_ptr<PlannedRead> ArraySource::plan(const RowRequest& request, ReadContext&) const {
  return std::make_unique<ArrayRead>(arrays_, request);
}

std::string ArraySource::describe() const {
  std::string text = kind_ + "(";
  for (size_t i = 0; i < arrays_.size(); ++i) {
    const io::ArrayInfo& info = arrays_[i].second->info();
    text += core::concat(i ? ", " : "", arrays_[i].first, "=", info.file, ":", info.path, " [",
                         storage_bytes(info.file), " bytes] ", io::dtype_name(info.dtype), "[");
    for (size_t d = 0; d < info.shape.size(); ++d) text += (d ? ", " : "") + std::to_string(info.shape[d]);
    text += "]";
  }
  return text + ")";
}

int64_t storage_bytes(const std::string& path) {
  if (io::storage::is_url(path)) return -1;  // not listed for a description
  std::error_code error;
  if (!std::filesystem::is_directory(path, error)) {
    const auto size = std::filesystem::file_size(path, error);
    return error ? -1 : static_cast<int64_t>(size);
  }
  int64_t total = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(path, error)) {
    if (entry.is_regular_file(error)) total += static_cast<int64_t>(entry.file_size(error));
  }
  return total;
}

}  // namespace torch_shards::sources
