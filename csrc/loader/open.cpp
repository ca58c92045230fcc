// torch_shards::open and the decision behind it (plan_open), which the
// Python door's torch_shards.open asks for too (the open_plan op).
#include <torch_shards/open.h>

#include <c10/util/Exception.h>

#include "core/errors.h"
#include "io/storage/remote_paths.h"
#include "io/storage/url.h"
#include "loader/errors.h"

namespace torch_shards {

OpenPlan plan_open(const std::string& path, bool has_dataset, bool has_array) {
  const io::storage::OpeningScope opening;  // what it learns of objects, the sources it plans reuse
  const std::string kind = probe(path);
  if (kind == "missing") translate_errors([&] { throw core::FileNotFound(path); });
  if (kind == "hdf5-anndata" || kind == "zarr-anndata") return {"anndata", {path}};
  if (kind == "hdf5") {
    TORCH_CHECK_VALUE(has_dataset, "torch_shards.open: ", path,
                      " is an HDF5 file but not AnnData: pass dataset='/path/in/file'");
    return {"hdf5", {path}};
  }
  if (kind == "zarr-array") return {"zarr", {path}};
  if (kind == "zarr-group" || kind == "unknown") {
    if (std::optional<std::vector<std::string>> datasets = annbatch_datasets(path)) {
      return {"collection", std::move(*datasets)};
    }
  }
  if (kind == "zarr-group") {
    TORCH_CHECK_VALUE(has_array, "torch_shards.open: ", path,
                      " is a zarr group but not AnnData: pass array='/path/in/store'");
    return {"zarr", {path}};
  }
  TORCH_CHECK_VALUE(false, "torch_shards.open: ", path, " is neither an HDF5 file nor a zarr store");
}

Source open(const std::string& path, const OpenOptions& options) {
  const io::storage::OpeningScope opening;
  if (options.storage) {
    TORCH_CHECK_VALUE(io::storage::is_url(path), "torch_shards::open: storage options are for URLs, ", path,
                      " is a local path");
    set_storage_options(path, *options.storage);
  }
  const OpenPlan plan = plan_open(path, options.dataset.has_value(), options.array.has_value());
  if (plan.kind == "anndata") return AnnDataSource(path, options.anndata);
  if (plan.kind == "hdf5") return HDF5Source(path, *options.dataset, HDF5SourceOptions{options.field});
  if (plan.kind == "zarr") return ZarrSource(path, options.array.value_or("/"), ZarrSourceOptions{options.field});
  return AnnbatchCollection(path, options.anndata);  // plan.paths, opened together behind URLs
}

Source open(const std::vector<std::string>& paths, const OpenOptions& options) {
  const io::storage::OpeningScope opening;
  std::vector<Source> parts;
  for (const std::string& path : paths) parts.push_back(open(path, options));
  return Collection(parts);
}

}  // namespace torch_shards
