// Everything torch_shards registers with torch, declaratively: the
// torch.classes.torch_shards classes (with pickling, so TorchScript modules
// holding them save and load) and the torch.ops.torch_shards factory ops. The
// behaviour lives in the classes (csrc/loader); nothing is decided here.
#include <torch/custom_class.h>
#include <torch/library.h>

#include <torch_shards/dataset.h>
#include <torch_shards/open.h>
#include <torch_shards/sampler.h>
#include <torch_shards/source.h>
#include <torch_shards/strategy.h>
#include <torch_shards/version.h>
#include "io/storage/remote_paths.h"
#include "loader/dataset_door.h"
#include "loader/device_stage.h"
#include "loader/zarr_device_decoder.h"

namespace torch_shards {
namespace {

using ProcessGroupPtr = std::optional<c10::intrusive_ptr<c10d::ProcessGroup>>;

struct Opening : torch::CustomClassHolder {
  io::storage::OpeningScope scope;
};

c10::intrusive_ptr<ShardedDatasetImpl> make_dataset(
    c10::intrusive_ptr<SourceImpl> source, c10::intrusive_ptr<StrategyImpl> strategy, int64_t batch_size,
    int64_t fetch_factor, bool drop_last, std::optional<std::string> even_batches, std::optional<int64_t> seed,
    std::optional<int64_t> rank, std::optional<int64_t> world_size, ProcessGroupPtr process_group,
    std::optional<int64_t> num_threads, std::optional<int64_t> prefetch, int64_t prefetch_bytes, bool pin_memory,
    std::optional<at::Tensor> shared_state, std::optional<std::string> device) {
  DatasetOptions options;
  options.batch_size = batch_size;
  options.fetch_factor = fetch_factor;
  options.drop_last = drop_last;
  options.even_batches = std::move(even_batches);
  options.seed = seed;
  options.rank = rank;
  options.world_size = world_size;
  options.process_group = process_group.value_or(nullptr);
  options.num_threads = num_threads;
  options.prefetch = prefetch;
  options.prefetch_bytes = prefetch_bytes;
  options.pin_memory = pin_memory;
  options.device = parse_device(device, "ShardedDataset");
  return DatasetDoor::make(std::move(source), std::move(strategy), options, shared_state);
}

c10::intrusive_ptr<DistributedSamplerImpl> make_sampler(int64_t num_rows, std::optional<int64_t> num_replicas,
                                                        std::optional<int64_t> rank, bool shuffle, int64_t seed,
                                                        bool drop_last,
                                                        std::optional<c10::intrusive_ptr<StrategyImpl>> strategy,
                                                        ProcessGroupPtr process_group) {
  return c10::make_intrusive<DistributedSamplerImpl>(num_rows, strategy, num_replicas, rank, shuffle, seed, drop_last,
                                                     process_group.value_or(nullptr));
}

// An AnnData source's fields from a TorchScript dict (its order kept).
AnnDataFields anndata_fields(const std::optional<c10::Dict<std::string, std::string>>& fields) {
  AnnDataFields out;
  if (fields) {
    for (const auto& item : *fields) out.emplace_back(item.key(), item.value());
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(torch_shards, m) {
  m.class_<StrategyImpl>("Strategy")
      .def("kind", &StrategyImpl::kind)
      .def("describe", &StrategyImpl::describe)
      .def("plan_size", &StrategyImpl::plan_size)
      .def("plan", &StrategyImpl::plan)
      .def("strided", &StrategyImpl::strided)
      .def("provide", &StrategyImpl::provide)
      .def_pickle([](const c10::intrusive_ptr<StrategyImpl>& self) { return self->state(); },
                  [](StrategyState state) { return c10::make_intrusive<StrategyImpl>(std::move(state)); });

  m.class_<SourceImpl>("Source")
      .def("kind", &SourceImpl::kind)
      .def("num_rows", &SourceImpl::num_rows)
      .def("field_names", &SourceImpl::field_names)
      .def("field_specs", &SourceImpl::field_specs)
      .def("describe", &SourceImpl::describe)
      .def("categories_json", &SourceImpl::categories_json)
      .def("opened_stamps", &SourceImpl::opened_stamps)
      .def("check_same_files", &SourceImpl::check_same_files)
      .def("read", &SourceImpl::read, "", {torch::arg("rows"), torch::arg("num_threads") = 1})
      .def_pickle([](const c10::intrusive_ptr<SourceImpl>& self) { return self->state(); },
                  [](SourceState state) { return c10::make_intrusive<SourceImpl>(state); });

  m.class_<AnnDataImpl>("AnnData")
      .def("path", &AnnDataImpl::path)
      .def("n_obs", &AnnDataImpl::n_obs)
      .def("n_vars", &AnnDataImpl::n_vars)
      .def("obs_names", &AnnDataImpl::obs_names)
      .def("var_names", &AnnDataImpl::var_names)
      .def("obs_columns", &AnnDataImpl::obs_columns)
      .def("categories_json", &AnnDataImpl::categories_json)
      .def("source",
           [](const c10::intrusive_ptr<AnnDataImpl>& self, const std::vector<std::string>& obs,
              const std::optional<std::string>& layer, bool dense,
              const std::optional<c10::Dict<std::string, std::string>>& fields) {
             return self->source(obs, layer, dense, anndata_fields(fields));
           },
           "",
           {torch::arg("obs"), torch::arg("layer") = torch::arg::none(), torch::arg("dense") = false,
            torch::arg("fields") = torch::arg::none()})
      .def_pickle([](const c10::intrusive_ptr<AnnDataImpl>& self) { return self->path(); },
                  [](std::string path) { return c10::make_intrusive<AnnDataImpl>(path); });

  m.class_<BatchIteratorImpl>("BatchIterator")
      .def("next", &BatchIteratorImpl::next)
      .def("wait", [](const c10::intrusive_ptr<BatchIteratorImpl>& self,
                      int64_t timeout_ms) { return DatasetDoor::wait(*self, timeout_ms); })
      .def("poll", [](const c10::intrusive_ptr<BatchIteratorImpl>& self,
                      int64_t timeout_ms) { return DatasetDoor::poll(*self, timeout_ms); })
      .def("finished", &BatchIteratorImpl::finished)
      .def("worker_batches",
           [](const c10::intrusive_ptr<BatchIteratorImpl>& self) { return DatasetDoor::worker_batches(*self); })
      .def("next_unit", &BatchIteratorImpl::next_unit)
      .def("push_unit", &BatchIteratorImpl::push_unit)
      .def("pending", &BatchIteratorImpl::pending)
      .def("close", &BatchIteratorImpl::close)
      .def("epoch", &BatchIteratorImpl::epoch)
      .def("num_batches", &BatchIteratorImpl::num_batches)
      .def("rank_batches", &BatchIteratorImpl::rank_batches)
      .def("batches_delivered", &BatchIteratorImpl::batches_delivered)
      .def("last_was_padding", &BatchIteratorImpl::last_was_padding)
      .def("stats", &BatchIteratorImpl::stats);

  // One dataset opening held by a door that makes several calls (Python's torch_shards.open): what
  // they learn of objects in storage is reused among them, until the object goes (remote_paths.h).
  m.class_<Opening>("Opening").def(torch::init<>());

  m.class_<DeviceStageImpl>("DeviceStage")
      .def(torch::init<std::string, int64_t>(), "",
           {torch::arg("device"), torch::arg("prefetch_bytes") = int64_t{1} << 30})
      .def("put", &DeviceStageImpl::put)
      .def("take", &DeviceStageImpl::take)
      .def("pending", &DeviceStageImpl::pending)
      .def("device", &DeviceStageImpl::device)
      .def("warning", [](const c10::intrusive_ptr<DeviceStageImpl>& self) { return self->warning(); })
      .def("stats", &DeviceStageImpl::stats);

  m.class_<ZarrDeviceDecoderImpl>("ZarrDeviceDecoder")
      .def(torch::init<std::string, std::string, std::vector<std::string>, int64_t, bool>(), "",
           {torch::arg("store"), torch::arg("path"), torch::arg("nvcomp_dirs") = std::vector<std::string>{},
            torch::arg("num_threads") = 4, torch::arg("trust_unverified") = false})
      .def("read", &ZarrDeviceDecoderImpl::read, "", {torch::arg("rows"), torch::arg("device") = "cpu"})
      .def("read_batches", &ZarrDeviceDecoderImpl::read_batches, "",
           {torch::arg("batches"), torch::arg("device") = "cpu"})
      .def("stats", &ZarrDeviceDecoderImpl::stats)
      .def("fallback_reason", &ZarrDeviceDecoderImpl::fallback_reason)
      .def("host_reason", &ZarrDeviceDecoderImpl::host_reason)
      .def("nvcomp_library", &ZarrDeviceDecoderImpl::nvcomp_library);

  m.class_<ShardedDatasetImpl>("ShardedDataset")
      .def(
          torch::init(&make_dataset), "",
          {torch::arg("source"), torch::arg("strategy"), torch::arg("batch_size"), torch::arg("fetch_factor") = 16,
           torch::arg("drop_last") = false, torch::arg("even_batches") = "pad", torch::arg("seed") = torch::arg::none(),
           torch::arg("rank") = torch::arg::none(), torch::arg("world_size") = torch::arg::none(),
           torch::arg("process_group") = torch::arg::none(), torch::arg("num_threads") = torch::arg::none(),
           torch::arg("prefetch") = torch::arg::none(), torch::arg("prefetch_bytes") = int64_t{1} << 30,
           torch::arg("pin_memory") = false, torch::arg("shared_state") = torch::arg::none(),
           torch::arg("device") = torch::arg::none()})  // names and defaults as in Python
      .def("iter", &ShardedDatasetImpl::iter)
      .def("iter_worker",
           [](const c10::intrusive_ptr<ShardedDatasetImpl>& self, int64_t worker, int64_t num_workers,
              int64_t generation_seed, bool shared_memory, bool recycled, std::optional<int64_t> stream_start) {
             return DatasetDoor::iter_worker(*self, worker, num_workers, generation_seed, shared_memory, recycled,
                                             stream_start);
           },
           "",
           {torch::arg("worker"), torch::arg("num_workers"), torch::arg("generation_seed"), torch::arg("shared_memory"),
            torch::arg("recycled") = false, torch::arg("stream_start") = torch::arg::none()})
      .def("iter_epoch", &ShardedDatasetImpl::iter_epoch, "",
           {torch::arg("epoch"), torch::arg("worker") = 0, torch::arg("num_workers") = 1})
      .def("set_epoch", &ShardedDatasetImpl::set_epoch)
      .def("epoch", &ShardedDatasetImpl::epoch)
      .def("next_epoch", &ShardedDatasetImpl::next_epoch)
      .def("num_batches", &ShardedDatasetImpl::num_batches)
      .def("worker_batches", &ShardedDatasetImpl::worker_batches)
      .def("seed", &ShardedDatasetImpl::seed)
      .def("rank", &ShardedDatasetImpl::rank)
      .def("world_size", &ShardedDatasetImpl::world_size)
      .def("batch_size", &ShardedDatasetImpl::batch_size)
      .def("fetch_factor", &ShardedDatasetImpl::fetch_factor)
      .def("drop_last", &ShardedDatasetImpl::drop_last)
      .def("even_batches", &ShardedDatasetImpl::even_batches)
      .def("pin_memory", &ShardedDatasetImpl::pin_memory)
      .def("device_warning",
           [](const c10::intrusive_ptr<ShardedDatasetImpl>& self) { return DatasetDoor::device_warning(*self); })
      .def("device",
           [](const c10::intrusive_ptr<ShardedDatasetImpl>& self) -> std::optional<std::string> {
             const auto device = self->device();
             return device ? std::optional<std::string>(device->str()) : std::nullopt;
           })
      .def("plan_size", &ShardedDatasetImpl::plan_size)
      .def("num_fetches", &ShardedDatasetImpl::num_fetches)
      .def("num_global_batches", &ShardedDatasetImpl::num_global_batches)
      .def("fetch_rows", &ShardedDatasetImpl::fetch_rows)
      .def("source", &ShardedDatasetImpl::source)
      .def("strategy", &ShardedDatasetImpl::strategy)
      .def("describe", &ShardedDatasetImpl::describe)
      .def("fingerprint", &ShardedDatasetImpl::fingerprint)
      .def("synchronize",
           [](const c10::intrusive_ptr<ShardedDatasetImpl>& self, const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
             DatasetDoor::synchronize(*self, group);
           })
      .def("synchronized",
           [](const c10::intrusive_ptr<ShardedDatasetImpl>& self) { return DatasetDoor::synchronized(*self); })
      .def("topology_source",
           [](const c10::intrusive_ptr<ShardedDatasetImpl>& self) { return DatasetDoor::topology_source(*self); })
      .def("shared_state",
           [](const c10::intrusive_ptr<ShardedDatasetImpl>& self) { return DatasetDoor::shared_state(*self); })
      .def("delivery_counts", &ShardedDatasetImpl::delivery_counts)
      .def("reader_stats", &ShardedDatasetImpl::reader_stats)
      .def("state_dict", &ShardedDatasetImpl::state_dict, "", {torch::arg("consumed_batches") = torch::arg::none()})
      .def("workers_starting",
           [](const c10::intrusive_ptr<ShardedDatasetImpl>& self) { DatasetDoor::workers_starting(*self); })
      .def("load_state_dict", &ShardedDatasetImpl::load_state_dict)
      .def_pickle([](const c10::intrusive_ptr<ShardedDatasetImpl>& self) { return DatasetDoor::state(*self); },
                  [](DatasetDoor::State state) { return DatasetDoor::from_state(state); });

  m.class_<SamplerIteratorImpl>("SamplerIterator")
      .def("next", &SamplerIteratorImpl::next)
      .def("epoch", &SamplerIteratorImpl::epoch)
      .def("position", &SamplerIteratorImpl::position)
      .def("length", &SamplerIteratorImpl::length);

  m.class_<DistributedSamplerImpl>("DistributedSampler")
      .def(torch::init(&make_sampler), "",
           {torch::arg("num_rows"), torch::arg("num_replicas") = torch::arg::none(),
            torch::arg("rank") = torch::arg::none(), torch::arg("shuffle") = true, torch::arg("seed") = 0,
            torch::arg("drop_last") = false, torch::arg("strategy") = torch::arg::none(),
            torch::arg("process_group") = torch::arg::none()})
      .def("iter", &DistributedSamplerImpl::iter)
      .def("set_epoch", &DistributedSamplerImpl::set_epoch)
      .def("epoch", &DistributedSamplerImpl::epoch)
      .def("num_rows", &DistributedSamplerImpl::num_rows)
      .def("num_replicas", &DistributedSamplerImpl::num_replicas)
      .def("rank", &DistributedSamplerImpl::rank)
      .def("shuffle", &DistributedSamplerImpl::shuffle)
      .def("seed", &DistributedSamplerImpl::seed)
      .def("drop_last", &DistributedSamplerImpl::drop_last)
      .def("num_samples", &DistributedSamplerImpl::num_samples)
      .def("total_size", &DistributedSamplerImpl::total_size)
      .def("plan_size", &DistributedSamplerImpl::plan_size)
      .def("strategy", &DistributedSamplerImpl::strategy)
      .def("indices", &DistributedSamplerImpl::indices, "",
           {torch::arg("epoch"), torch::arg("first"), torch::arg("count"), torch::arg("offset") = 0})
      .def("length", &DistributedSamplerImpl::length)
      .def("state_dict", &DistributedSamplerImpl::state_dict, "", {torch::arg("consumed") = 0})
      .def("load_state_dict", &DistributedSamplerImpl::load_state_dict)
      .def("fingerprint", &DistributedSamplerImpl::fingerprint)
      .def("topology_source", &DistributedSamplerImpl::topology_source)
      .def_pickle([](const c10::intrusive_ptr<DistributedSamplerImpl>& self) { return self->state(); },
                  [](DistributedSamplerImpl::State state) { return DistributedSamplerImpl::from_state(state); });

  m.def("streaming(bool shuffle=False, Tensor? indices=None) -> __torch__.torch.classes.torch_shards.Strategy",
        &StrategyImpl::streaming);
  m.def("block_shuffling(int block_size=8, Tensor? indices=None) -> __torch__.torch.classes.torch_shards.Strategy",
        &StrategyImpl::block_shuffling);
  m.def(
      "block_weighted_sampling(Tensor weights, int? total_size=None, int block_size=1, Tensor? indices=None, "
      "bool replacement=True) -> __torch__.torch.classes.torch_shards.Strategy",
      &StrategyImpl::block_weighted_sampling);
  m.def(
      "class_balanced_sampling(Tensor? labels, int? total_size=None, int block_size=1, Tensor? indices=None, "
      "float smoothing=0., str? label_key=None) -> __torch__.torch.classes.torch_shards.Strategy",
      &StrategyImpl::class_balanced_sampling);
  m.def(
      "custom_strategy(Tensor? plan, int? size=None, bool shuffle=False, str description=\"\") -> "
      "__torch__.torch.classes.torch_shards.Strategy",
      &StrategyImpl::custom_strategy);
  m.def("tensor_source(Dict(str, Tensor) fields) -> __torch__.torch.classes.torch_shards.Source",
        &SourceImpl::tensor_source);
  m.def("rows_source(int num_rows, str description=\"\") -> __torch__.torch.classes.torch_shards.Source",
        &SourceImpl::rows_source);
  m.def("hdf5_source(str path, Dict(str, str) datasets) -> __torch__.torch.classes.torch_shards.Source",
        &SourceImpl::hdf5_source);
  m.def("zarr_source(str path, Dict(str, str) arrays) -> __torch__.torch.classes.torch_shards.Source",
        &SourceImpl::zarr_source);
  m.def(
      "anndata_source(str path, str[]? obs=None, str? layer=None, bool dense=False, Dict(str, str)? fields=None) -> "
      "__torch__.torch.classes.torch_shards.Source",
      [](const std::string& path, const std::optional<std::vector<std::string>>& obs,
         const std::optional<std::string>& layer, bool dense,
         const std::optional<c10::Dict<std::string, std::string>>& fields) {
        return SourceImpl::anndata_source(path, obs.value_or(std::vector<std::string>()), layer, dense,
                                          anndata_fields(fields));
      });
  m.def("anndata(str path) -> __torch__.torch.classes.torch_shards.AnnData",
        [](const std::string& path) { return c10::make_intrusive<AnnDataImpl>(path); });
  m.def(
      "collection(__torch__.torch.classes.torch_shards.Source[] parts) -> __torch__.torch.classes.torch_shards.Source",
      &SourceImpl::collection);
  m.def("probe(str path) -> str", &probe);
  m.def("set_storage_options(str url, str options_json) -> ()", &set_storage_options_json);
  m.def("build_info() -> str", [] { return torch_shards::build_info(); });
  m.def("annbatch_datasets(str path) -> str[]?", &annbatch_datasets);
  // torch_shards.open's decision (open.h): the kind of source and the paths it reads.
  m.def("open_plan(str path, bool dataset=False, bool array=False) -> (str, str[])",
        [](const std::string& path, bool dataset, bool array) {
          OpenPlan plan = plan_open(path, dataset, array);
          return std::make_tuple(std::move(plan.kind), std::move(plan.paths));
        });
  m.def("merge_state_dicts(Dict(str, int)[] states) -> Dict(str, int)", &ShardedDatasetImpl::merge_state_dicts);
  m.def(
      "sharded_dataset(__torch__.torch.classes.torch_shards.Source source, "
      "__torch__.torch.classes.torch_shards.Strategy strategy, int batch_size, int fetch_factor=16, "
      "bool drop_last=False, str? even_batches=\"pad\", int? seed=None, int? rank=None, int? world_size=None, "
      "__torch__.torch.classes.c10d.ProcessGroup? process_group=None, int? num_threads=None, int? prefetch=None, "
      "int prefetch_bytes=1073741824, bool pin_memory=False, Tensor? shared_state=None, str? device=None) -> "
      "__torch__.torch.classes.torch_shards.ShardedDataset",
      &make_dataset);
  m.def(
      "distributed_sampler(int num_rows, int? num_replicas=None, int? rank=None, bool shuffle=True, int seed=0, "
      "bool drop_last=False, __torch__.torch.classes.torch_shards.Strategy? strategy=None, "
      "__torch__.torch.classes.c10d.ProcessGroup? process_group=None) -> "
      "__torch__.torch.classes.torch_shards.DistributedSampler",
      &make_sampler);
}

}  // namespace torch_shards
