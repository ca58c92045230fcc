#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "loader/sources/tensor_source.h"

#include <ATen/ops/from_blob.h>
#include <ATen/ops/index_select.h>

#include <sstream>

#include "core/errors.h"

namespace torch_shards::sources {

using core::check_argument;

TensorSource::TensorSource(Batch fields) : fields_(std::move(fields)) {
  check_argument(!fields_.empty(), "TensorSource: needs at least one tensor");
  bool first = true;
  for (const auto& item : fields_) {
    const std::string& name = item.key();
    const at::Tensor& tensor = item.value();
    check_argument(name != "index", "TensorSource: the field name 'index' is reserved for row indices");
    check_argument(tensor.defined(), "TensorSource: field '", name, "' is an undefined tensor");
    check_argument(tensor.dim() >= 1, "TensorSource: field '", name,
                   "' must have at least one dimension (rows first), got a 0-d tensor");
    check_argument(tensor.layout() == at::kStrided, "TensorSource: field '", name,
                   "' must be a dense (strided) tensor, got layout ", tensor.layout());
    if (first) {
      num_rows_ = tensor.size(0);
      first = false;
    }
    check_argument(tensor.size(0) == num_rows_, "TensorSource: all fields must have the same number of rows, field '",
                   name, "' has ", tensor.size(0), " but the first field has ", num_rows_);
  }
  check_argument(num_rows_ >= 1, "TensorSource: the tensors have no rows (an empty source)");
}

std::vector<FieldSpec> TensorSource::fields() const {
  std::vector<FieldSpec> specs;
  for (const auto& item : fields_) {
    const auto sizes = item.value().sizes();
    specs.push_back(FieldSpec{item.key(), item.value().scalar_type(), {sizes.begin() + 1, sizes.end()}, false});
  }
  return specs;
}

Batch TensorSource::read(const std::vector<int64_t>& rows, ReadContext& context) const {
  const auto index = at::from_blob(const_cast<int64_t*>(rows.data()), {static_cast<int64_t>(rows.size())},
                                   at::TensorOptions().dtype(at::kLong));
  Batch out;
  for (const auto& item : fields_) {
    const at::Tensor& tensor = item.value();
    if (!tensor.device().is_cpu()) {  // gathered on its own device
      out.insert(item.key(), at::index_select(tensor, 0, index.to(tensor.device())));
      continue;
    }
    std::vector<int64_t> shape(tensor.sizes().begin(), tensor.sizes().end());
    shape[0] = static_cast<int64_t>(rows.size());
    at::Tensor gathered = context.tensors.empty(shape, tensor.scalar_type());
    at::index_select_out(gathered, tensor, 0, index);
    out.insert(item.key(), gathered);
  }
  return out;
}

std::string TensorSource::describe() const {
  std::ostringstream out;
  out << "TensorSource(rows=" << num_rows_;
  for (const auto& item : fields_) {
    out << ", " << item.key() << "=" << item.value().scalar_type() << item.value().sizes();
  }
  out << ")";
  return out.str();
}

}  // namespace torch_shards::sources
