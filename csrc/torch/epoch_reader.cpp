#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "epoch_reader.h"

#include <ATen/ops/_sparse_csr_tensor_unsafe.h>
#include <ATen/ops/empty.h>

#include <chrono>
#include <cstring>

#include "../core/errors.h"
#include "../io/file.h"
#include "python_gil.h"

namespace torch_shards {
namespace {

using Clock = std::chrono::steady_clock;

int64_t microseconds_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
}

int64_t tensor_bytes(const at::Tensor& tensor) {
  if (tensor.layout() == at::kSparseCsr) {
    return tensor_bytes(tensor.crow_indices()) + tensor_bytes(tensor.col_indices()) + tensor_bytes(tensor.values());
  }
  return tensor.numel() * static_cast<int64_t>(tensor.element_size());
}

int64_t batch_bytes(const sources::Batch& batch) {
  int64_t bytes = 0;
  for (const auto& item : batch) bytes += tensor_bytes(item.value());
  return bytes;
}

// The batches of a unit's sparse CSR tensor: views of its columns and values,
// with row offsets rebased for every batch in one shared storage (one
// allocation, and one shared-memory segment when sent to another process).
template <typename Index>
std::vector<at::Tensor> split_csr(const at::Tensor& tensor, int64_t batch_size) {
  const at::Tensor offsets = tensor.crow_indices();
  const int64_t rows = tensor.size(0);
  const int64_t batches = (rows + batch_size - 1) / batch_size;
  at::Tensor rebased = at::empty({rows + batches}, offsets.options());
  const Index* source = offsets.data_ptr<Index>();
  Index* dest = rebased.data_ptr<Index>();
  std::vector<at::Tensor> out;
  for (int64_t b = 0, first_row = 0; b < batches; ++b, first_row += batch_size) {
    const int64_t count = std::min(batch_size, rows - first_row);
    const Index first = source[first_row], last = source[first_row + count];
    Index* slot = dest + first_row + b;  // batch b's count + 1 offsets
    for (int64_t r = 0; r <= count; ++r) slot[r] = source[first_row + r] - first;
    out.push_back(at::_sparse_csr_tensor_unsafe(rebased.narrow(0, first_row + b, count + 1),
                                                tensor.col_indices().narrow(0, first, last - first),
                                                tensor.values().narrow(0, first, last - first), {count, tensor.size(1)},
                                                tensor.values().options().layout(at::kSparseCsr)));
  }
  return out;
}

}  // namespace

EpochReader::EpochReader(std::shared_ptr<const sources::Source> source, std::shared_ptr<const core::Planner> planner,
                         uint64_t seed, int64_t epoch, int64_t rank, int64_t worker, int64_t num_workers,
                         const ReaderOptions& options)
    : source_(std::move(source)),
      planner_(std::move(planner)),
      seed_(seed),
      epoch_(epoch),
      rank_(rank),
      worker_(worker),
      num_workers_(num_workers),
      options_(options),
      owner_pid_(io::current_process_id()) {
  const auto& layout = planner_->layout();
  core::check_argument(epoch >= 0, "epoch must be >= 0, got ", epoch);
  core::check_argument(rank >= 0 && rank < layout.world_size(), "rank must be in [0, world_size=", layout.world_size(),
                       "), got ", rank);
  core::check_argument(num_workers >= 1, "num_workers must be >= 1, got ", num_workers);
  core::check_argument(worker >= 0 && worker < num_workers, "worker must be in [0, num_workers=", num_workers,
                       "), got ", worker);
  core::check_argument(options.num_threads >= 1, "num_threads must be >= 1, got ", options.num_threads);
  core::check_argument(options.prefetch >= 0, "prefetch must be >= 0, got ", options.prefetch);
  core::check_argument(options.prefetch_bytes >= 0, "prefetch_bytes must be >= 0, got ", options.prefetch_bytes);
  num_units_ = layout.worker_units(rank, worker, num_workers);
  batch_size_ = layout.batch_size();
  if (options_.prefetch == 0) {
    main_state_.pool = std::make_unique<core::ThreadPool>(static_cast<int>(options_.num_threads - 1));
    main_state_.tensors = std::make_unique<sources::TensorPool>(options_.memory);
  } else {
    slots_.resize(static_cast<size_t>(options_.prefetch));
    thread_units_.assign(static_cast<size_t>(options_.num_threads), 0);
  }
}

EpochReader::~EpochReader() { close(); }

void EpochReader::close() {
  if (io::current_process_id() != owner_pid_) {
    // Inherited through fork: the threads (and anyone holding the lock) do not exist here.
    for (auto& thread : threads_) (void)thread.release();
    threads_.clear();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  room_.notify_all();
  unit_ready_.notify_all();
  if (threads_.empty()) return;
  const ReleasePythonGil unlocked;  // destroyed from Python, the GIL is held: the threads may need it
  for (auto& thread : threads_) thread->join();
  threads_.clear();
}

sources::Batch EpochReader::read_unit(int64_t index, ReadState& state, bool& padding) {
  const core::WorkUnit unit = planner_->layout().worker_unit(rank_, worker_, num_workers_, index);
  padding = unit.padding;
  std::vector<int64_t> rows;
  planner_->unit_rows(seed_, epoch_, unit, state.cache, rows);
  sources::ReadContext context{*state.pool, *state.tensors};
  sources::Batch batch = source_->read(rows, context);
  at::Tensor indexes = state.tensors->empty({static_cast<int64_t>(rows.size())}, at::kLong);
  std::memcpy(indexes.data_ptr<int64_t>(), rows.data(), rows.size() * sizeof(int64_t));
  batch.insert("index", indexes);
  return batch;
}

void EpochReader::start_threads() {
  started_ = true;
  next_claim_ = delivered_;
  for (int64_t t = 0; t < options_.num_threads; ++t) {
    threads_.push_back(std::make_unique<std::thread>([this, t] { reader_loop(static_cast<size_t>(t)); }));
  }
}

void EpochReader::reader_loop(size_t thread) {
  ReadState state;
  state.pool = std::make_unique<core::ThreadPool>(0);  // one unit per thread, read inline
  state.tensors = std::make_unique<sources::TensorPool>(options_.memory);
  const int64_t ahead = options_.prefetch;
  for (;;) {
    int64_t index;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // A unit starts when its slot is free and the queue is under budget (an
      // empty queue always admits one, so a unit larger than the budget still flows).
      room_.wait(lock, [&] {
        return stopping_ || failed_ || next_claim_ >= num_units_ ||
               (next_claim_ < delivered_ + ahead &&
                (queued_bytes_ < options_.prefetch_bytes || next_claim_ == delivered_));
      });
      if (stopping_ || failed_ || next_claim_ >= num_units_) return;
      index = next_claim_++;
      ++in_flight_;
    }
    Slot result;
    const auto start = Clock::now();
    try {
      result.batch = read_unit(index, state, result.padding);
      result.bytes = batch_bytes(*result.batch);
    } catch (...) {
      result.error = std::current_exception();
    }
    read_us_ += microseconds_since(start);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --in_flight_;
      ++thread_units_[thread];
      failed_ = failed_ || result.error != nullptr;
      queued_bytes_ += result.bytes;
      result.ready = true;
      // A c10::Dict moves by sharing: drop this thread's reference before the
      // consumer can see the unit, so the batch never dies on this thread
      // (its tensors may have Python objects by then, freed only with the GIL).
      slots_[static_cast<size_t>(index % ahead)] = std::move(result);
      result = Slot{};
    }
    unit_ready_.notify_all();
    room_.notify_all();
  }
}

void EpochReader::check_open() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) throw std::runtime_error("EpochReader: read after close()");
}

std::optional<sources::Batch> EpochReader::next() {
  check_open();
  if (delivered_ >= num_units_) return std::nullopt;
  if (options_.prefetch == 0) {
    bool padding = false;
    const auto start = Clock::now();
    sources::Batch batch = read_unit(delivered_, main_state_, padding);
    read_us_ += microseconds_since(start);
    ++delivered_;
    last_padding_ = padding;
    rows_delivered_ += batch.at("index").size(0);
    bytes_delivered_ += batch_bytes(batch);
    return batch;
  }
  const auto start = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  if (!started_) start_threads();
  Slot& slot = slots_[static_cast<size_t>(delivered_ % options_.prefetch)];
  unit_ready_.wait(lock, [&] { return slot.ready || stopping_; });
  wait_us_ += microseconds_since(start);
  if (stopping_) throw std::runtime_error("EpochReader: read after close()");
  return take(slot);
}

sources::Batch EpochReader::take(Slot& slot) {
  // Called with mutex_ held.
  Slot taken = std::move(slot);
  slot = Slot{};
  queued_bytes_ -= taken.bytes;
  ++delivered_;
  room_.notify_all();
  if (taken.error) std::rethrow_exception(taken.error);  // the reader thread's exception, unchanged
  last_padding_ = taken.padding;
  rows_delivered_ += taken.batch->at("index").size(0);
  bytes_delivered_ += taken.bytes;
  return std::move(*taken.batch);
}

c10::List<sources::Batch> EpochReader::split(const sources::Batch& unit) const {
  const int64_t rows = unit.at("index").size(0);
  const int64_t batches = (rows + batch_size_ - 1) / batch_size_;
  std::vector<sources::Batch> out(static_cast<size_t>(batches));
  for (const auto& item : unit) {
    const at::Tensor& tensor = item.value();
    if (tensor.layout() == at::kSparseCsr) {
      std::vector<at::Tensor> parts = tensor.crow_indices().scalar_type() == at::kInt
                                          ? split_csr<int32_t>(tensor, batch_size_)
                                          : split_csr<int64_t>(tensor, batch_size_);
      for (int64_t b = 0; b < batches; ++b) out[b].insert(item.key(), parts[b]);
      continue;
    }
    for (int64_t b = 0; b < batches; ++b) {
      out[b].insert(item.key(), tensor.narrow(0, b * batch_size_, std::min(batch_size_, rows - b * batch_size_)));
    }
  }
  c10::List<sources::Batch> list;
  for (auto& batch : out) list.push_back(std::move(batch));
  return list;
}

c10::List<sources::Batch> EpochReader::next_batches() {
  const std::optional<sources::Batch> unit = next();
  return unit ? split(*unit) : c10::List<sources::Batch>();
}

std::optional<c10::List<sources::Batch>> EpochReader::poll_batches(int64_t timeout_ms) {
  check_open();
  if (options_.prefetch == 0 || delivered_ >= num_units_) return next_batches();
  const auto start = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  if (!started_) start_threads();
  Slot& slot = slots_[static_cast<size_t>(delivered_ % options_.prefetch)];
  unit_ready_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return slot.ready || stopping_; });
  wait_us_ += microseconds_since(start);
  if (stopping_) throw std::runtime_error("EpochReader: read after close()");
  if (!slot.ready) return std::nullopt;
  const sources::Batch unit = take(slot);
  lock.unlock();
  return split(unit);
}

void EpochReader::skip_units(int64_t units) {
  core::check_argument(units >= 0, "cannot skip a negative number of units, got ", units);
  std::lock_guard<std::mutex> lock(mutex_);
  core::check_argument(!started_, "skip_units must come before the first read");
  delivered_ = std::min(num_units_, delivered_ + units);
}

c10::Dict<std::string, int64_t> EpochReader::stats() const {
  c10::Dict<std::string, int64_t> out;
  std::lock_guard<std::mutex> lock(mutex_);
  out.insert("units", delivered_);
  out.insert("units_total", num_units_);
  out.insert("rows", rows_delivered_.load());
  out.insert("bytes", bytes_delivered_.load());
  int64_t ready = 0;
  for (const Slot& slot : slots_) ready += slot.ready;
  out.insert("queue_depth", ready);
  out.insert("queued_bytes", queued_bytes_);
  out.insert("in_flight", in_flight_);
  out.insert("wait_us", wait_us_.load());
  out.insert("read_us", read_us_.load());
  out.insert("threads", static_cast<int64_t>(threads_.size()));
  for (size_t t = 0; t < thread_units_.size(); ++t)
    out.insert("thread" + std::to_string(t) + "_units", thread_units_[t]);
  return out;
}

}  // namespace torch_shards
