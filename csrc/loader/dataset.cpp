#include "torch_shards/dataset.h"

#include <ATen/Context.h>
#include <ATen/StorageUtils.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "core/epoch_layout.h"
#include "core/errors.h"
#include "core/planner.h"
#include "core/shared_state.h"
#include "loader/batches.h"
#include "loader/epoch_reader.h"
#include "loader/errors.h"
#include "loader/process_group.h"
#include "loader/topology.h"

namespace torch_shards {
namespace {

constexpr const char* kWho = "ShardedDataset";
constexpr int64_t kNoSlot = -1;  // an iterator whose deliveries are not counted (iter_epoch)

int64_t available_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max<int64_t>(1, std::thread::hardware_concurrency());
}

core::EvenBatches even_batches_of(const std::optional<std::string>& value) {
  if (!value) return core::EvenBatches::kNone;
  TORCH_CHECK_VALUE(*value == "pad" || *value == "drop", kWho, ": even_batches must be 'pad', 'drop' or None, got '",
                    *value, "'");
  return core::parse_even_batches(*value);
}

// Shared memory: DataLoader workers see it through fork (the mapping) and
// spawn (torch sends the storage by file descriptor or by name).
at::Tensor new_shared_state() {
  at::Tensor state = at::empty({0}, at::TensorOptions().dtype(at::kLong));
  state.set_(c10::Storage(at::new_shm_fd_storage(core::kSharedStateWords * sizeof(int64_t))), 0,
             {core::kSharedStateWords});
  core::shared_state_init(state.data_ptr<int64_t>());
  return state;
}

at::Tensor checked_shared_state(const at::Tensor& state) {
  TORCH_CHECK_VALUE(state.defined() && state.scalar_type() == at::kLong && state.dim() == 1 && state.is_contiguous() &&
                        state.device().is_cpu(),
                    kWho, ": shared_state must be a contiguous 1-D CPU int64 tensor (made by a ShardedDataset)");
  translate_errors([&] { core::check_shared_state(state.data_ptr<int64_t>(), state.numel()); });
  return state;
}

// Always through the tensor: torch may move a shared storage's memory when it
// sends it to a worker (file_system sharing), so no pointer is kept.
int64_t* words(const at::Tensor& state) { return state.data_ptr<int64_t>(); }

}  // namespace

ShardedDatasetImpl::ShardedDatasetImpl(c10::intrusive_ptr<SourceImpl> source, c10::intrusive_ptr<StrategyImpl> strategy,
                                       const DatasetOptions& options, const std::optional<at::Tensor>& shared_state)
    : source_(std::move(source)), strategy_(std::move(strategy)), options_(options) {
  TORCH_CHECK_VALUE(source_, kWho, ": source is null");
  TORCH_CHECK_VALUE(strategy_, kWho, ": strategy is null");
  TORCH_CHECK_VALUE(options.batch_size >= 1, kWho, ": batch_size must be >= 1, got ", options.batch_size);
  TORCH_CHECK_VALUE(options.fetch_factor >= 1, kWho, ": fetch_factor must be >= 1, got ", options.fetch_factor);
  TORCH_CHECK_VALUE(!options.num_threads || *options.num_threads >= 1, kWho, ": num_threads must be >= 1, got ",
                    options.num_threads.value_or(0));
  TORCH_CHECK_VALUE(options.prefetch >= 0, kWho, ": prefetch must be >= 0, got ", options.prefetch);
  TORCH_CHECK_VALUE(options.prefetch_bytes >= 0, kWho, ": prefetch_bytes must be >= 0, got ", options.prefetch_bytes);
  core::LoaderOptions layout{options.batch_size, options.fetch_factor, options.drop_last,
                             even_batches_of(options.even_batches)};
  const Topology topology = resolve_topology(options.rank, options.world_size, options.process_group, kWho);
  rank_ = topology.rank;
  world_size_ = topology.world_size;
  translate_errors([&] {
    try {
      core::check_loader_options(layout, world_size_);
    } catch (const core::InvalidArgument& error) {
      throw core::InvalidArgument(core::concat(kWho, ": ", error.what()));
    }
    planner_ = std::make_shared<const core::Planner>(strategy_->bind(source_->num_rows()), layout, world_size_);
  });
  // Without CUDA there is nothing to pin for; the doors tell their users (pin_memory() is false).
  if (!at::hasCUDA()) options_.pin_memory = false;
  shared_state_ = shared_state ? checked_shared_state(*shared_state) : new_shared_state();
  seed_ = resolve_seed(options.seed, topology);
  if (topology.group && world_size_ > 1) check_same_on_all_ranks(*topology.group, fingerprint(), kWho);
  options_.process_group.reset();  // used once: loading never communicates
}

ShardedDatasetImpl::~ShardedDatasetImpl() = default;

c10::intrusive_ptr<BatchIteratorImpl> ShardedDatasetImpl::iter() {
  const int64_t epoch = translate_errors([&] { return core::epoch_state_claim_main(words(shared_state_)); });
  return start(epoch, 0, 1, core::kMainSlot, false);
}

c10::intrusive_ptr<BatchIteratorImpl> ShardedDatasetImpl::iter_worker(int64_t worker, int64_t num_workers,
                                                                      int64_t generation_seed, bool shared_memory) {
  TORCH_CHECK_VALUE(num_workers >= 1 && worker >= 0 && worker < num_workers, kWho,
                    ": worker must be in [0, num_workers=", num_workers, "), got ", worker);
  const int64_t epoch = translate_errors([&] {
    return core::epoch_state_claim_worker(words(shared_state_), generation_seed, local_iterations_++, num_workers,
                                          worker);
  });
  return start(epoch, worker, num_workers, worker, shared_memory);
}

c10::intrusive_ptr<BatchIteratorImpl> ShardedDatasetImpl::iter_epoch(int64_t epoch, int64_t worker,
                                                                     int64_t num_workers) {
  return start(epoch, worker, num_workers, kNoSlot, false);
}

c10::intrusive_ptr<BatchIteratorImpl> ShardedDatasetImpl::start(int64_t epoch, int64_t worker, int64_t num_workers,
                                                                int64_t slot, bool shared_memory) {
  TORCH_CHECK_VALUE(epoch >= 0, kWho, ": epoch must be >= 0, got ", epoch);
  TORCH_CHECK_VALUE(num_workers >= 1 && worker >= 0 && worker < num_workers, kWho,
                    ": worker must be in [0, num_workers=", num_workers, "), got ", worker);
  ReaderOptions reader;
  reader.num_threads = options_.num_threads.value_or(std::max<int64_t>(1, available_cpus() / num_workers));
  reader.prefetch = options_.prefetch;
  reader.prefetch_bytes = options_.prefetch_bytes;
  reader.memory = shared_memory         ? sources::Memory::kShared
                  : options_.pin_memory ? sources::Memory::kPinned
                                        : sources::Memory::kPageable;
  auto iterator = translate_errors([&] {
    core::UnitCursor cursor(planner_, static_cast<uint64_t>(seed_), epoch, rank_, worker, num_workers);
    const int64_t batches = planner_->layout().worker_batches(rank_, worker, num_workers);
    return c10::make_intrusive<BatchIteratorImpl>(
        std::make_unique<EpochReader>(source_->get(), std::move(cursor), reader), epoch, options_.batch_size, batches,
        shared_state_, slot);
  });
  std::lock_guard<std::mutex> lock(iterators_mutex_);
  iterators_.erase(
      std::remove_if(iterators_.begin(), iterators_.end(), [](const auto& weak) { return weak.expired(); }),
      iterators_.end());
  iterators_.emplace_back(iterator);
  return iterator;
}

void ShardedDatasetImpl::set_epoch(int64_t epoch) {
  TORCH_CHECK_VALUE(epoch >= 0, kWho, ": epoch must be >= 0, got ", epoch);
  translate_errors([&] { core::epoch_state_set_next(words(shared_state_), epoch); });
}

int64_t ShardedDatasetImpl::epoch() const { return core::epoch_state_last(words(shared_state_)); }

int64_t ShardedDatasetImpl::next_epoch() const { return core::epoch_state_next(words(shared_state_)); }

int64_t ShardedDatasetImpl::num_batches() const { return planner_->layout().rank_batches(rank_); }

int64_t ShardedDatasetImpl::worker_batches(int64_t worker, int64_t num_workers) const {
  TORCH_CHECK_VALUE(num_workers >= 1 && worker >= 0 && worker < num_workers, kWho,
                    ": worker must be in [0, num_workers=", num_workers, "), got ", worker);
  return planner_->layout().worker_batches(rank_, worker, num_workers);
}

int64_t ShardedDatasetImpl::plan_size() const { return planner_->layout().plan_size(); }
int64_t ShardedDatasetImpl::num_fetches() const { return planner_->layout().num_fetches(); }
int64_t ShardedDatasetImpl::num_global_batches() const { return planner_->layout().num_global_batches(); }

at::Tensor ShardedDatasetImpl::fetch_rows(int64_t epoch, int64_t fetch) const {
  TORCH_CHECK_VALUE(fetch >= 0 && fetch < num_fetches(), kWho, ": fetch must be in [0, ", num_fetches(), "), got ",
                    fetch);
  TORCH_CHECK_VALUE(epoch >= 0, kWho, ": epoch must be >= 0, got ", epoch);
  std::vector<int64_t> rows;
  planner_->fetch_rows(static_cast<uint64_t>(seed_), epoch, fetch, rows);
  at::Tensor out = at::empty({static_cast<int64_t>(rows.size())}, at::TensorOptions().dtype(at::kLong));
  if (!rows.empty()) std::memcpy(out.data_ptr<int64_t>(), rows.data(), rows.size() * sizeof(int64_t));
  return out;
}

std::string ShardedDatasetImpl::describe() const {
  return core::concat(kWho, "(source=", source_->describe(), ", strategy=", strategy_->describe(),
                      ", batch_size=", options_.batch_size, ", fetch_factor=", options_.fetch_factor,
                      ", even_batches=", options_.even_batches.value_or("none"), ", rank=", rank_,
                      ", world_size=", world_size_, ")");
}

std::string ShardedDatasetImpl::fingerprint() const {
  return core::concat("rows: ", source_->num_rows(), "\nsource: ", source_->describe(),
                      "\nstrategy: ", strategy_->describe(), "\nplan entries: ", plan_size(),
                      "\nbatch_size: ", options_.batch_size, "\nfetch_factor: ", options_.fetch_factor,
                      "\ndrop_last: ", options_.drop_last ? "True" : "False",
                      "\neven_batches: ", options_.even_batches.value_or("none"), "\nworld_size: ", world_size_,
                      "\nseed: ", static_cast<uint64_t>(seed_));
}

at::Tensor ShardedDatasetImpl::delivery_counts() const {
  at::Tensor out = at::empty({core::kDeliverySlots, 2}, at::TensorOptions().dtype(at::kLong));
  core::delivery_counts(words(shared_state_), out.data_ptr<int64_t>());
  return out;
}

std::vector<c10::Dict<std::string, int64_t>> ShardedDatasetImpl::reader_stats() const {
  std::vector<c10::Dict<std::string, int64_t>> out;
  std::lock_guard<std::mutex> lock(iterators_mutex_);
  for (const auto& weak : iterators_) {
    const auto iterator = weak.lock();
    if (iterator && !iterator->closed()) out.push_back(iterator->stats());
  }
  return out;
}

ShardedDatasetImpl::State ShardedDatasetImpl::state() const {
  c10::Dict<std::string, int64_t> ints;
  ints.insert("batch_size", options_.batch_size);
  ints.insert("fetch_factor", options_.fetch_factor);
  ints.insert("drop_last", options_.drop_last);
  ints.insert("seed", seed_);
  if (options_.rank) ints.insert("rank", *options_.rank);
  if (options_.world_size) ints.insert("world_size", *options_.world_size);
  if (options_.num_threads) ints.insert("num_threads", *options_.num_threads);
  ints.insert("prefetch", options_.prefetch);
  ints.insert("prefetch_bytes", options_.prefetch_bytes);
  ints.insert("pin_memory", options_.pin_memory);
  ints.insert("next_epoch", next_epoch());
  return State{source_, strategy_, ints, options_.even_batches.value_or("none")};
}

c10::intrusive_ptr<ShardedDatasetImpl> ShardedDatasetImpl::from_state(const State& state) {
  const auto& [source, strategy, ints, even_batches] = state;
  const auto optional = [&](const char* key) {
    return ints.contains(key) ? std::optional<int64_t>(ints.at(key)) : std::nullopt;
  };
  DatasetOptions options;
  options.batch_size = ints.at("batch_size");
  options.fetch_factor = ints.at("fetch_factor");
  options.drop_last = ints.at("drop_last") != 0;
  options.even_batches = even_batches == "none" ? std::nullopt : std::optional<std::string>(even_batches);
  options.seed = ints.at("seed");
  options.rank = optional("rank");
  options.world_size = optional("world_size");
  options.num_threads = optional("num_threads");
  options.prefetch = ints.at("prefetch");
  options.prefetch_bytes = ints.at("prefetch_bytes");
  options.pin_memory = ints.at("pin_memory") != 0;
  auto dataset = c10::make_intrusive<ShardedDatasetImpl>(source, strategy, options);
  dataset->set_epoch(ints.at("next_epoch"));
  return dataset;
}

BatchIteratorImpl::BatchIteratorImpl(std::unique_ptr<EpochReader> reader, int64_t epoch, int64_t batch_size,
                                     int64_t num_batches, at::Tensor shared_state, int64_t slot)
    : reader_(std::move(reader)),
      epoch_(epoch),
      batch_size_(batch_size),
      num_batches_(num_batches),
      shared_state_(std::move(shared_state)),
      slot_(slot) {}

BatchIteratorImpl::~BatchIteratorImpl() { reader_->close(); }

void BatchIteratorImpl::cut(const Batch& unit, bool padding) {
  pending_ = split_into_batches(unit, batch_size_);
  next_pending_ = 0;
  unit_padding_ = padding;
}

std::optional<Batch> BatchIteratorImpl::next() {
  return translate_errors([&]() -> std::optional<Batch> {
    TORCH_CHECK(unit_rows_ < 0, "BatchIterator: push_unit() must follow next_unit() before next()");
    if (next_pending_ >= pending_.size()) {
      pending_.clear();
      next_pending_ = 0;
      std::optional<EpochReader::Unit> unit = reader_->next();
      if (!unit) {
        finished_ = true;
        return std::nullopt;
      }
      cut(unit->batch, unit->padding);
    }
    Batch batch = pending_[next_pending_];
    pending_[next_pending_++] = Batch();
    ++delivered_;
    last_padding_ = unit_padding_;
    if (slot_ != kNoSlot) core::count_delivery(words(shared_state_), slot_, rows_of(batch, "BatchIterator"));
    return batch;
  });
}

bool BatchIteratorImpl::wait(int64_t timeout_ms) {
  return translate_errors([&] { return next_pending_ < pending_.size() || reader_->wait(timeout_ms); });
}

std::optional<Batch> BatchIteratorImpl::poll(int64_t timeout_ms) {
  if (!wait(timeout_ms)) return std::nullopt;
  return next();
}

std::optional<Batch> BatchIteratorImpl::next_unit() {
  return translate_errors([&]() -> std::optional<Batch> {
    TORCH_CHECK(next_pending_ >= pending_.size(), "BatchIterator: next_unit() while ", pending_.size() - next_pending_,
                " batches of the previous unit are pending");
    TORCH_CHECK(unit_rows_ < 0, "BatchIterator: push_unit() must follow next_unit()");
    std::optional<EpochReader::Unit> unit = reader_->next();
    if (!unit) {
      finished_ = true;
      return std::nullopt;
    }
    unit_rows_ = rows_of(unit->batch, "BatchIterator");
    unit_padding_ = unit->padding;
    return unit->batch;
  });
}

void BatchIteratorImpl::push_unit(const Batch& unit) {
  translate_errors([&] {
    TORCH_CHECK(unit_rows_ >= 0, "BatchIterator: push_unit() without next_unit()");
    const int64_t rows = rows_of(unit, "ShardedDataset: fetch_transform's result");
    TORCH_CHECK_VALUE(rows == unit_rows_, "ShardedDataset: fetch_transform must keep the rows it is given (their ",
                      "number and order): it got ", unit_rows_, " rows and returned ", rows);
    const bool padding = unit_padding_;
    unit_rows_ = -1;
    cut(unit, padding);
  });
}

void BatchIteratorImpl::close() {
  reader_->close();
  pending_.clear();
  next_pending_ = 0;
}

bool BatchIteratorImpl::closed() const { return reader_->closed(); }

c10::Dict<std::string, int64_t> BatchIteratorImpl::stats() const {
  c10::Dict<std::string, int64_t> out = reader_->stats();
  out.insert("batches", delivered_);
  out.insert("batches_total", num_batches_);
  out.insert("epoch", epoch_);
  return out;
}

BatchIterator::BatchIterator(c10::intrusive_ptr<BatchIteratorImpl> impl) : impl_(std::move(impl)) {
  current_ = impl_->next();
  if (!current_) impl_->close();
}

BatchIterator& BatchIterator::operator++() {
  current_ = impl_->next();
  if (!current_) impl_->close();
  return *this;
}

ShardedDataset::ShardedDataset(const Source& source, const Strategy& strategy, const DatasetOptions& options)
    : Handle(c10::make_intrusive<ShardedDatasetImpl>(source.native(), strategy.native(), options)) {
  if (options.pin_memory && !impl_->pin_memory()) {
    TORCH_WARN(
        "ShardedDataset: pin_memory=true has no effect: this torch has no CUDA device, batches stay in "
        "pageable memory");
  }
}

}  // namespace torch_shards
