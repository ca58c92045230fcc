#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "loader/epoch_reader.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/errors.h"
#include "io/file.h"
#include "loader/python_gil.h"

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

}  // namespace

EpochReader::EpochReader(std::shared_ptr<const sources::Source> source, core::UnitCursor cursor,
                         const ReaderOptions& options)
    : source_(std::move(source)),
      cursor_(std::move(cursor)),
      options_(options),
      num_units_(cursor_.num_units() - cursor_.position()),
      owner_pid_(io::current_process_id()) {
  core::check_argument(options.num_threads >= 1, "num_threads must be >= 1, got ", options.num_threads);
  core::check_argument(options.prefetch >= 0, "prefetch must be >= 0, got ", options.prefetch);
  core::check_argument(options.prefetch_bytes >= 0, "prefetch_bytes must be >= 0, got ", options.prefetch_bytes);
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

bool EpochReader::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stopping_;
}

EpochReader::Unit EpochReader::read_unit(const core::WorkUnit& work, const std::vector<int64_t>& rows,
                                         ReadState& state) {
  sources::ReadContext context{*state.pool, *state.tensors};
  Unit unit{source_->read(rows, context), work.padding};
  at::Tensor indexes = state.tensors->empty({static_cast<int64_t>(rows.size())}, at::kLong);
  std::memcpy(indexes.data_ptr<int64_t>(), rows.data(), rows.size() * sizeof(int64_t));
  unit.batch.insert("index", indexes);
  return unit;
}

void EpochReader::start_threads() {
  started_ = true;
  for (int64_t t = 0; t < options_.num_threads; ++t) {
    threads_.push_back(std::make_unique<std::thread>([this, t] { reader_loop(static_cast<size_t>(t)); }));
  }
}

void EpochReader::reader_loop(size_t thread) {
  ReadState state;
  state.pool = std::make_unique<core::ThreadPool>(0);  // one unit per thread, read inline
  state.tensors = std::make_unique<sources::TensorPool>(options_.memory);
  const int64_t ahead = options_.prefetch;
  core::WorkUnit work;
  std::vector<int64_t> rows;
  for (;;) {
    int64_t index;
    Slot result;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // A unit starts when its slot is free and the queue is under budget (an
      // empty queue always admits one, so a unit larger than the budget still flows).
      const auto claimed = [&] { return cursor_.position() - (cursor_.num_units() - num_units_); };
      room_.wait(lock, [&] {
        return stopping_ || failed_ || claimed() >= num_units_ ||
               (claimed() < delivered_ + ahead && (queued_bytes_ < options_.prefetch_bytes || claimed() == delivered_));
      });
      if (stopping_ || failed_ || claimed() >= num_units_) return;
      index = claimed();
      try {
        cursor_.next(work, rows);  // planning is cheap next to reading: done in order, under the lock
      } catch (...) {
        result.error = std::current_exception();
      }
      ++in_flight_;
    }
    const auto start = Clock::now();
    if (!result.error) {
      try {
        result.unit = read_unit(work, rows, state);
        result.bytes = batch_bytes(result.unit->batch);
      } catch (...) {
        result.error = std::current_exception();
      }
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

void EpochReader::check_open() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) throw std::runtime_error("EpochReader: read after close()");
}

std::optional<EpochReader::Unit> EpochReader::next() {
  check_open();
  if (delivered_ >= num_units_) return std::nullopt;
  if (options_.prefetch == 0) {
    const auto start = Clock::now();
    core::WorkUnit work;
    std::vector<int64_t> rows;
    cursor_.next(work, rows);
    Unit unit = read_unit(work, rows, main_state_);
    read_us_ += microseconds_since(start);
    ++delivered_;
    rows_delivered_ += static_cast<int64_t>(rows.size());
    bytes_delivered_ += batch_bytes(unit.batch);
    return unit;
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

bool EpochReader::wait(int64_t timeout_ms) {
  check_open();
  if (options_.prefetch == 0 || delivered_ >= num_units_) return true;
  const auto start = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  if (!started_) start_threads();
  Slot& slot = slots_[static_cast<size_t>(delivered_ % options_.prefetch)];
  const bool ready = unit_ready_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0)),
                                          [&] { return slot.ready || stopping_; });
  wait_us_ += microseconds_since(start);
  return ready;
}

EpochReader::Unit EpochReader::take(Slot& slot) {
  // Called with mutex_ held.
  Slot taken = std::move(slot);
  slot = Slot{};
  queued_bytes_ -= taken.bytes;
  ++delivered_;
  room_.notify_all();
  if (taken.error) std::rethrow_exception(taken.error);  // the reader thread's exception, unchanged
  rows_delivered_ += taken.unit->batch.at("index").size(0);
  bytes_delivered_ += taken.bytes;
  return std::move(*taken.unit);
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
