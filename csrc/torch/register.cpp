// Everything torch_shards registers with torch: the torch.classes.torch_shards
// classes and the torch.ops.torch_shards factory and utility ops.
#include <torch/custom_class.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

#include "../core/epoch_state.h"
#include "../core/errors.h"
#include "../io/file.h"
#include "../io/hdf5_array.h"
#include "../io/hdf5_group.h"
#include "../io/zarr_array.h"
#include "../io/zarr_group.h"
#include "array_source.h"
#include "classes.h"
#include "collection_source.h"
#include "process_group.h"
#include "tensor_source.h"

namespace torch_shards {
namespace {

// Core errors keep their message; InvalidArgument surfaces as ValueError.
template <typename F>
auto translate_errors(F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const core::InvalidArgument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const core::ReadError& e) {
    TORCH_CHECK(false, e.what());
  }
}

std::vector<int64_t> to_int64_vector(const at::Tensor& tensor, const char* what) {
  TORCH_CHECK_VALUE(tensor.dim() == 1, what, " must be 1-D, got shape ", tensor.sizes());
  TORCH_CHECK_VALUE(!at::isFloatingType(tensor.scalar_type()) && !at::isComplexType(tensor.scalar_type()) &&
                        tensor.scalar_type() != at::kBool,
                    what, " must be an integer tensor, got ", tensor.scalar_type());
  const at::Tensor values = tensor.to(at::kCPU, at::kLong).contiguous();
  const int64_t* data = values.data_ptr<int64_t>();
  return std::vector<int64_t>(data, data + values.numel());
}

std::optional<std::vector<int64_t>> to_indices(const std::optional<at::Tensor>& indices) {
  if (!indices) return std::nullopt;
  return to_int64_vector(*indices, "indices");
}

std::vector<double> to_double_vector(const at::Tensor& tensor, const char* what) {
  TORCH_CHECK_VALUE(tensor.dim() == 1, what, " must be 1-D, got shape ", tensor.sizes());
  TORCH_CHECK_VALUE(!at::isComplexType(tensor.scalar_type()), what, " must be real, got ", tensor.scalar_type());
  const at::Tensor values = tensor.to(at::kCPU, at::kDouble).contiguous();
  const double* data = values.data_ptr<double>();
  return std::vector<double>(data, data + values.numel());
}

c10::intrusive_ptr<Strategy> make_strategy(std::shared_ptr<const core::Strategy> strategy) {
  return c10::make_intrusive<Strategy>(std::move(strategy));
}

c10::intrusive_ptr<Strategy> streaming(bool shuffle, const std::optional<at::Tensor>& indices) {
  return translate_errors(
      [&] { return make_strategy(std::make_shared<core::Streaming>(shuffle, to_indices(indices))); });
}

c10::intrusive_ptr<Strategy> block_shuffling(int64_t block_size, const std::optional<at::Tensor>& indices) {
  return translate_errors(
      [&] { return make_strategy(std::make_shared<core::BlockShuffling>(block_size, to_indices(indices))); });
}

c10::intrusive_ptr<Strategy> block_weighted_sampling(const at::Tensor& weights, std::optional<int64_t> total_size,
                                                     int64_t block_size, const std::optional<at::Tensor>& indices,
                                                     bool replacement) {
  return translate_errors([&] {
    return make_strategy(
        std::make_shared<core::BlockWeightedSampling>(to_double_vector(weights, "BlockWeightedSampling: weights"),
                                                      total_size, block_size, to_indices(indices), replacement));
  });
}

c10::intrusive_ptr<Strategy> class_balanced_sampling(const at::Tensor& labels, std::optional<int64_t> total_size,
                                                     int64_t block_size, const std::optional<at::Tensor>& indices) {
  return translate_errors([&] {
    return make_strategy(std::make_shared<core::ClassBalancedSampling>(
        to_int64_vector(labels, "ClassBalancedSampling: labels"), total_size, block_size, to_indices(indices)));
  });
}

c10::intrusive_ptr<Source> tensor_source(const c10::Dict<std::string, at::Tensor>& fields) {
  return translate_errors(
      [&] { return c10::make_intrusive<Source>(std::make_shared<sources::TensorSource>(fields.copy())); });
}

c10::intrusive_ptr<Source> hdf5_source(const std::string& path, const c10::Dict<std::string, std::string>& datasets) {
  return translate_errors([&] {
    std::vector<sources::ArraySource::NamedArray> arrays;
    for (const auto& item : datasets) arrays.emplace_back(item.key(), io::open_hdf5_array(path, item.value()));
    return c10::make_intrusive<Source>(std::make_shared<sources::ArraySource>("HDF5Source", std::move(arrays)));
  });
}

c10::intrusive_ptr<Source> zarr_source(const std::string& path, const c10::Dict<std::string, std::string>& arrays) {
  return translate_errors([&] {
    core::check_argument(io::file_exists(path), "ZarrSource: ", path, ": no such file or directory");
    std::vector<sources::ArraySource::NamedArray> named;
    for (const auto& item : arrays) named.emplace_back(item.key(), io::open_zarr_array(path, item.value()));
    return c10::make_intrusive<Source>(std::make_shared<sources::ArraySource>("ZarrSource", std::move(named)));
  });
}

std::shared_ptr<const io::Group> open_group(const std::string& path) {
  if (io::is_directory(path)) {
    if (!io::is_zarr_group(path)) throw core::ReadError(path + ": not a zarr group (no .zgroup or zarr.json)");
    return io::open_zarr_group(path, "/");
  }
  return io::open_hdf5_group(path, "/");
}

c10::intrusive_ptr<AnnData> anndata(const std::string& path) {
  return translate_errors(
      [&] { return c10::make_intrusive<AnnData>(std::make_shared<io::AnnDataStore>(open_group(path))); });
}

c10::intrusive_ptr<Source> collection(const std::vector<c10::intrusive_ptr<Source>>& parts) {
  return translate_errors([&] {
    std::vector<std::shared_ptr<const sources::Source>> sources;
    for (const auto& part : parts) sources.push_back(part->get());
    return c10::make_intrusive<Source>(std::make_shared<sources::CollectionSource>(std::move(sources)));
  });
}

// What a path holds, for torch_shards.open: "missing", "hdf5", "hdf5-anndata",
// "zarr-array", "zarr-group", "zarr-anndata" or "unknown".
std::string probe(const std::string& path) {
  return translate_errors([&]() -> std::string {
    if (!io::file_exists(path)) return "missing";
    const auto is_anndata = [](const io::Group& root) {
      const auto attributes = root.attributes();
      const auto encoding = attributes.find("encoding-type");
      if (encoding != attributes.end() && encoding->is_string()) return encoding->get<std::string>() == "anndata";
      return root.has_group("obs") && (root.has_array("X") || root.has_group("X"));
    };
    if (io::is_directory(path)) {
      if (io::is_zarr_array(path)) return "zarr-array";
      if (!io::is_zarr_group(path)) return "unknown";
      return is_anndata(*io::open_zarr_group(path, "/")) ? "zarr-anndata" : "zarr-group";
    }
    if (!io::is_hdf5_file(path)) return "unknown";
    return is_anndata(*io::open_hdf5_group(path, "/")) ? "hdf5-anndata" : "hdf5";
  });
}

int64_t* epoch_state_words(const at::Tensor& state) {
  TORCH_CHECK_VALUE(state.scalar_type() == at::kLong && state.is_contiguous() && state.device().is_cpu() &&
                        state.numel() == core::kEpochStateWords,
                    "epoch state must be a contiguous CPU int64 tensor of ", core::kEpochStateWords, " elements");
  return state.data_ptr<int64_t>();
}

}  // namespace

TORCH_LIBRARY(torch_shards, m) {
  m.class_<Strategy>("Strategy")
      .def("describe", &Strategy::describe)
      .def("plan_size", [](const c10::intrusive_ptr<Strategy>& self,
                           int64_t num_rows) { return translate_errors([&] { return self->plan_size(num_rows); }); })
      .def("plan", [](const c10::intrusive_ptr<Strategy>& self, int64_t num_rows, int64_t seed,
                      int64_t epoch) { return translate_errors([&] { return self->plan(num_rows, seed, epoch); }); })
      .def("strided", [](const c10::intrusive_ptr<Strategy>& self, int64_t num_rows, int64_t seed, int64_t epoch,
                         int64_t start, int64_t step, int64_t count) {
        return translate_errors([&] { return self->strided(num_rows, seed, epoch, start, step, count); });
      });

  m.class_<Source>("Source")
      .def("num_rows", &Source::num_rows)
      .def("field_names", &Source::field_names)
      .def("field_specs", &Source::field_specs)
      .def("describe", &Source::describe)
      .def("read", [](const c10::intrusive_ptr<Source>& self, const at::Tensor& rows, int64_t num_threads) {
        return translate_errors([&] { return self->read(rows, num_threads); });
      });

  m.class_<AnnData>("AnnData")
      .def("n_obs", &AnnData::n_obs)
      .def("n_vars", &AnnData::n_vars)
      .def("obs_names",
           [](const c10::intrusive_ptr<AnnData>& self) { return translate_errors([&] { return self->obs_names(); }); })
      .def("var_names",
           [](const c10::intrusive_ptr<AnnData>& self) { return translate_errors([&] { return self->var_names(); }); })
      .def(
          "obs_columns",
          [](const c10::intrusive_ptr<AnnData>& self) { return translate_errors([&] { return self->obs_columns(); }); })
      .def("categories_json",
           [](const c10::intrusive_ptr<AnnData>& self, const std::string& column) {
             return translate_errors([&] { return self->categories_json(column); });
           })
      .def("source", [](const c10::intrusive_ptr<AnnData>& self, const std::vector<std::string>& obs,
                        const std::optional<std::string>& layer,
                        bool dense) { return translate_errors([&] { return self->source(obs, layer, dense); }); });

  m.class_<EpochReader>("EpochReader")
      .def("next",
           [](const c10::intrusive_ptr<EpochReader>& self) { return translate_errors([&] { return self->next(); }); })
      .def("next_batches",
           [](const c10::intrusive_ptr<EpochReader>& self) {
             return translate_errors([&] { return self->next_batches(); });
           })
      .def("poll_batches",
           [](const c10::intrusive_ptr<EpochReader>& self, int64_t timeout_ms) {
             return translate_errors([&] { return self->poll_batches(timeout_ms); });
           })
      .def("close", [](const c10::intrusive_ptr<EpochReader>& self) { self->close(); })
      .def("stats", &EpochReader::stats)
      .def("epoch", &EpochReader::epoch)
      .def("num_units", &EpochReader::num_units)
      .def("units_done", &EpochReader::units_done)
      .def("last_was_padding", &EpochReader::last_was_padding)
      .def("skip_units", [](const c10::intrusive_ptr<EpochReader>& self, int64_t units) {
        translate_errors([&] { self->skip_units(units); });
      });

  m.class_<ShardedDataset>("ShardedDataset")
      .def(torch::init([](c10::intrusive_ptr<Source> source, c10::intrusive_ptr<Strategy> strategy, int64_t batch_size,
                          int64_t fetch_factor, bool drop_last, std::string even_batches, int64_t seed, int64_t rank,
                          int64_t world_size) {
        return translate_errors([&] {
          return c10::make_intrusive<ShardedDataset>(std::move(source), std::move(strategy), batch_size, fetch_factor,
                                                     drop_last, even_batches, seed, rank, world_size);
        });
      }))
      .def("seed", &ShardedDataset::seed)
      .def("rank", &ShardedDataset::rank)
      .def("world_size", &ShardedDataset::world_size)
      .def("batch_size", &ShardedDataset::batch_size)
      .def("plan_size", &ShardedDataset::plan_size)
      .def("num_global_batches", &ShardedDataset::num_global_batches)
      .def("num_batches", &ShardedDataset::num_batches)
      .def("describe", &ShardedDataset::describe)
      .def("fingerprint", &ShardedDataset::fingerprint)
      .def("check_consistency",
           [](const c10::intrusive_ptr<ShardedDataset>& self, const std::string& group_name) {
             translate_errors([&] { self->check_consistency(group_name); });
           })
      .def("worker_batches",
           [](const c10::intrusive_ptr<ShardedDataset>& self, int64_t worker, int64_t num_workers) {
             return translate_errors([&] { return self->worker_batches(worker, num_workers); });
           })
      .def("fetch_rows", [](const c10::intrusive_ptr<ShardedDataset>& self, int64_t epoch,
                            int64_t fetch) { return translate_errors([&] { return self->fetch_rows(epoch, fetch); }); })
      .def("reader", [](const c10::intrusive_ptr<ShardedDataset>& self, int64_t epoch, int64_t worker,
                        int64_t num_workers, int64_t num_threads, int64_t prefetch, int64_t prefetch_bytes,
                        const std::string& memory) {
        return translate_errors([&] {
          return self->reader(epoch, worker, num_workers,
                              ReaderOptions{num_threads, prefetch, prefetch_bytes, sources::memory_from_name(memory)});
        });
      });

  m.def("streaming(bool shuffle=False, Tensor? indices=None) -> __torch__.torch.classes.torch_shards.Strategy",
        &streaming);
  m.def("block_shuffling(int block_size=8, Tensor? indices=None) -> __torch__.torch.classes.torch_shards.Strategy",
        &block_shuffling);
  m.def(
      "block_weighted_sampling(Tensor weights, int? total_size=None, int block_size=1, Tensor? indices=None, "
      "bool replacement=True) -> __torch__.torch.classes.torch_shards.Strategy",
      &block_weighted_sampling);
  m.def(
      "class_balanced_sampling(Tensor labels, int? total_size=None, int block_size=1, Tensor? indices=None) -> "
      "__torch__.torch.classes.torch_shards.Strategy",
      &class_balanced_sampling);
  m.def("tensor_source(Dict(str, Tensor) fields) -> __torch__.torch.classes.torch_shards.Source", &tensor_source);
  m.def("hdf5_source(str path, Dict(str, str) datasets) -> __torch__.torch.classes.torch_shards.Source",
        [](std::string path, c10::Dict<std::string, std::string> datasets) { return hdf5_source(path, datasets); });
  m.def("zarr_source(str path, Dict(str, str) arrays) -> __torch__.torch.classes.torch_shards.Source",
        [](std::string path, c10::Dict<std::string, std::string> arrays) { return zarr_source(path, arrays); });
  m.def("anndata(str path) -> __torch__.torch.classes.torch_shards.AnnData",
        [](std::string path) { return anndata(path); });
  m.def(
      "collection(__torch__.torch.classes.torch_shards.Source[] parts) -> __torch__.torch.classes.torch_shards.Source",
      [](std::vector<c10::intrusive_ptr<Source>> parts) { return collection(parts); });
  m.def("probe(str path) -> str", [](std::string path) { return probe(path); });

  m.def("epoch_state_init(Tensor state) -> ()",
        [](const at::Tensor& state) { core::epoch_state_init(epoch_state_words(state)); });
  m.def("epoch_state_set_next(Tensor state, int epoch) -> ()", [](const at::Tensor& state, int64_t epoch) {
    translate_errors([&] { core::epoch_state_set_next(epoch_state_words(state), epoch); });
  });
  m.def("epoch_state_next(Tensor state) -> int", [](const at::Tensor& state) {
    return translate_errors([&] { return core::epoch_state_next(epoch_state_words(state)); });
  });
  m.def("epoch_state_last(Tensor state) -> int", [](const at::Tensor& state) {
    return translate_errors([&] { return core::epoch_state_last(epoch_state_words(state)); });
  });
  m.def("epoch_state_claim_main(Tensor state) -> int", [](const at::Tensor& state) {
    return translate_errors([&] { return core::epoch_state_claim_main(epoch_state_words(state)); });
  });
  m.def(
      "epoch_state_claim_worker(Tensor state, int generation_seed, int local_iteration, int num_workers, int "
      "worker_id) -> int",
      [](const at::Tensor& state, int64_t generation_seed, int64_t local_iteration, int64_t num_workers,
         int64_t worker_id) {
        return translate_errors([&] {
          return core::epoch_state_claim_worker(epoch_state_words(state), generation_seed, local_iteration, num_workers,
                                                worker_id);
        });
      });
  m.def("broadcast_seed(int seed, str group_name) -> int", [](int64_t seed, std::string group_name) {
    return translate_errors([&] { return broadcast_seed(seed, group_name); });
  });
  m.def("check_same_on_all_ranks(str fingerprint, str group_name, str who) -> ()",
        [](std::string fingerprint, std::string group_name, std::string who) {
          translate_errors([&] { check_same_on_all_ranks(fingerprint, group_name, who); });
        });
}

}  // namespace torch_shards
