#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <torch_shards/source.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <system_error>
#include <tuple>
#include <vector>

#include "core/errors.h"
#include "core/thread_pool.h"
#include "core/waiting_tasks.h"
#include "io/anndata.h"
#include "io/file.h"
#include "io/hdf5_array.h"
#include "io/hdf5_group.h"
#include "io/storage/remote_paths.h"
#include "io/storage/storage_options.h"
#include "io/storage/url.h"
#include "io/zarr/array.h"
#include "io/zarr/consolidated.h"
#include "io/zarr/group.h"
#include "loader/errors.h"
#include "loader/sources/anndata_source.h"
#include "loader/sources/array_source.h"
#include "loader/sources/collection_source.h"
#include "loader/sources/rows_source.h"
#include "loader/sources/tensor_source.h"

namespace torch_shards {
namespace {

using nlohmann::json;
using NoTensors = c10::Dict<std::string, at::Tensor>;

// A path as the sources store it: absolute, resolved against the working directory when the source is
// made, so that a source pickled (a saved TorchScript module) opens the same files wherever it is loaded.
// Lexically normalised, as Python's os.path.abspath does.
std::string absolute_path(const std::string& path) {
  if (path.empty() || std::filesystem::path(path).is_absolute() || io::storage::is_url(path)) return path;
  std::error_code error;
  const std::filesystem::path cwd = std::filesystem::current_path(error);
  TORCH_CHECK(!error, path, ": cannot make it absolute: the working directory is unknown (", error.message(), ")");
  return (cwd / path).lexically_normal().string();
}

std::shared_ptr<const io::Group> open_group(const std::string& path) {
  if (io::is_directory(path)) {
    if (!io::is_zarr_group(path)) throw core::ReadError(path + ": not a zarr group (no .zgroup or zarr.json)");
    return io::open_zarr_group(path, "/");
  }
  return io::open_hdf5_group(path, "/");
}

std::shared_ptr<const io::AnnDataStore> open_anndata(const std::string& path) {
  return std::make_shared<io::AnnDataStore>(open_group(path));
}

json field_map(const c10::Dict<std::string, std::string>& map) {
  // Kept in the caller's order (the order of the batch's fields).
  json out = json::array();
  for (const auto& item : map) out.push_back(json::array({item.key(), item.value()}));
  return out;
}

// A path or name with a NUL character: the C libraries would cut it there and
// open another file or dataset, so it is refused.
void check_no_nul(const json& value, const std::string& kind) {
  if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    const size_t nul = text.find('\0');
    if (nul != std::string::npos) {
      throw core::InvalidArgument(
          core::concat(kind, ": '", text.substr(0, nul), "\\0...' contains a NUL character (a path or name cannot)"));
    }
  }
  if (value.is_array() || value.is_object()) {
    for (const auto& item : value) check_no_nul(item, kind);
  }
}

// The one place a source is made (or re-opened) from its state.
std::shared_ptr<const sources::Source> make_source(const SourceState& state) {
  const auto& [kind, params_text, tensors, parts] = state;
  const json params = json::parse(params_text);
  check_no_nul(params, kind);
  if (kind == "TensorSource") return std::make_shared<sources::TensorSource>(tensors.copy());
  if (kind == "RowsSource") {
    return std::make_shared<sources::RowsSource>(params.at("num_rows").get<int64_t>(),
                                                 params.at("description").get<std::string>());
  }
  if (kind == "HDF5Source" || kind == "ZarrSource") {
    const std::string path = params.at("path").get<std::string>();
    if (kind == "ZarrSource") {
      if (!io::file_exists(path)) throw core::FileNotFound(path);
    }
    std::vector<sources::ArraySource::NamedArray> named;
    for (const auto& pair : params.at("arrays")) {
      const std::string field = pair.at(0).get<std::string>(), inner = pair.at(1).get<std::string>();
      named.emplace_back(field,
                         kind == "HDF5Source" ? io::open_hdf5_array(path, inner) : io::open_zarr_array(path, inner));
    }
    return std::make_shared<sources::ArraySource>(kind, std::move(named));
  }
  if (kind == "AnnDataSource") {
    std::optional<std::string> layer;
    if (!params.at("layer").is_null()) layer = params.at("layer").get<std::string>();
    AnnDataFields fields;  // absent from the states of sources without fields (and of releases before them)
    if (params.contains("fields")) fields = params.at("fields").get<AnnDataFields>();
    return std::make_shared<sources::AnnDataSource>(open_anndata(params.at("path").get<std::string>()), layer,
                                                    params.at("obs").get<std::vector<std::string>>(),
                                                    params.at("dense").get<bool>(), fields);
  }
  if (kind == "Collection") {
    std::vector<std::shared_ptr<const sources::Source>> inner;
    for (const auto& part : parts) inner.push_back(part->get());
    return std::make_shared<sources::CollectionSource>(std::move(inner));
  }
  throw core::InvalidArgument(
      core::concat("unknown source kind '", kind,
                   "' (expected TensorSource, RowsSource, HDF5Source, ZarrSource, AnnDataSource or Collection)"));
}

json anndata_params(const std::string& path, const std::vector<std::string>& obs,
                    const std::optional<std::string>& layer, bool dense, const AnnDataFields& fields) {
  json params{{"path", path}, {"obs", obs}, {"layer", layer ? json(*layer) : json(nullptr)}, {"dense", dense}};
  if (!fields.empty()) params["fields"] = fields;  // [[field, element], ...], in order
  return params;
}

}  // namespace

SourceImpl::SourceImpl(const SourceState& state) : state_(state) {
  const io::storage::OpeningScope opening;  // objects as they are now, not as an earlier opening saw them
  source_ = translate_errors([&] { return make_source(state_); });
}

SourceImpl::SourceImpl(SourceState state, std::shared_ptr<const sources::Source> source)
    : state_(std::move(state)), source_(std::move(source)) {}

c10::intrusive_ptr<SourceImpl> SourceImpl::tensor_source(const c10::Dict<std::string, at::Tensor>& fields) {
  return c10::make_intrusive<SourceImpl>(SourceState{"TensorSource", "{}", fields.copy(), {}});
}

c10::intrusive_ptr<SourceImpl> SourceImpl::rows_source(int64_t num_rows, const std::string& description) {
  const json params{{"num_rows", num_rows}, {"description", description}};
  return c10::make_intrusive<SourceImpl>(SourceState{"RowsSource", params.dump(), NoTensors(), {}});
}

c10::intrusive_ptr<SourceImpl> SourceImpl::hdf5_source(const std::string& path,
                                                       const c10::Dict<std::string, std::string>& datasets) {
  const json params{{"path", absolute_path(path)}, {"arrays", field_map(datasets)}};
  return c10::make_intrusive<SourceImpl>(SourceState{"HDF5Source", params.dump(), NoTensors(), {}});
}

c10::intrusive_ptr<SourceImpl> SourceImpl::zarr_source(const std::string& path,
                                                       const c10::Dict<std::string, std::string>& arrays) {
  const json params{{"path", absolute_path(path)}, {"arrays", field_map(arrays)}};
  return c10::make_intrusive<SourceImpl>(SourceState{"ZarrSource", params.dump(), NoTensors(), {}});
}

c10::intrusive_ptr<SourceImpl> SourceImpl::anndata_source(const std::string& path, const std::vector<std::string>& obs,
                                                          const std::optional<std::string>& layer, bool dense,
                                                          const AnnDataFields& fields) {
  const json params = anndata_params(absolute_path(path), obs, layer, dense, fields);
  return c10::make_intrusive<SourceImpl>(SourceState{"AnnDataSource", params.dump(), NoTensors(), {}});
}

c10::intrusive_ptr<SourceImpl> SourceImpl::collection(const std::vector<c10::intrusive_ptr<SourceImpl>>& parts) {
  for (const auto& part : parts) TORCH_CHECK_VALUE(part, "Collection: a part is null");
  return c10::make_intrusive<SourceImpl>(SourceState{"Collection", "{}", NoTensors(), parts});
}

int64_t SourceImpl::num_rows() const { return source_->num_rows(); }

std::vector<std::string> SourceImpl::field_names() const { return source_->field_names(); }

std::vector<std::string> SourceImpl::field_specs() const {
  std::vector<std::string> specs;
  for (const auto& field : source_->fields()) specs.push_back(field.describe());
  return specs;
}

std::string SourceImpl::describe() const { return source_->describe(); }

c10::Dict<std::string, int64_t> SourceImpl::opened_stamps() const {
  io::FileStamps stamps;
  source_->opened_stamps(stamps);
  c10::Dict<std::string, int64_t> out;
  for (const auto& [path, digest] : stamps) out.insert(path, static_cast<int64_t>(digest));
  return out;
}

void SourceImpl::check_same_files(const c10::Dict<std::string, int64_t>& stamps) const {
  io::FileStamps first;
  for (const auto& entry : stamps) first[entry.key()] = static_cast<uint64_t>(entry.value());
  translate_errors([&] { source_->check_same_files(first); });
}

std::string SourceImpl::categories_json(const std::string& column) const {
  return translate_errors([&] {
    const auto* collection = dynamic_cast<const sources::CollectionSource*>(source_.get());
    core::check_argument(collection != nullptr, "categories: ", source_->describe(),
                         " is not a Collection (an AnnDataSource's categories are its AnnData's)");
    return collection->categories(column).dump();
  });
}

Batch SourceImpl::read(const at::Tensor& rows, int64_t num_threads) const {
  return translate_errors([&] {
    TORCH_CHECK_TYPE(rows.scalar_type() == at::kLong, "Source.read: rows must be int64 row numbers, got ",
                     rows.scalar_type());
    TORCH_CHECK_VALUE(rows.dim() == 1, "Source.read: rows must be a 1-D int64 tensor", ", got ", rows.scalar_type(),
                      " of shape ", rows.sizes());
    TORCH_CHECK_VALUE(num_threads >= 1 && num_threads <= kMaxThreads, "Source.read: num_threads must be in [1, ",
                      kMaxThreads, "], got ", num_threads);
    const at::Tensor contiguous = rows.to(at::kCPU).contiguous();
    const int64_t* data = contiguous.data_ptr<int64_t>();
    std::vector<int64_t> list(data, data + contiguous.numel());
    for (int64_t row : list) {
      TORCH_CHECK_VALUE(row >= 0 && row < source_->num_rows(), "Source.read: row ", row, " out of range [0, ",
                        source_->num_rows(), ")");
    }
    core::ThreadPool pool(static_cast<int>(num_threads - 1));
    sources::TensorPool tensors;
    sources::ReadContext context{pool, tensors};
    return source_->read(list, context);
  });
}

AnnDataImpl::AnnDataImpl(const std::string& path) {
  const io::storage::OpeningScope opening;
  path_ = absolute_path(path);
  store_ = translate_errors([&] { return open_anndata(path_); });
}

int64_t AnnDataImpl::n_obs() const { return store_->n_obs(); }
int64_t AnnDataImpl::n_vars() const { return store_->n_vars(); }

std::vector<std::string> AnnDataImpl::obs_names() const {
  return translate_errors([&] { return store_->obs_names(); });
}

std::vector<std::string> AnnDataImpl::var_names() const {
  return translate_errors([&] { return store_->var_names(); });
}

std::vector<std::string> AnnDataImpl::obs_columns() const {
  return translate_errors([&] { return store_->obs_columns(); });
}

std::string AnnDataImpl::categories_json(const std::string& column) const {
  return translate_errors([&] {
    const io::ObsColumn found = store_->obs_column(column);
    core::check_argument(found.categorical, store_->root().where(), ": obs column '", column, "' is not categorical");
    return found.categories.dump();
  });
}

c10::intrusive_ptr<SourceImpl> AnnDataImpl::source(const std::vector<std::string>& obs,
                                                   const std::optional<std::string>& layer, bool dense,
                                                   const AnnDataFields& fields) const {
  return translate_errors([&] {
    const json params = anndata_params(path_, obs, layer, dense, fields);
    check_no_nul(params, "AnnDataSource");
    return c10::make_intrusive<SourceImpl>(SourceState{"AnnDataSource", params.dump(), NoTensors(), {}},
                                           std::make_shared<sources::AnnDataSource>(store_, layer, obs, dense, fields));
  });
}

void set_storage_options(const std::string& url, const StorageOptions& options) {
  translate_errors([&] {
    io::storage::parse_url(url);  // InvalidArgument naming it unless a URL
    io::storage::StorageOptions native;
    native.aws.endpoint_url = options.endpoint_url;
    native.aws.region = options.region;
    native.aws.profile = options.profile;
    native.aws.anonymous = options.anonymous;
    native.max_requests = options.max_requests;
    native.timeout_s = options.timeout;
    native.retries = options.retries;
    native.cache_dir = options.cache_dir;
    native.cache_bytes = options.cache_bytes;
    native.cache_whole_bytes = options.cache_whole_bytes;
    native.consolidated = options.consolidated;
    io::storage::set_storage_options(io::storage::parse_url(url).text, native);
  });
}

void set_storage_options_json(const std::string& url, const std::string& options_json) {
  StorageOptions options;
  translate_errors([&] {
    json given;
    try {
      given = json::parse(options_json);
    } catch (const json::exception& error) {
      throw core::InvalidArgument(core::concat("storage options: not JSON: ", error.what()));
    }
    core::check_argument(given.is_object(), "storage options must be a JSON object, got ", options_json);
    for (const auto& [key, value] : given.items()) {
      const auto expect = [&](bool ok, const char* kind) {
        core::check_argument(ok, "storage option ", key, " must be ", kind, ", got ", value.dump());
      };
      if (value.is_null()) continue;
      if (key == "endpoint_url" || key == "region" || key == "profile" || key == "cache_dir") {
        expect(value.is_string(), "a string");
        std::string& field = key == "endpoint_url" ? options.endpoint_url
                             : key == "region"     ? options.region
                             : key == "profile"    ? options.profile
                                                   : options.cache_dir;
        field = value.get<std::string>();
      } else if (key == "anonymous" || key == "consolidated") {
        expect(value.is_boolean(), "true or false");
        if (key == "anonymous") {
          options.anonymous = value.get<bool>();
        } else {
          options.consolidated = value.get<bool>();
        }
      } else if (key == "max_requests" || key == "retries") {
        expect(value.is_number_integer(), "an integer");
        (key == "max_requests" ? options.max_requests : options.retries) = value.get<int>();
        core::check_argument(key != "max_requests" || options.max_requests >= 1,
                             "storage option max_requests must be at least 1, got ", value.dump());
      } else if (key == "cache_bytes") {
        expect(value.is_number_integer() && value.get<int64_t>() > 0, "a positive integer");
        options.cache_bytes = value.get<int64_t>();
      } else if (key == "cache_whole_bytes") {
        expect(value.is_number_integer() && value.get<int64_t>() >= 0, "a non-negative integer");
        options.cache_whole_bytes = value.get<int64_t>();
      } else if (key == "timeout") {
        expect(value.is_number() && value.get<double>() > 0, "a positive number of seconds");
        options.timeout = value.get<double>();
      } else {
        throw core::InvalidArgument(core::concat(
            "unknown storage option ", key,
            " (known: endpoint_url, region, profile, anonymous, max_requests, timeout, retries, cache_dir, "
            "cache_bytes, cache_whole_bytes, consolidated)"));
      }
    }
  });
  set_storage_options(url, options);
}

std::string probe(const std::string& path) {
  const io::storage::OpeningScope opening;
  return translate_errors([&]() -> std::string {
    io::list_store(path);  // behind an s3:// URL: what the probe and the opening ask for, learnt at once
    if (!io::file_exists(path)) return "missing";
    const auto is_anndata = [](const io::Group& root) {
      const auto attributes = root.attributes();
      const auto encoding = attributes.find("encoding-type");
      if (encoding != attributes.end() && encoding->is_string()) return encoding->get<std::string>() == "anndata";
      return root.has_group("obs") && (root.has_array("X") || root.has_group("X"));
    };
    if (io::is_directory(path)) {
      io::zarr::learn_consolidated_metadata(path);  // a zarr store's, behind any URL
      if (io::is_zarr_array(path)) return "zarr-array";
      if (!io::is_zarr_group(path)) return "unknown";
      return is_anndata(*io::open_zarr_group(path, "/")) ? "zarr-anndata" : "zarr-group";
    }
    if (!io::is_hdf5_file(path)) return "unknown";
    return is_anndata(*io::open_hdf5_group(path, "/")) ? "hdf5-anndata" : "hdf5";
  });
}

namespace {

// The number of an annbatch dataset's name: "dataset_<digits>" (a zarr
// group) or "dataset_<digits>.h5ad" (a file), with leading zeros stripped;
// nullopt for any other name.
std::optional<std::string> annbatch_number(const std::string& name, bool h5ad) {
  const std::string prefix = "dataset_", suffix = h5ad ? ".h5ad" : "";
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return std::nullopt;
  }
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  const size_t first = std::min(digits.find_first_not_of('0'), digits.size() - 1);
  return digits.substr(first);
}

}  // namespace

std::optional<std::vector<std::string>> annbatch_datasets(const std::string& path) {
  const io::storage::OpeningScope opening;
  return translate_errors([&]() -> std::optional<std::vector<std::string>> {
    if (!io::file_exists(path)) throw core::FileNotFound(path);
    if (!io::is_directory(path)) return std::nullopt;
    bool zarr = false;
    if (io::is_zarr_group(path)) {
      const json attributes = io::open_zarr_group(path, "/")->attributes();
      const auto encoding = attributes.find("encoding-type");
      if (encoding == attributes.end() || *encoding != "annbatch-preshuffled") return std::nullopt;
      zarr = true;
    } else if (io::is_zarr_array(path)) {
      return std::nullopt;
    }
    // (number without leading zeros, name): sorted by number, as annbatch numbers them.
    std::vector<std::pair<std::string, std::string>> found;
    for (const auto& [name, is_directory] : io::list_directory(path)) {
      const std::optional<std::string> number = annbatch_number(name, !zarr);
      if (number && is_directory == zarr) found.emplace_back(*number, name);
    }
    if (found.empty() && !zarr) return std::nullopt;
    core::check_argument(!found.empty(), "annbatch_datasets: ", path,
                         " is an annbatch DatasetCollection without datasets (dataset_<i>)");
    std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
      return std::make_tuple(a.first.size(), a.first, a.second) < std::make_tuple(b.first.size(), b.first, b.second);
    });
    std::vector<std::string> datasets;
    for (const auto& [number, name] : found) datasets.push_back(path + "/" + name);
    return datasets;
  });
}

namespace {

c10::Dict<std::string, std::string> to_dict(const std::map<std::string, std::string>& map) {
  c10::Dict<std::string, std::string> out;
  for (const auto& [key, value] : map) out.insert(key, value);
  return out;
}

c10::Dict<std::string, std::string> one_field(const std::string& field, const std::string& path) {
  c10::Dict<std::string, std::string> out;
  out.insert(field, path);
  return out;
}

}  // namespace

TensorSource::TensorSource(const at::Tensor& x)
    : Source(SourceImpl::tensor_source([&] {
        c10::Dict<std::string, at::Tensor> fields;
        fields.insert("X", x);
        return fields;
      }())) {}

TensorSource::TensorSource(const c10::Dict<std::string, at::Tensor>& fields)
    : Source(SourceImpl::tensor_source(fields)) {}

HDF5Source::HDF5Source(const std::string& path, const std::string& dataset, const HDF5SourceOptions& options)
    : Source(SourceImpl::hdf5_source(path, one_field(options.field, dataset))) {}

HDF5Source::HDF5Source(const std::string& path, const std::map<std::string, std::string>& datasets)
    : Source(SourceImpl::hdf5_source(path, to_dict(datasets))) {}

ZarrSource::ZarrSource(const std::string& path, const std::string& array, const ZarrSourceOptions& options)
    : Source(SourceImpl::zarr_source(path, one_field(options.field, array))) {}

ZarrSource::ZarrSource(const std::string& path, const std::map<std::string, std::string>& arrays)
    : Source(SourceImpl::zarr_source(path, to_dict(arrays))) {}

AnnDataSource::AnnDataSource(const std::string& path, const AnnDataSourceOptions& options)
    : AnnDataSource(c10::make_intrusive<AnnDataImpl>(path), options) {}

AnnDataSource::AnnDataSource(c10::intrusive_ptr<AnnDataImpl> anndata, const AnnDataSourceOptions& options)
    : Source(anndata->source(options.obs, options.layer, options.dense, options.fields)),
      anndata_(std::move(anndata)) {}

AnnbatchCollection::AnnbatchCollection(const std::string& path, const AnnDataSourceOptions& options)
    : Collection([&] {
        const io::storage::OpeningScope opening;  // the collection's datasets opened with what finding them learnt
        const std::optional<std::vector<std::string>> datasets = annbatch_datasets(path);
        TORCH_CHECK_VALUE(datasets, "AnnbatchCollection: ", path,
                          " is not an annbatch DatasetCollection (a zarr group whose encoding-type is "
                          "annbatch-preshuffled, or a directory of dataset_<i>.h5ad files)");
        // Behind URLs each dataset's opening is a chain of round trips (~25 for a zarr dataset): together.
        std::vector<std::optional<Source>> opened(datasets->size());
        const auto open_one = [&](int64_t i) { opened[i] = AnnDataSource((*datasets)[i], options); };
        if (io::storage::is_url(path)) {
          core::run_waiting_tasks(static_cast<int64_t>(opened.size()), open_one);
        } else {
          for (size_t i = 0; i < opened.size(); ++i) open_one(static_cast<int64_t>(i));
        }
        std::vector<Source> parts;
        for (std::optional<Source>& part : opened) parts.push_back(std::move(*part));
        return parts;
      }()) {}

Collection::Collection(const std::vector<Source>& parts)
    : Source(SourceImpl::collection([&] {
        std::vector<c10::intrusive_ptr<SourceImpl>> natives;
        for (const Source& part : parts) natives.push_back(part.native());
        return natives;
      }())) {}

}  // namespace torch_shards
