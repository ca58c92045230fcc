#include "loader/sources/labels.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/where.h>

#include <optional>
#include <vector>

#include "core/errors.h"
#include "core/thread_pool.h"
#include "loader/sources/anndata_source.h"
#include "loader/sources/array_source.h"
#include "loader/sources/array_tensors.h"
#include "loader/sources/collection_source.h"
#include "loader/sources/tensor_source.h"

namespace torch_shards::sources {
namespace {

using core::check_argument;

at::Tensor as_codes(const at::Tensor& values, const std::string& where) {
  check_argument(values.dim() == 1, where, " must be 1-D to be labels, got ", values.dim(), " dimensions");
  check_argument(!at::isFloatingType(values.scalar_type()) && !at::isComplexType(values.scalar_type()), where,
                 " holds ", c10::toString(values.scalar_type()),
                 " values: labels must be integer codes, booleans, categorical or string columns");
  return values.to(at::kLong).contiguous();
}

at::Tensor read_all(const io::Array& array) {
  core::ThreadPool pool(0);
  std::vector<uint8_t> bytes = array.read_range(0, array.num_rows(), pool);
  const at::Tensor view =
      at::from_blob(bytes.data(), {array.num_rows()}, at::TensorOptions().dtype(to_scalar_type(array.info().dtype)));
  return view.clone();
}

}  // namespace

Labels read_labels(const Source& source, const std::string& name) {
  if (const auto* anndata = dynamic_cast<const AnnDataSource*>(&source)) {
    const io::ObsColumn column = anndata->store().obs_column(name);  // any obs column, delivered or not
    const std::string where = anndata->store().root().where() + ": obs column '" + name + "'";
    at::Tensor codes = as_codes(read_all(*column.values), where);
    if (column.mask) codes = at::where(read_all(*column.mask).to(at::kBool), -1, codes);
    return Labels{codes, column.categorical ? column.categories : nlohmann::json()};
  }
  if (const auto* tensors = dynamic_cast<const TensorSource*>(&source)) {
    check_argument(tensors->tensors().contains(name), "TensorSource has no field '", name, "' to read labels from");
    return Labels{as_codes(tensors->tensors().at(name).detach().cpu(), "TensorSource field '" + name + "'"),
                  nlohmann::json()};
  }
  if (const auto* arrays = dynamic_cast<const ArraySource*>(&source)) {
    for (const auto& [field, array] : arrays->arrays()) {
      if (field == name) return Labels{as_codes(read_all(*array), array->where()), nlohmann::json()};
    }
    throw core::InvalidArgument(core::concat(source.describe(), " has no field '", name, "' to read labels from"));
  }
  if (const auto* collection = dynamic_cast<const CollectionSource*>(&source)) {
    // Codes mean something only against their categories: as the collection reads its obs columns, the
    // parts with rows (all of them when none has) unite theirs (CategoryUnion) and each part's codes are
    // mapped to the union's.
    const auto& parts = collection->parts();
    std::vector<Labels> labels;
    bool any_rows = false;
    for (const auto& part : parts) {
      labels.push_back(read_labels(*part, name));
      any_rows |= part->num_rows() > 0;
    }
    CategoryUnion united;
    std::optional<size_t> first;  // the first part whose codes count
    std::vector<at::Tensor> codes;
    for (size_t p = 0; p < parts.size(); ++p) {
      if (any_rows && parts[p]->num_rows() == 0) continue;  // no codes
      at::Tensor part_codes = labels[p].codes;
      if (!first) first = p;
      const bool categorical = !labels[p].categories.is_null(),
                 first_categorical = !labels[*first].categories.is_null();
      check_argument(categorical == first_categorical, "Collection: the labels '", name, "' are ",
                     first_categorical ? "codes into categories" : "not categorical", " in source ", *first, " (",
                     parts[*first]->describe(), ") and ", categorical ? "codes into categories" : "not categorical",
                     " in source ", p, " (", parts[p]->describe(), ")");
      if (!categorical) {
        codes.push_back(part_codes);
        continue;
      }
      const std::vector<int64_t> table = united.add(labels[p].categories);
      if (!table.empty()) {
        at::Tensor mapped = at::empty_like(part_codes);
        const int64_t* in = part_codes.const_data_ptr<int64_t>();
        int64_t* out = mapped.data_ptr<int64_t>();
        for (int64_t i = 0; i < part_codes.numel(); ++i) out[i] = united_code(in[i], table, name);
        part_codes = mapped;
      }
      codes.push_back(part_codes);
    }
    const bool categorical = first && !labels[*first].categories.is_null();
    return Labels{at::cat(codes), categorical ? united.categories() : nlohmann::json()};
  }
  throw core::InvalidArgument(core::concat(source.describe(), " cannot provide labels"));
}

}  // namespace torch_shards::sources
