// Sources: row-addressable datasets read by the native readers. Every read
// returns a Batch, one tensor per field with the rows asked for, in order.
//
//   torch_shards::TensorSource(x)                                  field "X"
//   torch_shards::HDF5Source("data.h5", "/images")                 field "X"
//   torch_shards::HDF5Source("data.h5", {{"X", "/images"}, {"y", "/labels"}})
//   torch_shards::ZarrSource("data.zarr")
//   torch_shards::AnnDataSource("cells.h5ad", {.obs = {"cell_type"}, .dense = true})
//   torch_shards::AnnDataSource("cells.h5ad", {.obs = {"cell_type"}, .fields = {{"pca", "obsm/X_pca"}}})
//   torch_shards::Collection({plate1, plate2})
//   torch_shards::AnnbatchCollection("collection.zarr", {.obs = {"cell_type"}})
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch_shards/export.h>
#include <torch_shards/handle.h>

namespace torch_shards {

// The most native threads one process reads with (Source.read, a dataset's
// readers): more never helps, and creating thousands fails late and unclearly.
inline constexpr int64_t kMaxThreads = 256;

// One tensor per field, plus "index" (the global row of every sample) when
// delivered by a dataset.
using Batch = c10::Dict<std::string, at::Tensor>;

namespace sources {
class Source;
}  // namespace sources
namespace io {
class AnnDataStore;
}  // namespace io

class SourceImpl;

// An AnnData source's fields besides X, in batch order: (field name, element
// path inside the AnnData: "layers/<name>", "obsm/<name>", "obsp/<name>",
// "raw/X" or "X").
using AnnDataFields = std::vector<std::pair<std::string, std::string>>;

// What a source is made from and pickles to: its kind ("TensorSource",
// "RowsSource", "HDF5Source", "ZarrSource", "AnnDataSource", "Collection"), its parameters
// as a JSON object (paths, dataset names, options), its tensors
// (TensorSource) and its parts (Collection). File sources re-open their
// files when unpickled.
using SourceState = std::tuple<std::string, std::string, c10::Dict<std::string, at::Tensor>,
                               std::vector<c10::intrusive_ptr<SourceImpl>>>;

// torch.classes.torch_shards.Source.
class TORCH_SHARDS_API SourceImpl : public torch::CustomClassHolder {
 public:
  // Builds (or re-opens) the source the state describes.
  explicit SourceImpl(const SourceState& state);
  // A source already built (the state it pickles to, and the reader).
  SourceImpl(SourceState state, std::shared_ptr<const sources::Source> source);

  // Fields of in-memory tensors (one row per index of the first dimension), as torch_shards.TensorSource.
  static c10::intrusive_ptr<SourceImpl> tensor_source(const c10::Dict<std::string, at::Tensor>& fields);
  // num_rows rows without fields (batches carry only "index"); description names them.
  static c10::intrusive_ptr<SourceImpl> rows_source(int64_t num_rows, const std::string& description);
  // Field name -> dataset path inside the HDF5 file at `path`, as torch_shards.HDF5Source.
  static c10::intrusive_ptr<SourceImpl> hdf5_source(const std::string& path,
                                                    const c10::Dict<std::string, std::string>& datasets);
  // Field name -> array path inside the zarr store at `path` ("/": the store is the array), as
  // torch_shards.ZarrSource.
  static c10::intrusive_ptr<SourceImpl> zarr_source(const std::string& path,
                                                    const c10::Dict<std::string, std::string>& arrays);
  // X (or layers/<layer>), the `fields` and the `obs` columns of the AnnData at `path`, as
  // torch_shards.AnnDataSource.
  static c10::intrusive_ptr<SourceImpl> anndata_source(const std::string& path, const std::vector<std::string>& obs,
                                                       const std::optional<std::string>& layer, bool dense,
                                                       const AnnDataFields& fields = {});
  // The parts as one row space (Collection below).
  static c10::intrusive_ptr<SourceImpl> collection(const std::vector<c10::intrusive_ptr<SourceImpl>>& parts);

  // What the source is made from and pickles to.
  const SourceState& state() const { return state_; }
  // "TensorSource", "RowsSource", "HDF5Source", "ZarrSource", "AnnDataSource" or "Collection".
  const std::string& kind() const { return std::get<0>(state_); }
  // The number of rows.
  int64_t num_rows() const;
  // The fields every read returns, in order (without "index").
  std::vector<std::string> field_names() const;
  // One line per field: "X: Float[2000] (sparse CSR)".
  std::vector<std::string> field_specs() const;
  // Canonical description: type, files and their sizes, fields, shapes.
  std::string describe() const;
  // A Collection's: what the codes of its categorical or string obs column
  // mean, as a JSON array (Collection::categories_json). ValueError for
  // another kind of source.
  std::string categories_json(const std::string& column) const;
  // The files its reads rest on, each with its stamp's digest (as int64)
  // from when this process opened them; check_same_files(stamps) raises if
  // this object's differ: a process that opens the source again (a spawned
  // DataLoader worker) checks it reads the files the first one opened.
  c10::Dict<std::string, int64_t> opened_stamps() const;
  // Throws an error naming the file unless this object's files are those `stamps` (opened_stamps()) describe.
  void check_same_files(const c10::Dict<std::string, int64_t>& stamps) const;
  // The rows (1-D int64; any order, repeats allowed), read with num_threads threads.
  Batch read(const at::Tensor& rows, int64_t num_threads) const;

  // The reader behind it (internal: sources::Source is not part of the installed headers).
  const std::shared_ptr<const sources::Source>& get() const { return source_; }

 private:
  SourceState state_;
  std::shared_ptr<const sources::Source> source_;
};

// torch.classes.torch_shards.AnnData: an opened .h5ad file or AnnData zarr
// store, for lookups (names, categories) and for making sources.
class TORCH_SHARDS_API AnnDataImpl : public torch::CustomClassHolder {
 public:
  // Opens the .h5ad file or AnnData zarr store (or URL) at `path`.
  explicit AnnDataImpl(const std::string& path);

  // The path it was opened from.
  const std::string& path() const { return path_; }
  // The numbers of cells (rows) and variables, as stored.
  // @{
  int64_t n_obs() const;
  int64_t n_vars() const;
  // @}
  // The obs and var indexes (cell and variable names), and the names of the obs columns.
  // @{
  std::vector<std::string> obs_names() const;
  std::vector<std::string> var_names() const;
  std::vector<std::string> obs_columns() const;
  // @}
  // The categories of a categorical obs column, as a JSON array.
  std::string categories_json(const std::string& column) const;
  // A source of this AnnData (SourceImpl::anndata_source's arguments).
  c10::intrusive_ptr<SourceImpl> source(const std::vector<std::string>& obs, const std::optional<std::string>& layer,
                                        bool dense, const AnnDataFields& fields = {}) const;

 private:
  std::string path_;
  std::shared_ptr<const io::AnnDataStore> store_;
};

// What a path holds: "missing", "hdf5", "hdf5-anndata", "zarr-array",
// "zarr-group", "zarr-anndata" or "unknown".
TORCH_SHARDS_API std::string probe(const std::string& path);

// How URLs (s3://bucket/key, https://host/path, http://...) are read. Paths
// may be URLs wherever a source takes one; reads of URLs below `url` use
// these options in this process from now on (set them before the source is
// made; the longest registered URL wins). Unset fields come from the
// environment: the AWS variables and files (AWS_PROFILE, AWS_REGION,
// AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ~/.aws/credentials ...; a profile's
// role, SSO login or credential_process, a web identity, the container's and
// the EC2 instance's credentials, fetched as boto3 fetches them: docs/guide/
// sources.md), TORCH_SHARDS_CACHE_DIR, TORCH_SHARDS_CACHE_BYTES, TORCH_SHARDS_CACHE_WHOLE_BYTES,
// TORCH_SHARDS_MAX_REQUESTS.
struct StorageOptions {
  std::string endpoint_url;         // an S3-compatible server ("http://127.0.0.1:9000"); "": AWS
  std::string region;               // "": AWS_REGION, the profile's, or us-east-1
  std::string profile;              // "": AWS_PROFILE or "default"; named: used over AWS_ACCESS_KEY_ID
  std::optional<bool> anonymous{};  // true: unsigned requests (public buckets); unset: when no credentials
  int max_requests = 0;             // requests in flight per reading thread; 0: 64
  double timeout = 0;               // seconds per request attempt; 0: 60
  int retries = -1;                 // attempts after a transient failure; -1: 6
  std::string cache_dir;            // node-local cache shared by every process of the node; "": none
  int64_t cache_bytes = 0;          // its bound; 0: 64 GiB
  // Objects up to this size (and cache_bytes / 4) are cached whole, one mapped entry each; 0: none;
  // -1: TORCH_SHARDS_CACHE_WHOLE_BYTES or 1 GiB.
  int64_t cache_whole_bytes = -1;
  // A zarr store's consolidated metadata (its root zarr.json's consolidated_metadata, or .zmetadata, as
  // anndata writes them) read in place of every node's own metadata, as zarr-python does: opening it
  // behind a URL is one request, not one per node. false: each node's own files.
  bool consolidated = true;
};
// Registers `options` for the URLs below `url` in this process (see StorageOptions).
TORCH_SHARDS_API void set_storage_options(const std::string& url, const StorageOptions& options);
// The same from JSON ({"endpoint_url": ..., "cache_bytes": ...}), as the
// Python door passes them; ValueError naming an unknown key or a bad value.
TORCH_SHARDS_API void set_storage_options_json(const std::string& url, const std::string& options_json);

// The datasets of an annbatch DatasetCollection at `path`, in annbatch's
// order (by number): the dataset_<i> groups of a zarr group whose
// encoding-type is "annbatch-preshuffled", or the dataset_<i>.h5ad files of
// a directory (annbatch's is_collection_h5ad). nullopt if `path` is no such
// collection; ValueError for a marked group without datasets, the missing
// file error for a path that does not exist.
TORCH_SHARDS_API std::optional<std::vector<std::string>> annbatch_datasets(const std::string& path);

class TORCH_SHARDS_API Source : public Handle<SourceImpl> {
 public:
  using Handle::Handle;
  int64_t size() const { return impl_->num_rows(); }
  Batch read(const at::Tensor& rows, int64_t num_threads = 1) const { return impl_->read(rows, num_threads); }
};

class TORCH_SHARDS_API TensorSource : public Source {
 public:
  explicit TensorSource(const at::Tensor& x);  // field "X"
  explicit TensorSource(const c10::Dict<std::string, at::Tensor>& fields);
};

struct HDF5SourceOptions {
  std::string field = "X";
};

class TORCH_SHARDS_API HDF5Source : public Source {
 public:
  HDF5Source(const std::string& path, const std::string& dataset, const HDF5SourceOptions& options = {});
  HDF5Source(const std::string& path, const std::map<std::string, std::string>& datasets);
};

struct ZarrSourceOptions {
  std::string field = "X";
};

class TORCH_SHARDS_API ZarrSource : public Source {
 public:
  explicit ZarrSource(const std::string& path, const std::string& array = "/", const ZarrSourceOptions& options = {});
  ZarrSource(const std::string& path, const std::map<std::string, std::string>& arrays);
};

struct AnnDataSourceOptions {
  std::vector<std::string> obs{};      // obs columns to deliver with X
  std::optional<std::string> layer{};  // layers/<layer> instead of X
  bool dense = false;                  // densify every CSR matrix read
  // More per-cell elements, each a field: {{"counts", "layers/counts"}, {"pca", "obsm/X_pca"}}. X stays the
  // field "X" unless one of them is named "X" or reads the element "X" (X is then that field only; with
  // layer: ValueError, as ambiguous).
  AnnDataFields fields{};
};

class TORCH_SHARDS_API AnnDataSource : public Source {
 public:
  explicit AnnDataSource(const std::string& path, const AnnDataSourceOptions& options = {});
  const c10::intrusive_ptr<AnnDataImpl>& anndata() const { return anndata_; }
  int64_t n_obs() const { return anndata_->n_obs(); }
  int64_t n_vars() const { return anndata_->n_vars(); }

 private:
  AnnDataSource(c10::intrusive_ptr<AnnDataImpl> anndata, const AnnDataSourceOptions& options);
  c10::intrusive_ptr<AnnDataImpl> anndata_;
};

// Many sources as one row space: global row = offset of its source + local row.
// Collections nest. A categorical or string obs column whose sources have
// different categories reads as codes into their union (categories_json); a
// column categorical in one source and not in another is a ValueError naming
// both. A collection of one collection is spelled with a vector,
// Collection(std::vector<Source>{inner}): C++ reads Collection({inner}) as a
// copy of inner.
class TORCH_SHARDS_API Collection : public Source {
 public:
  // At least one part, all with the same fields; c10::ValueError otherwise.
  explicit Collection(const std::vector<Source>& parts);
  // What the codes of a categorical or string obs column read by its AnnData
  // sources mean, as a JSON array (code i is element i; -1: missing): the
  // union of their categories (the sources in order, a nested collection's
  // own union, each source's categories in its order, each at its first
  // appearance; sources without rows left out unless none has rows).
  // ValueError if none reads that column, or the collection holds no AnnData
  // source.
  std::string categories_json(const std::string& column) const { return impl_->categories_json(column); }
};

// An annbatch DatasetCollection (annbatch_datasets) as one Collection of its
// datasets in annbatch's order, each an AnnDataSource with `options`: what
// torch_shards.open(path, ...) gives in Python. ValueError if `path` is no
// such collection.
class TORCH_SHARDS_API AnnbatchCollection : public Collection {
 public:
  // The collection at `path`, each dataset read with `options`.
  explicit AnnbatchCollection(const std::string& path, const AnnDataSourceOptions& options = {});
};

}  // namespace torch_shards
