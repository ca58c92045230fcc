// torch_shards::open: a path opened as the source that reads it, decided by
// what the path holds, as torch_shards.open does in Python (which asks
// plan_open for the same decision):
//
//   - a .h5ad file or an AnnData zarr store -> an AnnDataSource;
//   - another HDF5 file -> an HDF5Source (OpenOptions::dataset required);
//   - a zarr array -> a ZarrSource; another zarr group -> a ZarrSource
//     (OpenOptions::array required);
//   - an annbatch DatasetCollection -> a Collection of its datasets'
//     AnnDataSource, in annbatch's order (annbatch_datasets);
//   - several paths -> a Collection of each one opened.
//
//   torch_shards::Source cells = torch_shards::open("cells.h5ad", {.anndata = {.obs = {"cell_type"}}});
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <torch_shards/export.h>
#include <torch_shards/source.h>

namespace torch_shards {

struct OpenOptions {
  AnnDataSourceOptions anndata{};        // an AnnData file or store, and each dataset of an annbatch collection
  std::optional<std::string> dataset{};  // an HDF5 file that is not AnnData: the dataset read ("/path/in/file")
  std::optional<std::string> array{};    // a zarr store: the array read ("/path/in/store"; default: the root array)
  std::string field = "X";               // the field an HDF5 dataset or a zarr array is read as
  // For a URL: registered for it before it is read (set_storage_options); ValueError for a local path.
  std::optional<StorageOptions> storage{};
};

// What open() reads: `kind` "anndata", "hdf5" or "zarr" with `paths` the path
// itself, or "collection" with `paths` the datasets of an annbatch
// DatasetCollection (each an AnnData), in annbatch's order.
struct OpenPlan {
  std::string kind;                // "anndata", "hdf5", "zarr" or "collection"
  std::vector<std::string> paths;  // the path itself, or the collection's datasets
};

// The decision open() makes for `path`, given whether a dataset (HDF5) or an
// array (zarr) is named. Throws the missing file error (a c10::Error whose
// text is Python's FileNotFoundError's, "[Errno 2] No such file or
// directory: '<path>'") if `path` does not exist, and c10::ValueError naming
// the path for an HDF5 file that is not AnnData without a dataset, a zarr
// group that is not AnnData without an array, or a path that is neither an
// HDF5 file nor a zarr store.
TORCH_SHARDS_API OpenPlan plan_open(const std::string& path, bool has_dataset, bool has_array);

// The source reading `path` (see above), with `options`.
TORCH_SHARDS_API Source open(const std::string& path, const OpenOptions& options = {});
// A Collection of each path opened with `options`.
TORCH_SHARDS_API Source open(const std::vector<std::string>& paths, const OpenOptions& options = {});

}  // namespace torch_shards
