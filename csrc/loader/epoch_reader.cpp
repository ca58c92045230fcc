#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "loader/epoch_reader.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>

#include "core/errors.h"
#include "core/radix_sort.h"
#include "core/row_lists.h"
#include "core/stopwatch.h"
#include "io/file.h"
#include "loader/batches.h"
#include "loader/python_gil.h"

namespace torch_shards {
namespace {

using Clock = std::chrono::steady_clock;

// Pieces at least this large are read with the shared helper threads: below,
// handing work to another thread costs more than it saves, and the reader
// threads already read several pieces at once.
constexpr int64_t kParallelBytes = int64_t{4} << 20;
// The epoch's first piece (one batch), read while the other threads wait for it where reads wait on no
// request, is shared with the helpers from this size: read on one thread, the other CPUs idled while the
// consumer waited (CSR .h5ad at batch 4096, a 3 MB batch on 2 CPUs: first batch 2.3 -> 1.8 ms).
constexpr int64_t kParallelFirstBytes = int64_t{256} << 10;

// Whether the reader has fewer threads for reads that wait on no request than for those that wait.
bool reads_locally_on_fewer(const ReaderOptions& options) {
  return options.local_threads > 0 && options.local_threads < options.num_threads;
}

// Estimates of wider rows or larger pieces are capped (their outputs are
// refused when allocated): sums of a few of them stay below 2^63.
constexpr int64_t kMaxEstimate = int64_t{1} << 60;
}  // namespace

EpochReader::EpochReader(std::shared_ptr<const sources::Source> source, core::UnitCursor cursor,
                         const ReaderOptions& options)
    : source_(std::move(source)),
      cursor_(std::move(cursor)),
      options_(options),
      num_units_(cursor_.num_units() - cursor_.position()),
      tensors_(options.memory, options.buffers),
      reads_wait_(options.reads_wait == nullptr || options.reads_wait->load(std::memory_order_relaxed)),
      owner_pid_(io::current_process_id()) {
  core::check_argument(options.num_threads >= 1, "num_threads must be >= 1, got ", options.num_threads);
  core::check_argument(options.prefetch >= 0, "prefetch must be >= 0, got ", options.prefetch);
  core::check_argument(options.prefetch_bytes >= 0, "prefetch_bytes must be >= 0, got ", options.prefetch_bytes);
  core::check_argument(options.batch_size >= 0, "batch_size must be >= 0, got ", options.batch_size);
  dense_row_bytes_ = static_cast<int64_t>(sizeof(int64_t));  // the index
  for (const sources::FieldSpec& field : source_->fields()) {
    if (field.sparse_csr) continue;
    int64_t bytes = static_cast<int64_t>(c10::elementSize(field.dtype));
    bool overflow = false;
    for (int64_t size : field.row_shape) overflow |= __builtin_mul_overflow(bytes, size, &bytes);
    overflow |= __builtin_add_overflow(dense_row_bytes_, bytes, &dense_row_bytes_);
    if (overflow) dense_row_bytes_ = kMaxEstimate;  // such rows are refused when their output is allocated
  }
  if (options_.sparse_row_bytes) sparse_row_bytes_ = options_.sparse_row_bytes->load(std::memory_order_relaxed);
  // Not read yet in this process: from the sizes of what is stored. From the dense fields alone, every
  // thread started a piece at once (behind URLs, 32) whatever prefetch_bytes said.
  if (sparse_row_bytes_.load() == 0) sparse_row_bytes_ = source_->sparse_row_bytes();
  if (options_.prefetch == 0) {
    main_pool_ = std::make_unique<core::ThreadPool>(static_cast<int>(options_.num_threads - 1));
  } else {
    thread_units_.assign(static_cast<size_t>(options_.num_threads), 0);
  }
}

EpochReader::~EpochReader() { close(); }

void EpochReader::close() {
  if (io::current_process_id() != owner_pid_) {
    // Inherited through fork: the threads (and anyone holding the lock) do not exist here.
    for (auto& thread : threads_) thread->abandon();
    threads_.clear();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  room_.notify_all();
  sitting_out_.notify_all();
  unit_ready_.notify_all();
  if (threads_.empty()) return;
  const ReleasePythonGil unlocked;  // destroyed from Python, the GIL is held: the threads may need it
  for (auto& thread : threads_) thread->join();
  threads_.clear();
  helpers_.reset();  // joins the helper threads
  local_helpers_.reset();
}

bool EpochReader::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stopping_;
}

int64_t EpochReader::units_done() const { return units_delivered_.load(); }

int64_t EpochReader::estimate_bytes(int64_t rows) const {
  int64_t bytes = 0;
  if (__builtin_add_overflow(dense_row_bytes_, sparse_row_bytes_.load(), &bytes) ||
      __builtin_mul_overflow(rows, bytes, &bytes) || bytes > kMaxEstimate) {
    return kMaxEstimate;
  }
  return bytes;
}

bool EpochReader::more_pieces() const {
  return (unit_rows_ && unit_next_row_ < static_cast<int64_t>(unit_rows_->size())) ||
         cursor_.position() < cursor_.num_units();
}

EpochReader::Piece EpochReader::claim() {
  Piece piece;
  piece.item = claimed_++;
  const int64_t batch = options_.batch_size;
  if (!unit_rows_ || unit_next_row_ >= static_cast<int64_t>(unit_rows_->size())) {
    core::WorkUnit work;
    // Recycled by the reader threads (core/row_lists.h): a large fetch's lists took new pages every unit.
    std::shared_ptr<std::vector<int64_t>> rows = core::share_row_list();
    std::shared_ptr<std::vector<int64_t>> sorted = core::share_row_list();
    int64_t dealt = 1;
    try {
      cursor_.next(work, *rows, sorted.get());  // planning is cheap next to reading: done in order, under the lock
      // The units that follow from the same fetch (tail batches this worker
      // takes in a row) are read with it; whole batches up to the last.
      core::WorkUnit following;
      std::vector<int64_t> more;
      while (batch > 0 && !work.padding && static_cast<int64_t>(rows->size()) % batch == 0 && cursor_.peek(following) &&
             following.fetch == work.fetch && !following.padding) {
        cursor_.next(following, more);
        rows->insert(rows->end(), more.begin(), more.end());
        sorted->clear();  // the readers sort the rows joined
        ++dealt;
      }
    } catch (...) {
      piece.error = std::current_exception();
      unit_rows_.reset();
      return piece;
    }
    unit_dealt_units_ = dealt;
    unit_rows_ = std::move(rows);
    unit_sorted_ = std::move(sorted);
    unit_padding_ = work.padding;
    unit_next_row_ = 0;
    // A unit larger than the budget is read in pieces of whole batches.
    const int64_t count = static_cast<int64_t>(unit_rows_->size());
    piece_rows_ = count;
    if (batch > 0 && count > batch && estimate_bytes(count) > options_.prefetch_bytes) {
      piece_rows_ = std::max<int64_t>(1, options_.prefetch_bytes / std::max<int64_t>(1, estimate_bytes(batch))) * batch;
    }
  }
  piece.rows = unit_rows_;
  piece.sorted = unit_sorted_;
  piece.padding = unit_padding_;
  piece.begin = unit_next_row_;
  // The reader's first piece is one batch: the consumer's first batch waits for that batch's rows, not for a
  // whole fetch's (the rest of the unit is the next piece, which another thread reads meanwhile).
  const int64_t rows_now = piece.item == 0 && batch > 0 ? std::min(piece_rows_, batch) : piece_rows_;
  piece.end = std::min<int64_t>(static_cast<int64_t>(unit_rows_->size()), unit_next_row_ + rows_now);
  piece.first = piece.begin == 0;
  piece.last = piece.end == static_cast<int64_t>(unit_rows_->size());
  piece.dealt_units = piece.last ? unit_dealt_units_ : 0;
  piece.estimate = estimate_bytes(piece.end - piece.begin);
  unit_next_row_ = piece.end;
  return piece;
}

EpochReader::Unit EpochReader::read_piece(const Piece& piece, core::ThreadPool& pool) {
  const bool whole = piece.first && piece.last;
  // A part's lists: the reader thread's kept ones (a large piece's took new pages); a whole unit needs none.
  std::optional<core::KeptRowList> part, part_sorted;
  if (!whole) {
    part.emplace();
    part_sorted.emplace();
    part->list.assign(piece.rows->begin() + piece.begin, piece.rows->begin() + piece.end);
    core::positions_within(*piece.sorted, piece.begin, piece.end, part_sorted->list);
  }
  const std::vector<int64_t>& rows = whole ? *piece.rows : part->list;
  const std::vector<int64_t>& sorted = whole ? *piece.sorted : part_sorted->list;
  TORCH_INTERNAL_ASSERT(sorted.empty() || sorted.size() == rows.size(), "EpochReader: ", sorted.size(),
                        " sorted positions for ", rows.size(), " rows");
  const int64_t count = static_cast<int64_t>(rows.size());
  sources::ReadContext context{pool, tensors_};
  const int64_t since = io::use_clock();
  sources::RowRequest request{rows};
  if (!sorted.empty()) request.sorted = &sorted;
  std::unique_ptr<sources::PlannedRead> planned = source_->plan(request, context);
  // Every output in one allocation: the fields, the row indices and, for
  // each CSR field, the row offsets of its batches.
  std::vector<sources::TensorSpec> specs = sources::tensor_specs(planned->outputs());
  const size_t num_outputs = specs.size();
  specs.push_back(sources::TensorSpec{{count}, at::kLong});
  const int64_t batch = options_.batch_size;
  const int64_t num_batches = batch > 0 ? (count + batch - 1) / batch : 1;
  std::vector<std::string> csr_fields;
  if (num_batches > 1) {
    for (const sources::OutputSpec& output : planned->outputs()) {
      if (output.part != sources::OutputSpec::Part::kCsrOffsets) continue;
      csr_fields.push_back(output.field);
      specs.push_back(sources::TensorSpec{{count + num_batches}, output.tensor.dtype});
    }
  }
  std::vector<at::Tensor> tensors = tensors_.allocate(specs, [&] { return sources::describe_read(*source_, count); });
  Unit unit;
  // Checked before anything of the unit is delivered.
  unit.batch =
      planned->fill_checked(std::vector<at::Tensor>(tensors.begin(), tensors.begin() + num_outputs), context, since);
  const bool waits = planned->waits_on_requests();
  if (reads_wait_.exchange(waits, std::memory_order_relaxed) != waits) {
    if (options_.reads_wait) options_.reads_wait->store(waits, std::memory_order_relaxed);
    if (waits) {
      std::lock_guard<std::mutex> lock(mutex_);  // a thread about to sit out sees the flag, or is notified
      start_waiting_threads_locked();
      sitting_out_.notify_all();
    }
  }
  at::Tensor indexes = tensors[num_outputs];
  if (count > 0) std::memcpy(indexes.data_ptr<int64_t>(), rows.data(), rows.size() * sizeof(int64_t));
  unit.batch.insert("index", indexes);
  for (size_t i = 0; i < csr_fields.size(); ++i) unit.batch_offsets.insert(csr_fields[i], tensors[num_outputs + 1 + i]);
  unit.padding = piece.padding;
  unit.first = piece.first;
  unit.last = piece.last;
  unit.dealt_units = piece.dealt_units;
  // What a row costs beyond the dense fields (sparse ones), for the next estimates.
  if (count > 0) {
    const int64_t sparse = std::max<int64_t>(0, batch_bytes(unit.batch) / count - dense_row_bytes_);
    sparse_row_bytes_ = sparse;
    if (options_.sparse_row_bytes) options_.sparse_row_bytes->store(sparse, std::memory_order_relaxed);
  }
  return unit;
}

void EpochReader::start_threads_locked() {
  started_ = true;
  const bool local = reads_locally_on_fewer(options_);
  if (local && options_.local_threads > 1)
    local_helpers_ = std::make_unique<core::ThreadPool>(static_cast<int>(options_.local_threads - 1));
  if (local && !reads_wait_.load(std::memory_order_relaxed)) {
    for (int64_t t = 0; t < options_.local_threads; ++t) {
      threads_.push_back(std::make_unique<core::CachedThread>([this, t] { reader_loop(static_cast<size_t>(t)); }));
    }
    return;  // the others at the first read that waits
  }
  start_waiting_threads_locked();
}

void EpochReader::start_waiting_threads_locked() {
  if (stopping_ || !started_ || static_cast<int64_t>(threads_.size()) == options_.num_threads) return;
  if (options_.num_threads > 1 && !helpers_)
    helpers_ = std::make_unique<core::ThreadPool>(static_cast<int>(options_.num_threads - 1));
  for (int64_t t = static_cast<int64_t>(threads_.size()); t < options_.num_threads; ++t) {
    threads_.push_back(std::make_unique<core::CachedThread>([this, t] { reader_loop(static_cast<size_t>(t)); }));
  }
}

void EpochReader::reader_loop(size_t thread) {
  core::ThreadPool inline_pool(0);  // small pieces: read on this thread alone
  const int64_t ahead = options_.prefetch;
  for (;;) {
    Piece piece;
    core::ThreadPool* helpers = nullptr;
    bool alone = false;  // the first piece, which the other threads wait for
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // A piece starts while fewer than `prefetch` are out and their bytes are
      // under budget (none out always admits one, so a piece larger than the
      // budget still flows).
      // Threads beyond local_threads sit out while reads wait on no request, on a condition of their
      // own (room_ is notified at every read and take: waking them all each time would cost more
      // than they save); a read that waits again wakes them, and they look now and then anyway.
      if (options_.local_threads > 0 && static_cast<int64_t>(thread) >= options_.local_threads) {
        while (!stopping_ && !failed_ && more_pieces() && !reads_wait_.load(std::memory_order_relaxed)) {
          sitting_out_.wait_for(lock, std::chrono::milliseconds(50));
        }
      }
      room_.wait(lock, [&] {
        const int64_t out = claimed_ - delivered_;
        const bool waits = reads_wait_.load(std::memory_order_relaxed);
        const int64_t limit = waits || options_.local_prefetch == 0 ? ahead : std::min(ahead, options_.local_prefetch);
        // The first piece (the epoch's first batch, which the consumer waits for) is read alone, with
        // every helper, where reads wait on no request (local memory and files: the cores are what
        // it needs); the other threads start once it is in. Requests all go out at once.
        const bool first_pending = claimed_ > 0 && !first_read_ && !waits;
        return stopping_ || failed_ || !more_pieces() || (!first_pending && room_for_another(out, limit));
      });
      if (stopping_ || failed_ || !more_pieces()) return;
      // The helpers of this piece's large copies (made under this lock): while reads wait on no
      // request, as many as the threads that read then (none for one: it reads alone).
      helpers = helpers_.get();
      if (reads_locally_on_fewer(options_) && !reads_wait_.load(std::memory_order_relaxed)) {
        helpers = local_helpers_.get();
      }
      piece = claim();
      alone = piece.item == 0 && !reads_wait_.load(std::memory_order_relaxed);
      slots_.emplace_back();
      out_bytes_ += piece.estimate;
      ++in_flight_;
    }
    Slot result;
    result.error = piece.error;
    bool wake = false;
    const auto start = Clock::now();
    if (!result.error) {
      try {
        const int64_t parallel = alone ? kParallelFirstBytes : kParallelBytes;
        core::ThreadPool& pool = helpers != nullptr && piece.estimate >= parallel ? *helpers : inline_pool;
        result.unit = read_piece(piece, pool);
        result.bytes = batch_bytes(result.unit->batch);
      } catch (...) {
        result.error = std::current_exception();
      }
    }
    read_us_ += core::microseconds_since(start);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --in_flight_;
      ++thread_units_[thread];
      failed_ = failed_ || result.error != nullptr;
      queued_bytes_ += result.bytes;
      if (piece.item == 0) first_read_ = true;
      out_bytes_ += result.bytes - piece.estimate;
      result.ready = true;
      // A c10::Dict moves by sharing: drop this thread's reference before the
      // consumer can see the unit, so the batch never dies on this thread
      // (its tensors may have Python objects by then, freed only with the GIL).
      slots_[static_cast<size_t>(piece.item - delivered_)] = std::move(result);
      result = Slot{};
      piece = Piece{};
      wake = consumer_should_wake();
      if (wake && consumer_waits_) {  // counted once: notified, the consumer is no longer waiting
        ++wakes_;
        consumer_waits_ = false;
      }
    }
    if (wake) unit_ready_.notify_all();
    room_.notify_all();
  }
}

bool EpochReader::bytes_ready(int64_t bytes) const {
  if (stopping_ || failed_ || (in_flight_ == 0 && !more_pieces())) return true;
  int64_t ready = 0;  // the bytes of the pieces the consumer can take in a row
  for (const Slot& slot : slots_) {
    if (!slot.ready) break;
    ready += slot.bytes;
  }
  return ready >= bytes || !room_for_another(claimed_ - delivered_, options_.prefetch);
}

bool EpochReader::consumer_should_wake() const {
  if (stopping_ || failed_) return true;
  if (wanted_bytes_ > 0) return bytes_ready(wanted_bytes_);
  size_t ready = 0;  // the pieces the consumer can take in a row
  while (ready < slots_.size() && slots_[ready].ready) ++ready;
  if (ready == 0) return false;
  // Two in a row, unless no other piece is being read (none would follow), nothing was delivered yet
  // (the first batch: its wait is the epoch's start), or the readers wait for the room the consumer frees.
  if (ready >= 2 || in_flight_ == 0 || delivered_ == 0) return true;
  return !room_for_another(claimed_ - delivered_, options_.prefetch);
}

bool EpochReader::room_for_another(int64_t out, int64_t limit) const {
  // None out always admits one, so that a piece larger than the budget still flows.
  return out == 0 || ((out < limit || out_bytes_ < read_ahead_bytes_) && out_bytes_ < options_.prefetch_bytes);
}

void EpochReader::read_ahead(int64_t bytes) {
  if (!options_.deepen_read_ahead) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes <= read_ahead_bytes_) return;
    read_ahead_bytes_ = bytes;
  }
  room_.notify_all();
}

void EpochReader::check_open() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) throw std::runtime_error("EpochReader: read after close()");
}

std::optional<EpochReader::Unit> EpochReader::next() {
  check_open();
  if (units_delivered_ >= num_units_) return std::nullopt;
  if (options_.prefetch == 0) {
    const auto start = Clock::now();
    Piece piece;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      piece = claim();
    }
    if (piece.error) std::rethrow_exception(piece.error);
    Unit unit = read_piece(piece, *main_pool_);
    read_us_ += core::microseconds_since(start);
    ++delivered_;
    units_delivered_ += unit.dealt_units;
    rows_delivered_ += unit.batch.at("index").size(0);
    bytes_delivered_ += batch_bytes(unit.batch);
    return unit;
  }
  const auto start = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  if (!started_) start_threads_locked();
  const auto ready = [&] {
    return stopping_ || (failed_ && slots_.empty()) || (!slots_.empty() && slots_.front().ready);
  };
  consumer_waits_ = true;
  unit_ready_.wait(lock, ready);
  consumer_waits_ = false;
  wait_us_ += core::microseconds_since(start);
  if (stopping_) throw std::runtime_error("EpochReader: read after close()");
  if (slots_.empty()) throw std::runtime_error("EpochReader: read after a failed read");
  return take(slots_.front());
}

bool EpochReader::wait(int64_t timeout_ms) {
  check_open();
  if (options_.prefetch == 0 || units_delivered_ >= num_units_) return true;
  const auto start = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  if (!started_) start_threads_locked();
  consumer_waits_ = true;
  const bool ready = unit_ready_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0)), [&] {
    return stopping_ || (failed_ && slots_.empty()) || (!slots_.empty() && slots_.front().ready);
  });
  consumer_waits_ = false;
  wait_us_ += core::microseconds_since(start);
  return ready;
}

void EpochReader::wait_for_bytes(int64_t bytes) {
  check_open();
  if (options_.prefetch == 0 || bytes <= 0) return;
  const auto start = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  if (!started_) start_threads_locked();
  wanted_bytes_ = bytes;
  consumer_waits_ = true;
  unit_ready_.wait(lock, [&] { return bytes_ready(bytes); });
  consumer_waits_ = false;
  wanted_bytes_ = 0;
  wait_us_ += core::microseconds_since(start);
}

EpochReader::Unit EpochReader::take(Slot& slot) {
  // Called with mutex_ held; slot is slots_.front().
  Slot taken = std::move(slot);
  slots_.pop_front();
  queued_bytes_ -= taken.bytes;
  out_bytes_ -= taken.bytes;
  ++delivered_;
  room_.notify_all();
  if (taken.error) std::rethrow_exception(taken.error);  // the reader thread's exception, unchanged
  units_delivered_ += taken.unit->dealt_units;
  rows_delivered_ += taken.unit->batch.at("index").size(0);
  bytes_delivered_ += taken.bytes;
  return std::move(*taken.unit);
}

c10::Dict<std::string, int64_t> EpochReader::stats() const {
  c10::Dict<std::string, int64_t> out;
  std::lock_guard<std::mutex> lock(mutex_);
  out.insert("units", units_delivered_.load());
  out.insert("units_total", num_units_);
  out.insert("rows", rows_delivered_.load());
  out.insert("bytes", bytes_delivered_.load());
  int64_t ready = 0;
  for (const Slot& slot : slots_) ready += slot.ready;
  out.insert("queue_depth", ready);
  out.insert("queued_bytes", queued_bytes_);
  out.insert("row_bytes_estimate", estimate_bytes(1));  // what a row is taken to cost, admitting pieces
  out.insert("in_flight", in_flight_);
  out.insert("wait_us", wait_us_.load());
  out.insert("wakes", wakes_);
  out.insert("read_us", read_us_.load());
  out.insert("threads", static_cast<int64_t>(threads_.size()));
  for (size_t t = 0; t < thread_units_.size(); ++t)
    out.insert("thread" + std::to_string(t) + "_units", thread_units_[t]);
  if (options_.buffers) {
    const BufferPool::Stats pool = options_.buffers->stats();
    out.insert("pool_allocations", pool.allocations);
    out.insert("pool_reuses", pool.reuses);
    out.insert("pool_untracked", pool.untracked);
    out.insert("pool_kept_bytes", pool.kept_bytes);
  }
  return out;
}

core::ThreadCacheStats reader_thread_stats() { return core::thread_cache_stats(); }

}  // namespace torch_shards
