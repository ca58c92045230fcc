#include <torch_shards/dataset.h>

#include <ATen/Context.h>
#include <ATen/StorageUtils.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "core/epoch_layout.h"
#include "core/errors.h"
#include "core/planner.h"
#include "core/resume.h"
#include "core/shared_state.h"
#include "core/stable_hash.h"
#include "core/stream_dealing.h"
#include "io/storage/url.h"
#include "loader/batches.h"
#include "loader/buffer_pool.h"
#include "loader/dataset_door.h"
#include "loader/device_stage.h"
#include "loader/epoch_reader.h"
#include "loader/errors.h"
#include "loader/iteration.h"
#include "loader/process_group.h"
#include "loader/python_gil.h"
#include "loader/sparse_csr_warning.h"
#include "loader/state_dict_codec.h"
#include "loader/topology.h"

namespace torch_shards {
namespace {

constexpr const char* kWho = "ShardedDataset";
const std::string kResumePrefix = "resume.";  // a pickled dataset's pending checkpoint (state())
constexpr int64_t kNoSlot = -1;               // an iterator whose deliveries are not counted (iter_epoch)

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
                                       const DatasetOptions& options)
    : ShardedDatasetImpl(std::move(source), std::move(strategy), options, std::nullopt, DoorKey()) {}

ShardedDatasetImpl::ShardedDatasetImpl(c10::intrusive_ptr<SourceImpl> source, c10::intrusive_ptr<StrategyImpl> strategy,
                                       const DatasetOptions& options, const std::optional<at::Tensor>& shared_state,
                                       DoorKey)
    : source_(std::move(source)), options_(options) {
  check_seed_scope(options.process_group, options.seed, kWho);
  TORCH_CHECK_VALUE(source_, kWho, ": source is null");
  TORCH_CHECK_VALUE(strategy, kWho, ": strategy is null");
  strategy_ = strategy->resolved_for(*source_);  // labels read from the source (label_key)
  // A source may be empty (a part of a collection); a dataset over no rows is a mistake.
  TORCH_CHECK_VALUE(source_->num_rows() >= 1, kWho, ": the source has no rows (", source_->describe(),
                    "): there is nothing to iterate");
  TORCH_CHECK_VALUE(options.batch_size >= 1, kWho, ": batch_size must be >= 1, got ", options.batch_size);
  TORCH_CHECK_VALUE(options.fetch_factor >= 1, kWho, ": fetch_factor must be >= 1, got ", options.fetch_factor);
  TORCH_CHECK_VALUE(!options.num_threads || (*options.num_threads >= 1 && *options.num_threads <= kMaxThreads), kWho,
                    ": num_threads must be in [1, ", kMaxThreads, "], got ", options.num_threads.value_or(0));
  TORCH_CHECK_VALUE(!options.prefetch || (*options.prefetch >= 0 && *options.prefetch <= kMaxPrefetch), kWho,
                    ": prefetch must be in [0, ", kMaxPrefetch, "], got ", options.prefetch.value_or(0));
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
  options_.device = resolve_device(options.device, kWho, device_warning_);
  if (options_.device) options_.pin_memory = true;  // asynchronous copies need pinned host memory
  // Without CUDA there is nothing to pin for; the doors tell their users (pin_memory() is false).
  if (!at::hasCUDA()) options_.pin_memory = false;
  topology_source_ = topology.source;
  // Output memory recycled across this process's epochs and iterators (buffer_pool.h).
  buffers_ = std::make_shared<BufferPool>(options_.prefetch_bytes);
  if (shared_state) {
    // A copy in a DataLoader worker: the main process's seed (a checkpoint may have changed it).
    shared_state_ = checked_shared_state(*shared_state);
    return;
  }
  shared_state_ = new_shared_state();
  seed_fixed_ = options.seed.has_value();
  core::set_shared_seed(words(shared_state_), options.seed ? *options.seed : draw_seed());
  core::set_flag(words(shared_state_), core::kAgreedWord, seed_fixed_ || world_size_ == 1);
  // With a process group the ranks agree on the seed and check what they read, once, now.
  if (options.process_group) synchronize(options.process_group);
  options_.process_group.reset();  // loading never communicates
}

void ShardedDatasetImpl::synchronize(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  TORCH_CHECK_VALUE(group, kWho, ".synchronize: process_group is null");
  // A seed loaded from a checkpoint (here or in a DataLoader worker) is given, as one passed is.
  const bool given = seed_fixed_ || (world_size_ > 1 && core::flag(words(shared_state_), core::kAgreedWord));
  Claim claim{rank_, world_size_, seed(), given, fingerprint()};
  const int64_t agreed = agree_over_group(*group, claim, kWho);
  seed_fixed_ = true;
  core::set_shared_seed(words(shared_state_), agreed);
  core::set_flag(words(shared_state_), core::kAgreedWord, true);
  core::set_flag(words(shared_state_), core::kSynchronizedWord, true);
}

int64_t ShardedDatasetImpl::seed() const { return core::shared_seed(words(shared_state_)); }

bool ShardedDatasetImpl::synchronized() const { return core::flag(words(shared_state_), core::kSynchronizedWord); }

void ShardedDatasetImpl::check_agreed() const {
  TORCH_CHECK_VALUE(
      core::flag(words(shared_state_), core::kAgreedWord), kWho, ": the ", world_size_,
      " ranks have not agreed on a seed: with seed=None they agree over torch.distributed's process group, but none "
      "was initialised when this dataset was built (rank and world size came from ",
      topology_source_ == "environment" ? "the RANK and WORLD_SIZE environment variables" : "explicit arguments",
      ") nor when its first iteration started in the main process; each rank would shuffle its own way and rows "
      "would be read twice or never. Build the dataset after torch.distributed.init_process_group, or pass the same "
      "seed= on every rank");
}

ShardedDatasetImpl::~ShardedDatasetImpl() = default;

c10::intrusive_ptr<BatchIteratorImpl> ShardedDatasetImpl::iter() {
  // A process group initialised after this dataset was built: the ranks agree on the seed and check
  // their claims now (a single rank has nothing to agree on).
  if (world_size_ > 1 && !synchronized()) {
    if (const c10::intrusive_ptr<c10d::ProcessGroup> group = default_process_group()) synchronize(group);
  }
  check_agreed();
  raise_sparse_csr_warning_here(*source_->get());  // on this thread, not on a reader thread
  Iteration iteration;
  iteration.epoch = translate_errors([&] { return core::epoch_state_claim_main(words(shared_state_)); });
  core::set_last_workers(words(shared_state_), 0);
  core::clear_workers_restored(words(shared_state_));
  iteration.prior = prior_segments(iteration.epoch);
  return start(std::move(iteration), core::kMainSlot,
               options_.pin_memory ? sources::Memory::kPinned : sources::Memory::kPageable);
}

c10::intrusive_ptr<BatchIteratorImpl> ShardedDatasetImpl::iter_worker(int64_t worker, int64_t num_workers,
                                                                      int64_t generation_seed, bool shared_memory,
                                                                      bool recycled,
                                                                      std::optional<int64_t> stream_start) {
  TORCH_CHECK_VALUE(num_workers >= 1 && worker >= 0 && worker < num_workers, kWho,
                    ": worker must be in [0, num_workers=", num_workers, "), got ", worker);
  check_agreed();
  spend_sparse_csr_warning_silently(*source_->get());  // the training process shows it; its workers would repeat it
  Iteration iteration;
  if (worker_resume_) {
    // This worker's own state, restored in it (StatefulDataLoader): the same epoch, after what it delivered.
    TORCH_CHECK_VALUE(worker_resume_->worker == worker && worker_resume_->num_workers == num_workers, kWho,
                      ": the state loaded in DataLoader worker ", worker, " of ", num_workers, " was taken by worker ",
                      worker_resume_->worker, " of ", worker_resume_->num_workers,
                      ": a worker's own state resumes only with the same num_workers (for another topology, take "
                      "state_dict(consumed_batches=...) in the main process)");
    iteration = *worker_resume_;
    worker_resume_.reset();
    ++local_iterations_;
    translate_errors([&] { core::epoch_state_resume(words(shared_state_), iteration.epoch); });
    core::set_last_workers(words(shared_state_), num_workers);
  } else {
    iteration.epoch = translate_errors([&] {
      return core::epoch_state_claim_worker(words(shared_state_), generation_seed, local_iterations_++, num_workers,
                                            worker);
    });
    core::set_last_workers(words(shared_state_), num_workers);
    core::clear_workers_restored(words(shared_state_));
    iteration.prior = prior_segments(iteration.epoch);
  }
  TORCH_CHECK_VALUE(!stream_start || *stream_start >= 0, kWho, ": stream_start must be >= 0, got ",
                    stream_start.value_or(0));
  iteration.worker = worker;
  iteration.num_workers = num_workers;
  iteration.in_worker = true;
  iteration.stream_start = stream_start;
  const sources::Memory memory = !shared_memory ? sources::Memory::kPageable
                                 : recycled     ? sources::Memory::kSharedPooled
                                                : sources::Memory::kShared;
  return start(std::move(iteration), worker, memory);
}

c10::intrusive_ptr<BatchIteratorImpl> ShardedDatasetImpl::iter_epoch(int64_t epoch, int64_t worker,
                                                                     int64_t num_workers) {
  raise_sparse_csr_warning_here(*source_->get());
  Iteration iteration;
  iteration.epoch = epoch;
  iteration.worker = worker;
  iteration.num_workers = num_workers;
  return start(std::move(iteration), kNoSlot,
               options_.pin_memory ? sources::Memory::kPinned : sources::Memory::kPageable);
}

std::vector<core::ResumeSegment> ShardedDatasetImpl::prior_segments(int64_t epoch) {
  const std::optional<core::ResumeRecord> record = core::load_resume_record(words(shared_state_));
  if (!record || record->epoch != epoch) return {};
  return record->segments;
}

namespace {

// Reader threads of a process reading a source behind URLs, by default.
constexpr int64_t kRemoteReaderThreads = 32;

// Whether any file the source reads is a URL (s3://, http(s)://).
bool reads_urls(const sources::Source& source) {
  io::FileStamps stamps;
  source.opened_stamps(stamps);
  return std::any_of(stamps.begin(), stamps.end(), [](const auto& entry) { return io::storage::is_url(entry.first); });
}

}  // namespace

c10::intrusive_ptr<BatchIteratorImpl> ShardedDatasetImpl::start(Iteration iteration, int64_t slot,
                                                                sources::Memory memory) {
  const int64_t epoch = iteration.epoch, worker = iteration.worker, num_workers = iteration.num_workers;
  TORCH_CHECK_VALUE(epoch >= 0, kWho, ": epoch must be >= 0, got ", epoch);
  TORCH_CHECK_VALUE(num_workers >= 1 && worker >= 0 && worker < num_workers, kWho,
                    ": worker must be in [0, num_workers=", num_workers, "), got ", worker);
  iteration.rank = rank_;
  iteration.world_size = world_size_;
  ReaderOptions reader;
  // Sources behind URLs: reader threads mostly wait on round trips, and each reads its own fetch, so there
  // are more of them than CPUs: fetches in flight together hide the latency (prefetch_bytes bounds them).
  const int64_t cpu_threads = std::clamp<int64_t>(available_cpus() / num_workers, 1, kMaxThreads);
  reader.num_threads = options_.num_threads.value_or(
      reads_urls(*source_->get()) ? std::max(cpu_threads, kRemoteReaderThreads) : cpu_threads);
  // Once reads wait on no request (every object held whole in the cache: a later epoch), the CPUs'
  // share of them read, as for local files (32 threads on 2 CPUs read 20% fewer rows/s).
  if (!options_.num_threads) reader.local_threads = cpu_threads;
  if (!options_.prefetch) reader.local_prefetch = 2 * cpu_threads;
  // Two units per reader thread: small units are read one per thread and finish out of order, and
  // with one each, a thread whose unit is done waits for the slowest one to be taken (CSR at block
  // 64 on 2 threads: 10-16% more rows/s with two); the planning of large ones (whose copies all
  // threads share) overlaps. prefetch_bytes bounds them.
  reader.prefetch = options_.prefetch.value_or(2 * reader.num_threads);
  // A DataLoader worker packing units into items (take_units) reads one item ahead (unless prefetch is set).
  reader.deepen_read_ahead = !options_.prefetch;
  reader.prefetch_bytes = options_.prefetch_bytes;
  reader.memory = memory;
  reader.batch_size = options_.batch_size;
  reader.buffers = buffers_;
  reader.reads_wait = reads_wait_;
  reader.sparse_row_bytes = sparse_row_bytes_;
  // DataLoader workers hand host batches over; ts.DeviceLoader copies them in the main process.
  const bool on_device = options_.device.has_value() && !iteration.in_worker;
  auto iterator = translate_errors([&] {
    // A fresh epoch deals by the layout; a resumed one what is left (resume.h).
    auto resumption =
        std::make_shared<const core::Resumption>(planner_->layout(), iteration.prior, world_size_, num_workers);
    std::shared_ptr<const core::Dealing> dealing(resumption, &resumption->dealing());
    // Batches at the head of each worker's stream in `dealing` delivered before.
    std::vector<std::vector<int64_t>> skips(static_cast<size_t>(world_size_),
                                            std::vector<int64_t>(static_cast<size_t>(num_workers)));
    for (int64_t r = 0; r < world_size_; ++r) {
      for (int64_t w = 0; w < num_workers; ++w) skips[r][w] = resumption->skip(r, w);
    }
    if (iteration.stream_start) {
      // An endless loop: what the rank has left of the epoch, dealt as the loop takes it.
      dealing = std::make_shared<const core::StreamDealing>(
          std::make_shared<const core::RankRemainingLayout>(std::move(dealing), num_workers, skips),
          *iteration.stream_start);
      for (auto& rank_skips : skips) std::fill(rank_skips.begin(), rank_skips.end(), 0);
    }
    const auto worker_left = [&](int64_t w) {
      return dealing->worker_batches(rank_, w, num_workers) - skips[rank_][w];
    };
    const int64_t skip = skips[rank_][worker] + iteration.consumed_before;
    const int64_t batches = worker_left(worker) - iteration.consumed_before;
    core::check_argument(batches >= 0, "worker ", worker, " consumed ", iteration.consumed_before,
                         " batches but delivers only ", worker_left(worker));
    iteration.rank_batches = 0;
    for (int64_t w = 0; w < num_workers; ++w) {
      iteration.rank_batches += worker_left(w);
      iteration.worker_batches.push_back(w == worker ? batches : worker_left(w));
    }
    core::UnitCursor cursor(planner_, std::move(dealing), static_cast<uint64_t>(seed()), epoch, rank_, worker,
                            num_workers, skip);
    auto progress = std::make_shared<IterationProgress>();
    progress->iteration = std::make_shared<const Iteration>(std::move(iteration));
    if (slot != kNoSlot) current_ = progress;
    return c10::make_intrusive<BatchIteratorImpl>(
        std::make_unique<EpochReader>(source_->get(), std::move(cursor), reader), std::move(progress),
        options_.batch_size, batches, shared_state_, slot);
  });
  std::lock_guard<std::mutex> lock(iterators_mutex_);
  iterators_.erase(
      std::remove_if(iterators_.begin(), iterators_.end(), [](const auto& weak) { return weak.expired(); }),
      iterators_.end());
  iterators_.emplace_back(iterator);
  if (on_device) iterator->deliver_to(*options_.device, options_.prefetch_bytes);
  return iterator;
}

void ShardedDatasetImpl::set_epoch(int64_t epoch) {
  TORCH_CHECK_VALUE(epoch >= 0 && epoch <= core::kMaxEpoch, kWho, ": epoch must be in [0, 2**62], got ", epoch);
  translate_errors([&] {
    // Pinning another epoch than a loaded checkpoint's forgets the checkpoint; pinning its own keeps it
    // (loops that call set_epoch(epoch) every epoch resume as they should).
    const std::optional<core::ResumeRecord> record = core::load_resume_record(words(shared_state_));
    if (record && record->epoch != epoch) core::store_resume_record(words(shared_state_), std::nullopt);
    core::clear_workers_restored(words(shared_state_));
    core::epoch_state_set_next(words(shared_state_), epoch);
  });
  starting_next_.reset();  // the next epoch is decided anew: a marker of workers starting before it is stale
}

int64_t ShardedDatasetImpl::epoch() const { return core::epoch_state_last(words(shared_state_)); }

int64_t ShardedDatasetImpl::next_epoch() const { return core::epoch_state_next(words(shared_state_)); }

int64_t ShardedDatasetImpl::rank_batches_after(const std::vector<core::ResumeSegment>& prior,
                                               int64_t num_workers) const {
  return translate_errors(
      [&] { return core::Resumption(planner_->layout(), prior, world_size_, num_workers).rank_batches(rank_); });
}

int64_t ShardedDatasetImpl::num_batches() const {
  // An epoch iterated in this process: its batches (a resumed one's rest) until its iterator ends.
  const std::shared_ptr<IterationProgress> current = current_;
  if (current && current->under_way && !current->iteration->in_worker &&
      current->iteration->epoch == core::epoch_state_last(words(shared_state_))) {
    return current->iteration->rank_batches;
  }
  // The epoch the next iteration starts: a loaded checkpoint's remains, or a whole epoch.
  const std::optional<core::ResumeRecord> record = core::load_resume_record(words(shared_state_));
  if (record && record->epoch == next_epoch()) return rank_batches_after(record->segments, 1);
  return planner_->layout().rank_batches(rank_);
}

int64_t ShardedDatasetImpl::worker_batches(int64_t worker, int64_t num_workers) const {
  TORCH_CHECK_VALUE(num_workers >= 1 && worker >= 0 && worker < num_workers, kWho,
                    ": worker must be in [0, num_workers=", num_workers, "), got ", worker);
  const std::optional<core::ResumeRecord> record = core::load_resume_record(words(shared_state_));
  const std::vector<core::ResumeSegment> prior =
      record && record->epoch == next_epoch() ? record->segments : std::vector<core::ResumeSegment>{};
  return translate_errors([&] {
    return core::Resumption(planner_->layout(), prior, world_size_, num_workers).worker_batches(rank_, worker);
  });
}

int64_t ShardedDatasetImpl::plan_size() const { return planner_->layout().plan_size(); }
int64_t ShardedDatasetImpl::num_fetches() const { return planner_->layout().num_fetches(); }
int64_t ShardedDatasetImpl::num_global_batches() const { return planner_->layout().num_global_batches(); }

at::Tensor ShardedDatasetImpl::fetch_rows(int64_t epoch, int64_t fetch) const {
  TORCH_CHECK_VALUE(fetch >= 0 && fetch < num_fetches(), kWho, ": fetch must be in [0, ", num_fetches(), "), got ",
                    fetch);
  TORCH_CHECK_VALUE(epoch >= 0, kWho, ": epoch must be >= 0, got ", epoch);
  std::vector<int64_t> rows;
  planner_->fetch_rows(static_cast<uint64_t>(seed()), epoch, fetch, rows);
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
                      "\neven_batches: ", options_.even_batches.value_or("none"));
}

StateDict ShardedDatasetImpl::make_state(const Iteration& iteration, int64_t consumed) const {
  const DatasetRecord dataset{seed(),
                              rank_,
                              world_size_,
                              source_->num_rows(),
                              plan_size(),
                              options_.batch_size,
                              options_.fetch_factor,
                              options_.drop_last,
                              options_.even_batches,
                              source_->describe(),
                              strategy_->describe()};
  return encode_state(dataset, iteration, consumed);
}

StateDict ShardedDatasetImpl::state_dict(std::optional<int64_t> consumed_batches) const {
  TORCH_CHECK_VALUE(!consumed_batches || *consumed_batches >= 0, kWho,
                    ".state_dict: consumed_batches must be >= 0, got ", consumed_batches.value_or(0));
  const int64_t last = core::epoch_state_last(words(shared_state_));
  const int64_t last_workers = core::last_workers(words(shared_state_));
  if (current_ && current_->iteration->in_worker) {
    TORCH_CHECK_VALUE(!current_->iteration->stream_start, kWho,
                      ".state_dict: an endless loop (cycle=True) in DataLoader workers has no checkpoint: its workers "
                      "run into the next epoch while the loop is still in this one. Iterate in the training "
                      "process (num_workers=0) to checkpoint an endless loop, or use epochs (cycle=False)");
    return make_state(*current_->iteration, consumed_batches.value_or(current_->delivered.load()));
  }
  if (current_ && last_workers == 0 && current_->iteration->epoch == last) {
    const int64_t consumed = consumed_batches.value_or(current_->delivered.load());
    TORCH_CHECK_VALUE(consumed <= current_->iteration->rank_batches, kWho, ".state_dict: consumed_batches=", consumed,
                      " but this rank delivers ", current_->iteration->rank_batches, " batches in this epoch");
    return make_state(*current_->iteration, consumed);
  }
  if (starting_next_ && *starting_next_ == next_epoch()) {
    // Workers of a new iterator have not claimed their epoch yet: the loop has consumed none of it.
    TORCH_CHECK_VALUE(consumed_batches.value_or(0) == 0, kWho, ".state_dict: consumed_batches=", *consumed_batches,
                      " but the DataLoader's workers have not started epoch ", next_epoch(), " yet");
    return next_epoch_state();
  }
  if (last < 0 || last_workers == 0 || !consumed_batches) {
    TORCH_CHECK_VALUE(last < 0 || last_workers == 0 || consumed_batches, kWho, ".state_dict: epoch ", last, " ran in ",
                      last_workers,
                      " DataLoader worker processes, whose batches this process does not count: pass "
                      "consumed_batches (the batches your loop consumed this epoch), or use torchdata's "
                      "StatefulDataLoader, which asks the workers");
    // Nothing under way here: the state points at the next epoch (a loaded checkpoint's, if pending).
    TORCH_CHECK_VALUE(consumed_batches.value_or(0) == 0, kWho, ".state_dict: consumed_batches=", *consumed_batches,
                      " but no epoch is under way here: the state points at the start of epoch ", next_epoch(),
                      " (pass consumed_batches once the epoch's loop has started)");
    return next_epoch_state();
  }
  // The last epoch ran in DataLoader workers; the loop says how far it got.
  const std::optional<core::ResumeRecord> record = core::load_resume_record(words(shared_state_));
  Iteration iteration;
  iteration.rank = rank_;
  iteration.world_size = world_size_;
  iteration.epoch = last;
  iteration.num_workers = last_workers;
  if (record && record->epoch == last) iteration.prior = record->segments;
  iteration.rank_batches = rank_batches_after(iteration.prior, last_workers);
  // Workers that restored their own states (StatefulDataLoader) went on from where they had been: the
  // loop's count starts after the batches they had delivered.
  const int64_t restored = restored_before(iteration);
  TORCH_CHECK_VALUE(*consumed_batches <= iteration.rank_batches - restored, kWho,
                    ".state_dict: consumed_batches=", *consumed_batches, " but this rank delivers ",
                    iteration.rank_batches - restored, " batches in epoch ", last,
                    restored > 0 ? c10::str(" after the ", restored,
                                            " its DataLoader workers had delivered before "
                                            "they restored their states")
                                 : std::string());
  return make_state(iteration, restored + *consumed_batches);
}

int64_t ShardedDatasetImpl::restored_before(const Iteration& iteration) const {
  const std::optional<std::vector<int64_t>> restored =
      core::workers_restored(words(shared_state_), iteration.epoch, iteration.num_workers);
  if (!restored) return 0;
  return translate_errors([&] {
    const core::Resumption resumption(planner_->layout(), iteration.prior, world_size_, iteration.num_workers);
    std::vector<int64_t> left;
    int64_t total = 0;
    for (int64_t w = 0; w < iteration.num_workers; ++w) {
      left.push_back(resumption.worker_batches(rank_, w));
      total += (*restored)[static_cast<size_t>(w)];
    }
    // The workers' states come from one point of DataLoader's loop (torch's in-order round robin): the
    // batches each had delivered are what a loop that took `total` of them took from each.
    core::check_argument(core::split_among_workers(left, total) == *restored, "the states its ", iteration.num_workers,
                         " DataLoader workers restored (StatefulDataLoader) are not of one point of the loop "
                         "(the batches each had delivered do not follow DataLoader's order); take the state "
                         "where all of them are: dataset.state_dict(consumed_batches=...) needs in_order=True "
                         "and a snapshot at every step (snapshot_every_n_steps=1)");
    return total;
  });
}

void ShardedDatasetImpl::workers_starting() { starting_next_ = next_epoch(); }

StateDict ShardedDatasetImpl::next_epoch_state() const {
  const std::optional<core::ResumeRecord> record = core::load_resume_record(words(shared_state_));
  Iteration iteration;
  iteration.rank = rank_;
  iteration.world_size = world_size_;
  iteration.epoch = next_epoch();
  if (record && record->epoch == iteration.epoch) iteration.prior = record->segments;
  iteration.rank_batches = 1;  // nothing consumed of it here: the state is where the epoch starts (or resumes)
  return make_state(iteration, 0);
}

void ShardedDatasetImpl::load_state_dict(const StateDict& state) {
  const std::string version_problem = core::state_version_problem(state_entry(state, "version"));
  TORCH_CHECK_VALUE(version_problem.empty(), kWho, ".load_state_dict: ", version_problem);
  // What must not differ, named when it does.
  const StateDict mine = make_state(Iteration{}, 0);
  const std::pair<const char*, const char*> checks[] = {
      {"rows", "rows"},
      {"batch_size", "batch_size"},
      {"fetch_factor", "fetch_factor"},
      {"drop_last", "drop_last"},
      {"even_batches", "even_batches (0: 'pad', 1: 'drop', 2: None)"},
      {"plan_size", "plan entries per epoch (the strategy's total_size or indices)"},
  };
  for (const auto& [key, what] : checks) {
    TORCH_CHECK_VALUE(state_entry(state, key) == mine.at(key), kWho,
                      ".load_state_dict: the state was taken on another dataset: its ", what, " is ",
                      state_entry(state, key), ", this dataset's is ", mine.at(key));
  }
  TORCH_CHECK_VALUE(state_entry(state, "strategy_hash") == mine.at("strategy_hash"), kWho,
                    ".load_state_dict: the state was taken with another strategy (or other strategy parameters) than "
                    "this dataset's ",
                    strategy_->describe());
  TORCH_CHECK_VALUE(state_entry(state, "source_hash") == mine.at("source_hash"), kWho,
                    ".load_state_dict: the state was taken on another source (other files, file sizes, fields or "
                    "shapes) than this dataset's ",
                    source_->describe());
  const int64_t epoch = state_entry(state, "epoch");
  TORCH_CHECK_VALUE(epoch >= 0, kWho, ".load_state_dict: epoch must be >= 0, got ", epoch);
  const int64_t taken_world_size = state_entry(state, "world_size"), taken_rank = state_entry(state, "rank");
  TORCH_CHECK_VALUE(taken_world_size >= 1 && taken_world_size <= core::kMaxWorldSize && taken_rank >= 0 &&
                        taken_rank < taken_world_size,
                    kWho, ".load_state_dict: the state was taken on rank ", taken_rank, " of world_size ",
                    taken_world_size,
                    " (rank must be in [0, world_size), world_size in [1, 2**20]): is it a damaged state?");
  std::vector<core::ResumeSegment> segments = state_segments(state);
  const int64_t worker = state_entry(state, "worker");
  const int64_t seed = state_entry(state, "seed");
  if (worker >= 0) {
    // A DataLoader worker's own state (StatefulDataLoader restores it in that worker).
    Iteration iteration;
    iteration.epoch = epoch;
    iteration.worker = worker;
    iteration.num_workers = state_entry(state, "num_workers");
    iteration.prior = std::move(segments);
    iteration.consumed_before = state_entry(state, "worker_consumed");
    TORCH_CHECK_VALUE(state_entry(state, "world_size") == world_size_ && state_entry(state, "rank") == rank_, kWho,
                      ".load_state_dict: a DataLoader worker's state of rank ", state_entry(state, "rank"), " of ",
                      state_entry(state, "world_size"), " cannot resume rank ", rank_, " of ", world_size_,
                      " (StatefulDataLoader's worker states resume on the same ranks and num_workers; on another "
                      "topology, checkpoint the dataset instead: dataset.state_dict(consumed_batches=step))");
    TORCH_CHECK_VALUE(worker < iteration.num_workers && iteration.consumed_before >= 0, kWho,
                      ".load_state_dict: worker ", worker, " of ", iteration.num_workers, " with ",
                      iteration.consumed_before, " batches consumed is not a worker's state");
    const int64_t left = translate_errors([&] {
      const core::Resumption resumption(planner_->layout(), iteration.prior, world_size_, iteration.num_workers);
      iteration.prior = resumption.compacted_segments();
      return resumption.worker_batches(rank_, worker);
    });
    TORCH_CHECK_VALUE(iteration.consumed_before <= left, kWho, ".load_state_dict: worker ", worker, " consumed ",
                      iteration.consumed_before, " batches but delivers only ", left);
    seed_fixed_ = true;
    translate_errors([&] {
      core::set_shared_seed(words(shared_state_), seed);
      core::set_flag(words(shared_state_), core::kAgreedWord, true);
      // What the main process needs to checkpoint the resumed epoch (state_dict(consumed_batches=...)
      // there): its segments (the same in every worker's state: the first worker writes them) and where
      // each worker resumed.
      if (worker == 0) {
        core::store_resume_record(words(shared_state_),
                                  iteration.prior.empty()
                                      ? std::nullopt
                                      : std::optional<core::ResumeRecord>(core::ResumeRecord{epoch, iteration.prior}));
      }
      core::record_worker_restored(words(shared_state_), epoch, iteration.num_workers, worker,
                                   iteration.consumed_before);
    });
    worker_resume_ = std::make_shared<const Iteration>(std::move(iteration));
    return;
  }
  // Checked now, not at the next iteration: consumption that does not fit the epoch raises here.
  // Kept compacted (each interruption adds a segment; they share a bounded region with the workers).
  segments = translate_errors(
      [&] { return core::Resumption(planner_->layout(), segments, world_size_, 1).compacted_segments(); });
  seed_fixed_ = true;
  translate_errors([&] {
    core::clear_workers_restored(words(shared_state_));
    core::set_shared_seed(words(shared_state_), seed);
    core::set_flag(words(shared_state_), core::kAgreedWord, true);
    core::store_resume_record(
        words(shared_state_),
        segments.empty() ? std::nullopt : std::optional<core::ResumeRecord>(core::ResumeRecord{epoch, segments}));
    core::epoch_state_set_next(words(shared_state_), epoch);
  });
  starting_next_.reset();
}

StateDict ShardedDatasetImpl::merge_state_dicts(const std::vector<StateDict>& states) { return merge_states(states); }

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
  ints.insert("seed", seed());
  if (options_.rank) ints.insert("rank", *options_.rank);
  if (options_.world_size) ints.insert("world_size", *options_.world_size);
  if (options_.num_threads) ints.insert("num_threads", *options_.num_threads);
  if (options_.prefetch) ints.insert("prefetch", *options_.prefetch);
  ints.insert("prefetch_bytes", options_.prefetch_bytes);
  ints.insert("pin_memory", options_.pin_memory);
  if (options_.device) ints.insert("device_index", options_.device->index());  // a CUDA device
  ints.insert("next_epoch", next_epoch());
  // A loaded checkpoint not yet resumed travels too (as "resume.<key>"): the copy resumes it, as this would.
  const std::optional<core::ResumeRecord> record = core::load_resume_record(words(shared_state_));
  if (record && record->epoch == next_epoch()) {
    for (const auto& item : next_epoch_state()) ints.insert(kResumePrefix + item.key(), item.value());
  }
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
  options.prefetch = optional("prefetch");
  options.prefetch_bytes = ints.at("prefetch_bytes");
  options.pin_memory = ints.at("pin_memory") != 0;
  if (ints.contains("device_index")) {
    options.device = c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(ints.at("device_index")));
  }
  auto dataset = c10::make_intrusive<ShardedDatasetImpl>(source, strategy, options);
  dataset->set_epoch(ints.at("next_epoch"));
  StateDict resume;
  for (const auto& item : ints) {
    if (item.key().rfind(kResumePrefix, 0) == 0) resume.insert(item.key().substr(kResumePrefix.size()), item.value());
  }
  if (!resume.empty()) dataset->load_state_dict(resume);
  return dataset;
}

BatchIteratorImpl::BatchIteratorImpl(std::unique_ptr<EpochReader> reader, std::shared_ptr<IterationProgress> progress,
                                     int64_t batch_size, int64_t num_batches, at::Tensor shared_state, int64_t slot)
    : reader_(std::move(reader)),
      progress_(std::move(progress)),
      epoch_(progress_->iteration->epoch),
      batch_size_(batch_size),
      num_batches_(num_batches),
      shared_state_(std::move(shared_state)),
      slot_(slot) {}

BatchIteratorImpl::~BatchIteratorImpl() {
  progress_->under_way = false;
  reader_->close();
}

void BatchIteratorImpl::deliver_to(c10::Device device, int64_t staging_bytes) {
  device_stage_ = translate_errors([&] { return std::make_unique<DeviceStage>(device, staging_bytes); });
}

const Iteration& BatchIteratorImpl::iteration() const { return *progress_->iteration; }

int64_t BatchIteratorImpl::rank_batches() const { return progress_->iteration->rank_batches; }

void BatchIteratorImpl::start_unit(Batch unit, Batch offsets, bool padding) {
  current_rows_ = rows_of(unit, "BatchIterator");
  current_batches_ = (current_rows_ + batch_size_ - 1) / batch_size_;
  current_ = std::move(unit);
  current_offsets_ = std::move(offsets);
  pending_.clear();
  next_pending_ = 0;
  unit_padding_ = padding;
}

bool BatchIteratorImpl::refill() {
  if (next_pending_ < current_batches_) return true;
  current_ = Batch();
  current_offsets_ = Batch();
  current_batches_ = next_pending_ = 0;
  pending_.clear();
  std::optional<EpochReader::Unit> unit = reader_->next();
  if (!unit) {
    finished_ = true;
    progress_->under_way = false;
    return false;
  }
  start_unit(std::move(unit->batch), std::move(unit->batch_offsets), unit->padding);
  return true;
}

void BatchIteratorImpl::count_delivered(int64_t rows) {
  ++next_pending_;
  ++delivered_;
  ++progress_->delivered;
  last_padding_ = unit_padding_;
  if (slot_ != kNoSlot) core::count_delivery(words(shared_state_), slot_, rows);
}

Batch BatchIteratorImpl::deliver() {
  // Cut here, not by the reader threads: a batch's tensor objects are then
  // allocated by the thread that, mostly, frees them. Made on a reader
  // thread and freed on this one, they crossed malloc's per-thread arenas,
  // whose locks then put the threads to sleep (a fifth of the context
  // switches at block 64 on annbatch's collection).
  if (pending_.empty()) pending_ = split_into_batches(current_, batch_size_, current_offsets_);
  Batch batch = pending_[static_cast<size_t>(next_pending_)];
  pending_[static_cast<size_t>(next_pending_)] = delivered_slot_;  // lets go of its tensors (Dicts share when copied)
  count_delivered(rows_of(batch, "BatchIterator"));
  return batch;
}

std::optional<Batch> BatchIteratorImpl::next() {
  return translate_errors([&]() -> std::optional<Batch> {
    TORCH_CHECK(unit_rows_ < 0, "BatchIterator: push_unit() must follow next_unit() before next()");
    if (!refill()) return std::nullopt;
    Batch batch = deliver();
    if (device_stage_) return device_stage_->deliver(batch);
    return batch;
  });
}

bool BatchIteratorImpl::has_next() {
  return translate_errors([&] {
    TORCH_CHECK(unit_rows_ < 0, "BatchIterator: push_unit() must follow next_unit() before next()");
    return refill();
  });
}

bool BatchIteratorImpl::wait(int64_t timeout_ms) {
  return translate_errors([&] { return pending() > 0 || reader_->wait(timeout_ms); });
}

std::optional<Batch> BatchIteratorImpl::poll(int64_t timeout_ms) {
  if (!wait(timeout_ms)) return std::nullopt;
  return next();
}

std::vector<UnitCut> BatchIteratorImpl::take_units(int64_t timeout_ms, int64_t max_bytes) {
  TORCH_CHECK(unit_rows_ < 0, "BatchIterator: push_unit() must follow next_unit() before take_units()");
  TORCH_CHECK(!device_stage_, "BatchIterator: take_units() hands host batches to another process");
  if (deferred_error_) {
    translate_errors([&] { std::rethrow_exception(std::exchange(deferred_error_, nullptr)); });
  }
  std::vector<UnitCut> out;
  // The readers read the next item while this one crosses (its packing, torch's queue, the main
  // process asking for the next one), rather than stopping at `prefetch` units until it is back: one
  // worker of TensorSource at batch 256 read 0.82-0.85 of in-process rather than 0.74-0.79.
  reader_->read_ahead(max_bytes);
  if (!wait(timeout_ms)) return out;
  translate_errors([&] {
    if (!refill()) return;
    int64_t bytes = 0;
    while (true) {
      if (next_pending_ == 0) {  // whole: counted batch by batch, cut where it is received
        bytes += batch_bytes(current_);
        for (int64_t first = 0; first < current_rows_; first += batch_size_) {
          count_delivered(std::min(batch_size_, current_rows_ - first));
        }
        out.push_back(UnitCut{std::exchange(current_, Batch()), batch_size_, std::exchange(current_offsets_, Batch())});
      } else {  // the rest of a unit next() began
        while (next_pending_ < current_batches_) {
          out.push_back(UnitCut{deliver(), 0, Batch()});
          bytes += batch_bytes(out.back().unit);
        }
      }
      // Units until they fill max_bytes: each item sent costs torch's worker loop, queue and pickling
      // ~0.5 ms of CPU, small beside that many bytes' batches.
      if (bytes >= max_bytes) return;
      try {
        if (next_pending_ == current_batches_) reader_->wait_for_bytes(max_bytes - bytes);  // one wake, not one a unit
        if (!refill()) return;
      } catch (...) {
        deferred_error_ = std::current_exception();  // the units taken go first
        return;
      }
    }
  });
  return out;
}

const std::vector<int64_t>& BatchIteratorImpl::worker_batches() const { return progress_->iteration->worker_batches; }

std::optional<Batch> BatchIteratorImpl::next_unit() {
  return translate_errors([&]() -> std::optional<Batch> {
    TORCH_CHECK(pending() == 0, "BatchIterator: next_unit() while ", pending(),
                " batches of the previous unit are pending");
    TORCH_CHECK(unit_rows_ < 0, "BatchIterator: push_unit() must follow next_unit()");
    std::optional<EpochReader::Unit> unit = reader_->next();
    if (!unit) {
      finished_ = true;
      progress_->under_way = false;
      return std::nullopt;
    }
    // A unit larger than prefetch_bytes arrives in pieces: the transform sees it whole.
    std::vector<Batch> pieces{unit->batch};
    for (bool last = unit->last; !last;) {
      std::optional<EpochReader::Unit> piece = reader_->next();
      TORCH_INTERNAL_ASSERT(piece, "BatchIterator: the epoch ended inside a unit");
      pieces.push_back(piece->batch);
      last = piece->last;
    }
    Batch whole = concat_batches(pieces);
    unit_rows_ = rows_of(whole, "BatchIterator");
    unit_index_ = whole.at("index");
    unit_padding_ = unit->padding;
    return whole;
  });
}

void BatchIteratorImpl::push_unit(const Batch& unit) {
  translate_errors([&] {
    TORCH_CHECK(unit_rows_ >= 0, "BatchIterator: push_unit() without next_unit()");
    const char* const who = "ShardedDataset: fetch_transform's result";
    const int64_t rows = rows_of(unit, who);
    for (const auto& item : unit) {  // what batches are cut from: dense or CSR
      const at::Tensor& tensor = item.value();
      TORCH_CHECK_VALUE(!tensor.is_nested() && (tensor.layout() == at::kStrided || tensor.layout() == at::kSparseCsr),
                        who, ": field '", item.key(), "' must be a dense (strided) or sparse CSR tensor, got ",
                        tensor.is_nested() ? "a nested tensor" : c10::str("layout ", tensor.layout()));
    }
    TORCH_CHECK_VALUE(rows == unit_rows_, "ShardedDataset: fetch_transform must keep the rows it is given (their ",
                      "number and order): it got ", unit_rows_, " rows and returned ", rows);
    // Their order too, as far as it shows: the rows' indices, which every batch carries, come back as given,
    // or are put back where the transform left them out (scDataset's transforms return only their data).
    Batch kept = unit;
    const auto index = unit.find("index");
    if (index == unit.end()) {
      kept = unit.copy();
      kept.insert("index", unit_index_);
    } else {
      const at::Tensor& returned = index->value();
      TORCH_CHECK_VALUE(
          returned.is_same(unit_index_) ||
              (returned.sizes() == unit_index_.sizes() && returned.scalar_type() == unit_index_.scalar_type() &&
               returned.device().is_cpu() && at::equal(returned, unit_index_)),
          "ShardedDataset: fetch_transform must keep the rows it is given in their order, and their ",
          "'index' as it is: the 'index' it returned differs from the unit's");
    }
    unit_index_ = at::Tensor();
    const bool padding = unit_padding_;
    unit_rows_ = -1;
    start_unit(with_views_resolved(kept), Batch(), padding);  // a worker's batches cross as their memory
  });
}

void BatchIteratorImpl::close() {
  progress_->under_way = false;
  reader_->close();
  current_ = Batch();
  current_offsets_ = Batch();
  pending_.clear();
  current_batches_ = next_pending_ = 0;
}

bool BatchIteratorImpl::closed() const { return reader_->closed(); }

c10::Dict<std::string, int64_t> BatchIteratorImpl::stats() const {
  c10::Dict<std::string, int64_t> out = reader_->stats();
  out.insert("batches", delivered_);
  out.insert("batches_total", num_batches_);
  out.insert("epoch", epoch_);
  return out;
}

bool BatchIterator::at_end() const {
  if (!impl_ || ended_) return true;
  if (current_) return false;
  if (impl_->has_next()) return false;
  ended_ = true;
  impl_->close();
  return true;
}

const Batch& BatchIterator::take() const {
  if (!current_) {
    TORCH_CHECK(!at_end(), "BatchIterator: dereferenced at the end of the epoch");
    current_ = impl_->next();
  }
  return *current_;
}

BatchIterator& BatchIterator::operator++() {
  TORCH_CHECK(!at_end(), "BatchIterator: incremented at the end of the epoch");
  take();  // a batch passed over without being looked at is taken too
  current_.reset();
  return *this;
}

ShardedDataset::ShardedDataset(const Source& source, const Strategy& strategy, const DatasetOptions& options)
    : Handle(c10::make_intrusive<ShardedDatasetImpl>(source.native(), strategy.native(), options)) {
  if (options.pin_memory && !impl_->pin_memory()) {
    TORCH_WARN(
        "ShardedDataset: pin_memory=true has no effect: this torch has no CUDA device, batches stay in "
        "pageable memory");
  }
  const std::string& device_warning = DatasetDoor::device_warning(*impl_);
  if (!device_warning.empty()) TORCH_WARN(device_warning);
}

}  // namespace torch_shards
