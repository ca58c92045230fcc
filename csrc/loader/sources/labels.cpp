#include "loader/sources/labels.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/where.h>

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
    std::vector<at::Tensor> parts;
    nlohmann::json categories;
    for (size_t p = 0; p < collection->parts().size(); ++p) {
      Labels labels = read_labels(*collection->parts()[p], name);
      // Codes mean something only against their categories: every part must have the same ones.
      check_argument(p == 0 || labels.categories == categories, "Collection: the labels '", name, "' of source ", p,
                     " (", collection->parts()[p]->describe(),
                     ") have other categories than source 0's: ", labels.categories.dump(), " against ",
                     categories.dump());
      categories = labels.categories;
      parts.push_back(labels.codes);
    }
    return Labels{at::cat(parts), categories};
  }
  throw core::InvalidArgument(core::concat(source.describe(), " cannot provide labels"));
}

}  // namespace torch_shards::sources
