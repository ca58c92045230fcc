#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "loader/sources/collection_source.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/sparse_csr_tensor.h>

#include <algorithm>
#include <cstring>

#include "core/errors.h"

namespace torch_shards::sources {

using core::check_argument;

namespace {

// The rows one part delivers: its local rows and where they go in the batch.
struct PartRows {
  std::vector<int64_t> local;
  std::vector<int64_t> positions;
};

at::Tensor merge_dense(const std::vector<std::pair<PartRows*, at::Tensor>>& parts, int64_t rows) {
  const at::Tensor& first = parts.front().second;
  std::vector<int64_t> shape(first.sizes().begin(), first.sizes().end());
  shape[0] = rows;
  at::Tensor out = at::empty(shape, first.options());
  for (const auto& [part, values] : parts) {
    const at::Tensor index =
        at::from_blob(part->positions.data(), {static_cast<int64_t>(part->positions.size())}, at::kLong);
    out.index_copy_(0, index, values);
  }
  return out;
}

at::Tensor merge_csr(const std::vector<std::pair<PartRows*, at::Tensor>>& parts, int64_t rows, int64_t columns) {
  // Index dtypes may differ between parts (int32 where they fit): merge as the widest.
  bool wide = false;
  for (const auto& [part, matrix] : parts) wide |= matrix.crow_indices().scalar_type() == at::kLong;
  const at::ScalarType index_type = wide ? at::kLong : at::kInt;
  std::vector<at::Tensor> offsets;
  std::vector<int64_t> row_offsets(static_cast<size_t>(rows) + 1, 0);
  for (const auto& [part, matrix] : parts) {
    offsets.push_back(matrix.crow_indices().to(at::kLong).contiguous());
    const int64_t* crow = offsets.back().data_ptr<int64_t>();
    for (size_t i = 0; i < part->positions.size(); ++i) row_offsets[part->positions[i] + 1] = crow[i + 1] - crow[i];
  }
  for (int64_t i = 0; i < rows; ++i) row_offsets[i + 1] += row_offsets[i];
  const int64_t total = row_offsets.back();
  const at::Tensor& first = parts.front().second;
  at::Tensor out_columns = at::empty({total}, at::TensorOptions().dtype(index_type));
  at::Tensor out_values = at::empty({total}, first.values().options());
  const size_t value_size = out_values.element_size();
  auto* values_out = static_cast<uint8_t*>(out_values.data_ptr());
  for (size_t p = 0; p < parts.size(); ++p) {
    const auto& [part, matrix] = parts[p];
    const int64_t* crow = offsets[p].data_ptr<int64_t>();
    const at::Tensor columns = matrix.col_indices().to(index_type).contiguous();
    const at::Tensor values = matrix.values().contiguous();
    const auto* values_in = static_cast<const uint8_t*>(values.data_ptr());
    for (size_t i = 0; i < part->positions.size(); ++i) {
      const int64_t source = crow[i], length = crow[i + 1] - crow[i], dest = row_offsets[part->positions[i]];
      std::memcpy(static_cast<uint8_t*>(out_columns.data_ptr()) + dest * columns.element_size(),
                  static_cast<const uint8_t*>(columns.data_ptr()) + source * columns.element_size(),
                  length * columns.element_size());
      std::memcpy(values_out + dest * value_size, values_in + source * value_size, length * value_size);
    }
  }
  at::Tensor out_rows = at::empty({rows + 1}, at::TensorOptions().dtype(at::kLong));
  std::memcpy(out_rows.data_ptr<int64_t>(), row_offsets.data(), row_offsets.size() * sizeof(int64_t));
  return at::sparse_csr_tensor(out_rows.to(index_type), out_columns, out_values, {rows, columns},
                               out_values.options().layout(at::kSparseCsr));
}

// The fix when the parts differ only in the layout of a field (a dense and a CSR matrix).
std::string layout_hint(const std::vector<FieldSpec>& first, const std::vector<FieldSpec>& other) {
  if (first.size() != other.size()) return "";
  std::string names;
  for (size_t f = 0; f < first.size(); ++f) {
    FieldSpec relaid = other[f];
    relaid.sparse_csr = first[f].sparse_csr;
    if (!(relaid == first[f])) return "";
    if (other[f].sparse_csr != first[f].sparse_csr) names += (names.empty() ? "'" : ", '") + first[f].name + "'";
  }
  return core::concat(": ", names,
                      " is sparse CSR in one and dense in the other; open the AnnData sources with dense=True "
                      "(AnnDataSource(path, dense=True) or torch_shards.open(paths, dense=True)) to read every part "
                      "densely");
}

}  // namespace

CollectionSource::CollectionSource(std::vector<std::shared_ptr<const Source>> parts) : parts_(std::move(parts)) {
  check_argument(!parts_.empty(), "Collection: needs at least one source");
  fields_ = parts_.front()->fields();
  offsets_.push_back(0);
  for (size_t p = 0; p < parts_.size(); ++p) {
    const auto fields = parts_[p]->fields();
    if (fields != fields_) {
      std::string expected, got;
      for (const auto& field : fields_) expected += (expected.empty() ? "" : ", ") + field.describe();
      for (const auto& field : fields) got += (got.empty() ? "" : ", ") + field.describe();
      throw core::InvalidArgument(core::concat("Collection: source ", p, " (", parts_[p]->describe(), ") has fields {",
                                               got, "} but source 0 has {", expected, "}",
                                               layout_hint(fields_, fields)));
    }
    offsets_.push_back(offsets_.back() + parts_[p]->num_rows());
  }
}

Batch CollectionSource::read(const std::vector<int64_t>& rows, ReadContext& context) const {
  std::vector<PartRows> split(parts_.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const size_t part =
        static_cast<size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), rows[i]) - offsets_.begin()) - 1;
    split[part].local.push_back(rows[i] - offsets_[part]);
    split[part].positions.push_back(static_cast<int64_t>(i));
  }
  std::vector<std::pair<PartRows*, Batch>> batches;
  for (size_t p = 0; p < parts_.size(); ++p) {
    if (!split[p].local.empty()) batches.emplace_back(&split[p], parts_[p]->read(split[p].local, context));
  }
  if (batches.size() == 1) return batches.front().second;  // all rows from one part, already in order
  const int64_t count = static_cast<int64_t>(rows.size());
  Batch out;
  for (const FieldSpec& field : fields_) {
    std::vector<std::pair<PartRows*, at::Tensor>> parts;
    for (const auto& [part, batch] : batches) parts.emplace_back(part, batch.at(field.name));
    out.insert(field.name,
               field.sparse_csr ? merge_csr(parts, count, field.row_shape.at(0)) : merge_dense(parts, count));
  }
  return out;
}

std::string CollectionSource::describe() const {
  std::string text = core::concat("Collection(", parts_.size(), " sources, ", num_rows(), " rows: ");
  for (size_t p = 0; p < parts_.size(); ++p) text += (p ? ", " : "") + parts_[p]->describe();
  return text + ")";
}

}  // namespace torch_shards::sources
