// ShardedDataset: batches of a source's rows in the order a strategy plans,
// each rank and DataLoader worker delivering its own share exactly once per
// epoch. This is the iteration protocol of every door (Python, TorchScript,
// C++): epochs, rank / world size / seed, the split among DataLoader workers,
// batching and read-ahead are decided here.
//
//   torch_shards::ShardedDataset dataset(source, torch_shards::BlockShuffling(64), {.batch_size = 256});
//   for (int epoch = 0; epoch < 3; ++epoch)
//     for (const auto& batch : dataset) { /* batch.at("X"), batch.at("index") */ }
//
// Every range-for (every iter()) starts the next epoch; set_epoch(e) pins the
// next one and counting continues from it.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <atomic>
#include <cstdint>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <torch_shards/export.h>
#include <torch_shards/handle.h>
#include <torch_shards/source.h>
#include <torch_shards/strategy.h>

namespace torch_shards {

class DeviceStage;  // loader/device_stage.h

namespace sources {
enum class Memory;  // loader/tensor_pool.h
}  // namespace sources
namespace core {
class Planner;
struct ResumeSegment;
}  // namespace core
class BufferPool;
class EpochReader;
class BatchIteratorImpl;
struct UnitCut;      // loader/batches.h
struct DatasetDoor;  // loader/dataset_door.h
struct Iteration;
struct IterationProgress;

// A checkpoint of a dataset's position (state_dict / load_state_dict): a few
// integers, whatever the number of rows. Keys: version, epoch, seed; the
// topology it was taken on (rank, world_size, num_workers; worker and
// worker_consumed for a DataLoader worker's own state, else -1 and 0); the
// segments the epoch ran on so far (segments, then segment.<i>.world_size,
// .num_workers and .consumed, or .consumed.<rank> for ranks not in lockstep);
// and what must not change for it to apply (rows, plan_size, batch_size,
// fetch_factor, drop_last, even_batches, source_hash, strategy_hash).
using StateDict = c10::Dict<std::string, int64_t>;

// The arguments of ShardedDataset, with the Python door's names and defaults.
// The most units a reader reads ahead: more never helps, and the slots a
// larger value reserves fail late and unclearly.
inline constexpr int64_t kMaxPrefetch = 1024;

struct DatasetOptions {
  int64_t batch_size = 0;     // rows per batch (required, >= 1)
  int64_t fetch_factor = 16;  // batches read together, then permuted across those batches
  bool drop_last = false;     // drop the epoch's single short batch
  // "pad": short ranks repeat one batch; "drop": long ranks drop one; nullopt: uneven.
  std::optional<std::string> even_batches = "pad";
  // nullopt: drawn (rank 0's, broadcast over process_group when there is one). Required with a
  // process_group that is a part of the job (fewer processes than torch.distributed's default group, or
  // than WORLD_SIZE): c10::ValueError otherwise, as such groups would each agree on their own seed.
  std::optional<int64_t> seed{};
  // Explicit, else from process_group, else the RANK / WORLD_SIZE environment variables, else 0 and 1
  // (a world_size above 1 with no rank from any of them is refused).
  std::optional<int64_t> rank{};
  std::optional<int64_t> world_size{};
  // The group of the ranks: seed agreement and the consistency check run over it, once.
  c10::intrusive_ptr<c10d::ProcessGroup> process_group{};
  // Native threads reading in this process (default: its CPUs shared among the DataLoader workers).
  std::optional<int64_t> num_threads{};
  // Units read ahead (nullopt: two per reader thread, so every thread has a unit to read while
  // finished ones wait their turn; prefetch_bytes bounds them); 0 reads on demand.
  std::optional<int64_t> prefetch{};
  int64_t prefetch_bytes = int64_t{1} << 30;  // queued bytes beyond which no new unit starts
  bool pin_memory = false;                    // batches in recycled pinned host memory (needs CUDA)
  // nullopt: batches stay on the host; a CUDA device ("cuda": the current one):
  // assembled in pinned memory, copied on a side stream, fenced for the
  // current stream (device_stage.h). In-process iteration only.
  std::optional<c10::Device> device{};
};

// torch.classes.torch_shards.ShardedDataset.
class TORCH_SHARDS_API ShardedDatasetImpl : public torch::CustomClassHolder {
 public:
  // The batches of `source` in the order `strategy` plans, with `options` (DatasetOptions):
  // c10::ValueError for a bad option, or, with a process group, for ranks that disagree.
  ShardedDatasetImpl(c10::intrusive_ptr<SourceImpl> source, c10::intrusive_ptr<StrategyImpl> strategy,
                     const DatasetOptions& options);
  // For the doors only (DatasetDoor::make, loader/dataset_door.h: DoorKey cannot be made elsewhere).
  class DoorKey {
    friend struct DatasetDoor;
    friend class ShardedDatasetImpl;
    DoorKey() = default;
  };
  // A copy that shares `shared_state` (the epoch counter and delivery counters of the dataset in the
  // process that made it), as the doors rebuild it in a DataLoader worker; nullopt: a new one.
  ShardedDatasetImpl(c10::intrusive_ptr<SourceImpl> source, c10::intrusive_ptr<StrategyImpl> strategy,
                     const DatasetOptions& options, const std::optional<at::Tensor>& shared_state, DoorKey);
  ~ShardedDatasetImpl() override;

  // Starts the next epoch in the process that trains (num_workers=0, C++, TorchScript). Ranks that
  // have not agreed on a seed yet (seed=None, no process group when the dataset was built) agree now over
  // torch.distributed's default process group if one was initialised since, else c10::ValueError.
  c10::intrusive_ptr<BatchIteratorImpl> iter();
  // One worker's share of a given epoch, leaving the epoch counter alone (inspection, tests).
  c10::intrusive_ptr<BatchIteratorImpl> iter_epoch(int64_t epoch, int64_t worker, int64_t num_workers);

  // Pins the epoch of the next iteration; later ones count on from it.
  void set_epoch(int64_t epoch);
  // The most recently started epoch (-1 before the first).
  int64_t epoch() const;
  // The epoch the next iteration starts.
  int64_t next_epoch() const;

  // Batches this rank delivers per epoch, all workers together (exact).
  int64_t num_batches() const;
  // Batches DataLoader worker `worker` of `num_workers` delivers in the next epoch (c10::ValueError for a
  // worker outside [0, num_workers)).
  int64_t worker_batches(int64_t worker, int64_t num_workers) const;
  // The seed every process reading this dataset uses: the one given, agreed over the group, or loaded from
  // a checkpoint (in this process, or in a DataLoader worker: StatefulDataLoader restores states there).
  int64_t seed() const;
  // The options as resolved (rank and world size from the group or the environment when not given).
  // @{
  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_size_; }
  int64_t batch_size() const { return options_.batch_size; }
  int64_t fetch_factor() const { return options_.fetch_factor; }
  bool drop_last() const { return options_.drop_last; }
  std::optional<std::string> even_batches() const { return options_.even_batches; }
  // @}
  // Whether batches are assembled in pinned memory (false without CUDA, whatever was asked).
  bool pin_memory() const { return options_.pin_memory; }
  // The device batches are delivered on (in-process iteration), or nullopt: the host.
  std::optional<c10::Device> device() const { return options_.device; }
  // An epoch's layout: its plan entries, its fetches and its batches (all ranks together).
  // @{
  int64_t plan_size() const;
  int64_t num_fetches() const;
  int64_t num_global_batches() const;
  // @}
  // Rows of fetch f of an epoch, in delivery order.
  at::Tensor fetch_rows(int64_t epoch, int64_t fetch) const;
  // The source read.
  const c10::intrusive_ptr<SourceImpl>& source() const { return source_; }
  // The strategy planning the epochs (label_key resolved against the source).
  const c10::intrusive_ptr<StrategyImpl>& strategy() const { return strategy_; }

  // The dataset, its source, strategy and options, as Python's repr() shows it.
  std::string describe() const;
  // What this rank reads and how, one "key: value" line per property that must agree across ranks.
  std::string fingerprint() const;

  // [DataLoader workers + 1, 2]: batches and rows delivered by each worker, then by the main process.
  at::Tensor delivery_counts() const;
  // Counters of this process's unfinished iterations, one dict each.
  std::vector<c10::Dict<std::string, int64_t>> reader_stats() const;

  // A checkpoint of where this rank stands (StateDict above). In the process
  // iterating in place, the batches its loop consumed are counted; when
  // DataLoader workers ran the epoch, pass consumed_batches (the batches the
  // loop consumed this epoch); inside a DataLoader worker (torchdata's
  // StatefulDataLoader asks there) it is that worker's own state.
  StateDict state_dict(std::optional<int64_t> consumed_batches = std::nullopt) const;
  // Resumes from a checkpoint, on this dataset's topology (any number of
  // ranks and workers): the next iteration delivers every global batch of
  // the epoch not consumed yet, exactly once across the ranks, then epochs
  // go on as usual. The dataset takes the checkpoint's seed. Throws
  // c10::ValueError naming what differs if the checkpoint was taken on other
  // data, another strategy or other batch arguments.
  void load_state_dict(const StateDict& state);
  // The per-rank checkpoints of ranks that do not step in lockstep
  // (even_batches=None) merged into one.
  static StateDict merge_state_dicts(const std::vector<StateDict>& states);

 private:
  // The Python and TorchScript doors' plumbing, reached through DatasetDoor (loader/dataset_door.h).
  friend struct DatasetDoor;
  // Starts the epoch of a DataLoader worker's generation: the first worker of
  // a DataLoader iteration claims the next epoch and the others join it.
  // generation_seed: DataLoader's base seed of that iteration (worker seed - id);
  // shared_memory: assemble batches in shared memory sent without a copy;
  // recycled: in slabs recycled under the main process's leases, for a
  // worker whose batches cross as handles (the Python door's transfer);
  // stream_start: in an endless loop (cycle=True), the batches the loop took
  // (all workers together) before this epoch: the epoch's batches are then
  // dealt to the workers so that DataLoader's round robin takes them as one
  // run of the loop (core/stream_dealing.h). None: one epoch per loop.
  c10::intrusive_ptr<BatchIteratorImpl> iter_worker(int64_t worker, int64_t num_workers, int64_t generation_seed,
                                                    bool shared_memory, bool recycled = false,
                                                    std::optional<int64_t> stream_start = std::nullopt);
  // The LOCAL_RANK cross-check's warning for that device, or empty: each door warns its own way.
  const std::string& device_warning() const { return device_warning_; }
  // Every process of the group says which rank it reads (of which world size) and what; the
  // claims are checked (same world size, every rank read by as many processes, the same data and
  // arguments, the same seed given) and, with seed=None, the group's first process's seed is
  // taken: c10::ValueError on every process otherwise. Done at construction when a process group
  // is given; iter() does it at the first iteration when a group appeared since.
  void synchronize(const c10::intrusive_ptr<c10d::ProcessGroup>& group);
  // Whether synchronize() ran (here, or in the process whose state this copy shares).
  bool synchronized() const;
  // Where rank and world size came from: "explicit", "group", "environment" or "default".
  const std::string& topology_source() const { return topology_source_; }
  // The words shared with DataLoader workers' copies (the constructor taking a DoorKey: the Python door hands the
  // main process's to the copies it rebuilds in worker processes).
  const at::Tensor& shared_state() const { return shared_state_; }
  // A DataLoader iterator is starting workers over this dataset (ts.DataLoader
  // says so): until one of them claims its epoch, a state taken here is the
  // start of the next epoch, not the last one's (which the loop finished).
  void workers_starting();
  // Pickling (TorchScript): the source, the strategy, the arguments (the
  // seed as resolved; rank and world size only if given explicitly), the
  // next epoch and a loaded checkpoint not yet resumed (the copy resumes it).
  using State = std::tuple<c10::intrusive_ptr<SourceImpl>, c10::intrusive_ptr<StrategyImpl>,
                           c10::Dict<std::string, int64_t>, std::string>;
  // This dataset's State.
  State state() const;
  // A dataset rebuilt from a State (without a process group).
  static c10::intrusive_ptr<ShardedDatasetImpl> from_state(const State& state);

  c10::intrusive_ptr<BatchIteratorImpl> start(Iteration iteration, int64_t slot, sources::Memory memory);
  // Throws c10::ValueError unless the ranks agree on the seed (a single rank always does).
  void check_agreed() const;
  // The segments `epoch` ran before, if the shared resume record is for it (and its seed, taken on).
  std::vector<core::ResumeSegment> prior_segments(int64_t epoch);
  StateDict make_state(const Iteration& iteration, int64_t consumed) const;
  // The state at the start of the next epoch (a loaded checkpoint's position, if it is that epoch's).
  StateDict next_epoch_state() const;
  int64_t rank_batches_after(const std::vector<core::ResumeSegment>& prior, int64_t num_workers) const;
  // The batches the rank had consumed of `iteration` before its DataLoader workers restored their own
  // states (StatefulDataLoader), or 0 if they did not.
  int64_t restored_before(const Iteration& iteration) const;

  c10::intrusive_ptr<SourceImpl> source_;
  c10::intrusive_ptr<StrategyImpl> strategy_;
  DatasetOptions options_;   // as given (process_group dropped after construction)
  bool seed_fixed_ = false;  // given, agreed over a group, or from a checkpoint: not this process's own draw
  int64_t rank_ = 0;
  int64_t world_size_ = 1;
  std::string topology_source_;
  std::string device_warning_;
  std::optional<int64_t> starting_next_;  // the next epoch when workers_starting() was called (set_epoch and
                                          // load_state_dict forget it)
  std::shared_ptr<const core::Planner> planner_;
  at::Tensor shared_state_;
  int64_t local_iterations_ = 0;  // worker iterations started by this process's copy
  mutable std::mutex iterators_mutex_;
  mutable std::vector<c10::weak_intrusive_ptr<BatchIteratorImpl>> iterators_;
  // The iteration started last in this process (not by iter_epoch), for state_dict.
  std::shared_ptr<IterationProgress> current_;
  // A DataLoader worker's own state, loaded in that worker (StatefulDataLoader): its next iteration resumes it.
  std::shared_ptr<const Iteration> worker_resume_;
  // Output memory recycled across this process's iterations (a copy rebuilt in a worker makes its own).
  std::shared_ptr<BufferPool> buffers_;
  // Whether the reads of this process's last iteration waited on requests when it ended (ReaderOptions).
  std::shared_ptr<std::atomic<bool>> reads_wait_ = std::make_shared<std::atomic<bool>>(true);
  // Output bytes a row of the sparse fields took as this process's last iteration read them (ReaderOptions).
  std::shared_ptr<std::atomic<int64_t>> sparse_row_bytes_ = std::make_shared<std::atomic<int64_t>>(0);
};

// torch.classes.torch_shards.BatchIterator: one epoch of one rank's (or
// DataLoader worker's) batches. Reader threads start at the first batch,
// never before, and are joined by close() or when the iterator goes (their
// threads then wait, idle, for the process's next reads: 30 s, then they exit;
// TORCH_SHARDS_KEEP_THREADS=0 has them exit at once).
class TORCH_SHARDS_API BatchIteratorImpl : public torch::CustomClassHolder {
 public:
  // Made by ShardedDatasetImpl.
  BatchIteratorImpl(std::unique_ptr<EpochReader> reader, std::shared_ptr<IterationProgress> progress,
                    int64_t batch_size, int64_t num_batches, at::Tensor shared_state, int64_t slot);
  ~BatchIteratorImpl() override;

  // The next batch, or nullopt at the end of the epoch.
  std::optional<Batch> next();
  // Whether next() has a batch to return (waits until it is read, or the epoch ends), without taking it.
  bool has_next();
  // Whether next() reached the end of the epoch.
  bool finished() const { return finished_; }
  // For a per-unit (fetch) transform: the next unit of rows read at once, or
  // nullopt at the end. Only when no batch of the previous unit is pending.
  // A unit larger than prefetch_bytes, read in pieces, is joined here.
  std::optional<Batch> next_unit();
  // The transformed unit: must keep its rows (count and order); cut into the
  // batches next() returns.
  void push_unit(const Batch& unit);
  // Batches of the current unit not delivered yet.
  int64_t pending() const { return current_batches_ - next_pending_; }
  // Stops the reader threads; later reads raise. Idempotent.
  void close();
  // Delivers every later batch on `device`, copied on a side stream (the dataset's device option);
  // batches not in pinned memory are staged through pinned buffers, at most `staging_bytes` in flight
  // (the dataset's prefetch_bytes).
  void deliver_to(c10::Device device, int64_t staging_bytes);

  // The epoch this iterator delivers.
  int64_t epoch() const { return epoch_; }
  // Batches this iterator delivers in all, and those delivered so far.
  // @{
  int64_t num_batches() const { return num_batches_; }
  int64_t batches_delivered() const { return delivered_; }
  // @}
  // Batches the rank delivers in this iteration, all its DataLoader workers together.
  int64_t rank_batches() const;
  // Whether the last batch repeats one another rank delivers (even_batches="pad").
  bool last_was_padding() const { return last_padding_; }
  // Whether close() ran: later reads raise.
  bool closed() const;
  // units, rows and bytes delivered, queue_depth, in_flight, wait_us, read_us, threads, thread<k>_units,
  // row_bytes_estimate (the output bytes a row is taken to cost when pieces are admitted under prefetch_bytes).
  c10::Dict<std::string, int64_t> stats() const;

 private:
  // The Python and TorchScript doors' plumbing, reached through DatasetDoor (loader/dataset_door.h).
  friend struct DatasetDoor;
  // Waits at most timeout_ms; true once next() will not block (a batch, the end, or an error is ready).
  bool wait(int64_t timeout_ms);
  // The next batch if one is ready within timeout_ms, else nullopt: the end
  // of the epoch (finished() is then true) or not ready yet. One call per
  // batch for doors that must wake up now and then (Ctrl-C in Python).
  std::optional<Batch> poll(int64_t timeout_ms);
  // For a DataLoader worker sending many batches at once: waits at most
  // timeout_ms for the next batch, then takes the rest of its unit and the
  // next units (waiting for them) until they hold max_bytes or the epoch
  // ends, every batch counted as delivered. A unit none of whose batches was
  // taken comes whole, with how to cut it (the process that receives it
  // cuts it: no per-batch work here); the rest of one begun by next() comes
  // batch by batch. Empty if nothing came in time, or at the end (finished()
  // is then true). A read error met after the first unit is raised by the
  // next call. With a per-unit transform (next_unit / push_unit), pass
  // max_bytes=0: only the pushed unit is taken.
  std::vector<UnitCut> take_units(int64_t timeout_ms, int64_t max_bytes);
  // The batches each DataLoader worker of this iteration delivers (empty in
  // the training process).
  const std::vector<int64_t>& worker_batches() const;
  // What this iteration reads (internal: Iteration is not part of the installed headers).
  const Iteration& iteration() const;

  void start_unit(Batch unit, Batch offsets, bool padding);  // the current unit, none of its batches delivered
  bool refill();                                             // the current unit has a batch left, or the epoch ended
  Batch deliver();                                           // its next batch, counted
  void count_delivered(int64_t rows);                        // one more batch of `rows` rows delivered

  std::unique_ptr<EpochReader> reader_;
  std::shared_ptr<IterationProgress> progress_;
  int64_t epoch_;
  int64_t batch_size_;
  int64_t num_batches_;
  at::Tensor shared_state_;
  int64_t slot_;
  Batch current_;          // the current unit (empty once taken whole)
  Batch current_offsets_;  // split_into_batches' offsets for its CSR fields
  int64_t current_rows_ = 0;
  int64_t current_batches_ = 0;  // the batches it is cut into
  int64_t next_pending_ = 0;     // those delivered
  std::vector<Batch> pending_;   // its batches, cut when next() first delivers one of them
  Batch delivered_slot_;         // empty, put in a delivered batch's slot (a new Dict would allocate per batch)
  int64_t unit_rows_ = -1;       // rows of the unit handed out by next_unit(), awaiting push_unit()
  at::Tensor unit_index_;        // and their indices, which push_unit() must get back
  bool unit_padding_ = false;
  int64_t delivered_ = 0;
  bool last_padding_ = false;
  bool finished_ = false;
  std::exception_ptr deferred_error_;          // met by take_units() after its first unit
  std::unique_ptr<DeviceStage> device_stage_;  // null: batches stay on the host
};

// An input iterator over one epoch's batches (a range-for over ShardedDataset).
//
// A batch counts as consumed (what state_dict() records, in-process) once
// the loop takes it: dereferenced (*it, it->) for the first time, or passed
// over by ++it without being looked at. Comparing with end() waits for the
// next batch but takes nothing. So a checkpoint counts the batches the loop
// has in hand or behind it, whichever way the loop is written:
//
//   for (const auto& batch : dataset) { step(batch); save(dataset->state_dict()); }   // counts this batch
//   for (auto it = dataset.begin(); it != dataset.end(); ++it) {
//     save(dataset->state_dict());   // counts the batches before *it: this one is not taken yet
//     step(*it);
//   }
//   auto batches = dataset->iter();   // the next epoch; batches->next() takes (and counts) one batch
//
// Or pass the loop's own count: dataset->state_dict(consumed_batches), as in Python.
class TORCH_SHARDS_API BatchIterator {
 public:
  // An input iterator over Batch values.
  // @{
  using iterator_category = std::input_iterator_tag;
  using value_type = Batch;
  using difference_type = std::ptrdiff_t;
  using pointer = const Batch*;
  using reference = const Batch&;
  // @}

  BatchIterator() = default;  // the end
  // The batches of one epoch's iterator (ShardedDatasetImpl::iter()).
  explicit BatchIterator(c10::intrusive_ptr<BatchIteratorImpl> impl) : impl_(std::move(impl)) {}

  // The current batch, taken (counted as consumed) the first time.
  // @{
  const Batch& operator*() const { return take(); }
  const Batch* operator->() const { return &take(); }
  // @}
  // The next batch (the current one counts as consumed even if it was not looked at).
  BatchIterator& operator++();
  // Iterators compare equal when both are at the end (waits for the next batch, takes nothing).
  // @{
  bool operator==(const BatchIterator& other) const { return at_end() && other.at_end(); }
  bool operator!=(const BatchIterator& other) const { return !(*this == other); }
  // @}
  // The script object (torch.classes.torch_shards.BatchIterator).
  const c10::intrusive_ptr<BatchIteratorImpl>& native() const { return impl_; }

 private:
  // Whether no batch is left (waits for the next one to be read, without taking it).
  bool at_end() const;
  // The current batch, taken from the epoch the first time.
  const Batch& take() const;

  c10::intrusive_ptr<BatchIteratorImpl> impl_;
  mutable std::optional<Batch> current_;  // taken, until ++
  mutable bool ended_ = false;
};

class TORCH_SHARDS_API ShardedDataset : public Handle<ShardedDatasetImpl> {
 public:
  ShardedDataset(const Source& source, const Strategy& strategy, const DatasetOptions& options);
  explicit ShardedDataset(c10::intrusive_ptr<ShardedDatasetImpl> impl) : Handle(std::move(impl)) {}

  // Starts the next epoch.
  BatchIterator begin() const { return BatchIterator(impl_->iter()); }
  BatchIterator end() const { return BatchIterator(); }
  // Batches per epoch on this rank.
  int64_t size() const { return impl_->num_batches(); }
};

}  // namespace torch_shards
