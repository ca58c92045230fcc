#include "io/csr_matrix.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <limits>
#include <sstream>
#include <type_traits>

#include "core/cpu_features.h"
#include "core/errors.h"
#include "core/radix_sort.h"
#include "core/scratch_buffer.h"
#include "core/waiting_tasks.h"

namespace torch_shards::io {

using core::concat;
using core::ReadError;

namespace {

bool float_pointers(DType dtype) { return dtype == DType::kFloat32 || dtype == DType::kFloat64; }

// The shortest decimal text that reads back as `value`.
std::string shortest(double value) {
  std::ostringstream out;
  for (int digits = 1; digits <= 17; ++digits) {
    out.str("");
    out << std::setprecision(digits) << value;
    if (std::strtod(out.str().c_str(), nullptr) == value) break;
  }
  return out.str();
}

// indptr entries as int64: integers, or floats (anndata and scipy cast a
// float indptr to integers when they read it) each a whole number from 0 to
// the float's last consecutive integer (2^53, 2^24 for float32), which
// `segments` of the entries read name in an error.
void read_pointers(const Array& array, const std::vector<Segment>& segments, int64_t count, core::ThreadPool& pool,
                   std::vector<int64_t>& values) {
  const DType dtype = array.info().dtype;
  thread_local core::ScratchBuffer stored;
  uint8_t* raw = stored.get(static_cast<size_t>(count) * dtype_size(dtype));
  array.read(segments, raw, pool);
  values.resize(static_cast<size_t>(count));
  if (!float_pointers(dtype)) {
    for (int64_t i = 0; i < count; ++i) values[i] = integer_at(raw, dtype, i);
    return;
  }
  const bool wide = dtype == DType::kFloat64;
  const double limit = wide ? 9007199254740992.0 : 16777216.0;
  for (int64_t i = 0; i < count; ++i) {
    const double value =
        wide ? reinterpret_cast<const double*>(raw)[i] : static_cast<double>(reinterpret_cast<const float*>(raw)[i]);
    if (!(value >= 0 && value <= limit && value == std::floor(value))) {
      const auto segment = std::find_if(segments.begin(), segments.end(),
                                        [&](const Segment& s) { return s.dest <= i && i < s.dest + s.length; });
      const int64_t entry = segment->source + (i - segment->dest);
      const bool end = entry == array.num_rows() - 1;
      throw ReadError(concat(array.where(), end ? ": at the end of the last row" : ": at row ",
                             end ? "" : std::to_string(entry), ", indptr[", entry, "] is ", shortest(value),
                             ", not a whole number in [0, 2^", wide ? 53 : 24, "] (a ", dtype_name(dtype),
                             " indptr is read as the integers it holds)"));
    }
    values[i] = static_cast<int64_t>(value);
  }
}

}  // namespace

CsrMatrix::CsrMatrix(std::shared_ptr<const Array> indptr, std::shared_ptr<const Array> indices,
                     std::shared_ptr<const Array> data, int64_t num_rows, int64_t num_cols)
    : indptr_(std::move(indptr)),
      indices_(std::move(indices)),
      data_(std::move(data)),
      num_rows_(num_rows),
      num_cols_(num_cols) {
  for (const Array* array : {indptr_.get(), indices_.get(), data_.get()}) {
    if (array->info().shape.size() != 1) {
      throw ReadError(concat(array->where(), ": CSR arrays must be 1-D, this one has shape of ",
                             array->info().shape.size(), " dimensions"));
    }
  }
  const DType pointer_dtype = indptr_->info().dtype;
  if (!(is_integer(pointer_dtype) || float_pointers(pointer_dtype)) || !is_integer(indices_->info().dtype)) {
    throw ReadError(concat(where(),
                           ": indptr and indices must hold integers (indptr also whole float32 or float64 "
                           "numbers), got ",
                           dtype_name(pointer_dtype), " and ", dtype_name(indices_->info().dtype)));
  }
  if (num_rows_ < 0 || num_cols_ < 0)
    throw ReadError(concat(where(), ": invalid shape (", num_rows_, ", ", num_cols_, ")"));
  if (indptr_->num_rows() != num_rows_ + 1) {
    throw ReadError(concat(indptr_->where(), ": has ", indptr_->num_rows(), " entries but the matrix has ", num_rows_,
                           " rows (expected ", num_rows_ + 1, ")"));
  }
  if (indices_->num_rows() != data_->num_rows()) {
    throw ReadError(
        concat(where(), ": indices has ", indices_->num_rows(), " entries but data has ", data_->num_rows()));
  }
  core::ThreadPool inline_pool(0);
  std::vector<int64_t> ends;
  read_pointers(*indptr_, {Segment{0, 1, 0}, Segment{num_rows_, 1, 1}}, 2, inline_pool, ends);
  if (ends[0] != 0 || ends[1] != data_->num_rows()) {
    throw ReadError(concat(indptr_->where(), ": must run from 0 to the number of stored values (", data_->num_rows(),
                           "), got ", ends[0], " .. ", ends[1]));
  }
}

void CsrMatrix::open_files(std::vector<const File*>& files) const {
  indptr_->open_files(files);
  indices_->open_files(files);
  data_->open_files(files);
}

void CsrMatrix::opened_stamps(FileStamps& stamps) const {
  indptr_->opened_stamps(stamps);
  indices_->opened_stamps(stamps);
  data_->opened_stamps(stamps);
}

std::string CsrMatrix::where() const {
  const std::string& path = data_->info().path;
  const size_t slash = path.rfind('/');
  return data_->info().file + ":" +
         (slash == std::string::npos || slash == 0 ? std::string("/") : path.substr(0, slash));
}

namespace {

// Consecutive rows delivered to consecutive positions: rows [row, row + length)
// go to positions [dest, dest + length).
struct RowRun {
  int64_t row, length, dest;
};

void runs_of(const std::vector<int64_t>& rows, std::vector<RowRun>& runs) {
  runs.clear();
  for (size_t d = 0; d < rows.size(); ++d) {
    if (!runs.empty() && rows[d] == runs.back().row + runs.back().length) {
      ++runs.back().length;
      continue;
    }
    runs.push_back(RowRun{rows[d], 1, static_cast<int64_t>(d)});
  }
}

// The runs' positions ordered by first row (a shuffled fetch has as many runs
// as rows: core::sort_positions_by_row radix-sorts them).
void runs_by_row(const std::vector<RowRun>& runs, std::vector<size_t>& by_row) {
  thread_local std::vector<int64_t> first_rows, order, scratch;
  first_rows.resize(runs.size());
  for (size_t r = 0; r < runs.size(); ++r) first_rows[r] = runs[r].row;
  core::sort_positions_by_row(first_rows, order, scratch);
  by_row.assign(order.begin(), order.end());
}

// Appends the values of the plan rows from `first_row` on (elements `segment.length` from
// `segment.source`, placed at `segment.dest`) to the plan's segments, joined to the last one where
// they follow it both in the file and in the output; none where empty.
void add_segment(CsrPlan& plan, const Segment& segment, int64_t first_row) {
  if (segment.length == 0) return;
  if (!plan.segments.empty()) {
    Segment& last = plan.segments.back();
    if (segment.source == last.source + last.length && segment.dest == last.dest + last.length) {
      last.length += segment.length;
      return;
    }
  }
  plan.segments.push_back(segment);
  plan.segment_rows.push_back(first_row);
}

// Room for a plan's segments, at most one per run of rows: grown by doubling, the lists of a large fetch (tens
// of thousands of rows) were allocated several times over, each time in pages new to the process (CSR .h5ad at
// batch 4096: 500-1,700 page faults an epoch).
void reserve_segments(CsrPlan& plan, size_t runs) {
  plan.segments.reserve(runs);
  plan.segment_rows.reserve(runs);
}

}  // namespace

CsrPlan CsrMatrix::plan(const std::vector<int64_t>& rows, core::ThreadPool& pool,
                        const std::vector<int64_t>* positions_by_row) const {
  if (positions_by_row != nullptr) return plan_in_row_order(rows, *positions_by_row, pool);
  // Rows come in runs (blocks of consecutive rows): sorting the runs, not the
  // rows, orders the reads. Runs may overlap (a row delivered twice): each
  // then reads its own indptr entries and values. The runs are copied in row
  // order once, and every pass after that walks them in that order: of a
  // shuffled fetch (a run per row), only the copy, the rows' lengths written
  // at their positions and their offsets read back are scattered accesses.
  // Working lists kept by the thread (a plan of a large fetch needs several of 8 bytes a row: made and
  // freed for each, their pages would be taken from the system again every time), each looked up once.
  thread_local std::vector<RowRun> kept_runs, kept_sorted;
  thread_local std::vector<size_t> kept_by_row;
  thread_local std::vector<int64_t> kept_base, kept_pointers;
  std::vector<RowRun>& runs = kept_runs;
  std::vector<RowRun>& sorted = kept_sorted;
  std::vector<size_t>& by_row = kept_by_row;
  std::vector<int64_t>& base = kept_base;
  std::vector<int64_t>& pointers = kept_pointers;
  runs_of(rows, runs);
  runs_by_row(runs, by_row);
  sorted.resize(runs.size());
  int64_t last = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    sorted[i] = runs[by_row[i]];
    last = std::max(last, sorted[i].row + sorted[i].length - 1);
  }
  if (!sorted.empty() && (sorted.front().row < 0 || last >= num_rows_)) {
    throw core::InvalidArgument(
        concat(where(), ": rows [", sorted.front().row, ", ", last, "] outside [0, ", num_rows_, ")"));
  }
  // indptr of each stretch of adjacent runs [b, e): entries b .. e; base[i]:
  // where sorted run i's first row's start lies among them.
  std::vector<Segment> pointer_segments;
  base.resize(sorted.size());
  int64_t count = 0, end = -1;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const RowRun& run = sorted[i];
    if (run.row != end) {
      pointer_segments.push_back(Segment{run.row, 1, count});
      ++count;
    }
    base[i] = count - 1;
    pointer_segments.back().length += run.length;
    count += run.length;
    end = run.row + run.length;
  }
  read_pointers(*indptr_, pointer_segments, count, pool, pointers);
  CsrPlan plan;
  reserve_segments(plan, sorted.size());
  // Each row's length at its position, then summed in delivery order.
  plan.row_offsets.assign(rows.size() + 1, 0);
  for (size_t i = 0; i < sorted.size(); ++i) {
    const RowRun& run = sorted[i];
    for (int64_t j = 0; j < run.length; ++j) {
      const int64_t start = pointers[base[i] + j], stop = pointers[base[i] + j + 1];
      if (start < 0 || stop < start || stop > data_->num_rows()) throw_inconsistent(run.row + j, start, stop);
      plan.row_offsets[run.dest + j + 1] = stop - start;
    }
  }
  for (size_t k = 1; k < plan.row_offsets.size(); ++k) plan.row_offsets[k] += plan.row_offsets[k - 1];
  for (size_t i = 0; i < sorted.size(); ++i) {  // source order: each run's values are one stretch, in and out
    const RowRun& run = sorted[i];
    const int64_t source = pointers[base[i]], length = pointers[base[i] + run.length] - source;
    add_segment(plan, Segment{source, length, plan.row_offsets[run.dest]}, run.dest);
  }
  return plan;
}

void CsrMatrix::throw_inconsistent(int64_t row, int64_t start, int64_t stop) const {
  throw ReadError(concat(indptr_->where(), ": inconsistent at row ", row, " (indptr[", row, "] = ", start, ", indptr[",
                         row + 1, "] = ", stop, ", ", data_->num_rows(),
                         " stored values): not monotone or out of range"));
}

CsrPlan CsrMatrix::plan_in_row_order(const std::vector<int64_t>& rows, const std::vector<int64_t>& sorted,
                                     core::ThreadPool& pool) const {
  // A shuffled fetch is a run of one row per position: its rows are walked in
  // row order through the planner's positions, without runs to build and
  // sort (each row's position read, its length written there, its offset
  // read back: the only scattered accesses).
  if (sorted.size() != rows.size()) {
    throw std::logic_error(
        concat(where(), ": plan got ", sorted.size(), " sorted positions for ", rows.size(), " rows"));
  }
  const size_t count = rows.size();
  CsrPlan plan;
  plan.row_offsets.assign(count + 1, 0);
  if (count == 0) return plan;
  reserve_segments(plan, count);
  const int64_t first = rows[sorted.front()], last = rows[sorted.back()];
  if (first < 0 || last >= num_rows_) {
    throw core::InvalidArgument(concat(where(), ": rows [", first, ", ", last, "] outside [0, ", num_rows_, ")"));
  }
  // indptr of each stretch of consecutive rows [a, b]: entries a .. b + 1;
  // base[i]: where the i-th row in row order starts among them (a row
  // delivered twice reads them once).
  thread_local std::vector<int64_t> kept_base, kept_pointers;
  std::vector<int64_t>& base = kept_base;
  std::vector<int64_t>& pointers = kept_pointers;
  base.resize(count);
  std::vector<Segment> pointer_segments;
  int64_t entries = 0, previous = -2;
  for (size_t i = 0; i < count; ++i) {
    const int64_t row = rows[sorted[i]];
    if (row < previous) {
      throw std::logic_error(concat(where(), ": plan got positions out of row order (row ", row, " after ", previous,
                                    " at position ", i, ")"));
    }
    if (row == previous) {
      base[i] = base[i - 1];
      continue;
    }
    if (row == previous + 1) {
      ++pointer_segments.back().length;
      base[i] = entries - 1;
      ++entries;
    } else {
      pointer_segments.push_back(Segment{row, 2, entries});
      base[i] = entries;
      entries += 2;
    }
    previous = row;
  }
  read_pointers(*indptr_, pointer_segments, entries, pool, pointers);
  // Each row's length at its position, then summed in delivery order.
  for (size_t i = 0; i < count; ++i) {
    const int64_t start = pointers[base[i]], stop = pointers[base[i] + 1];
    if (start < 0 || stop < start || stop > data_->num_rows()) throw_inconsistent(rows[sorted[i]], start, stop);
    plan.row_offsets[sorted[i] + 1] = stop - start;
  }
  for (size_t k = 1; k <= count; ++k) plan.row_offsets[k] += plan.row_offsets[k - 1];
  // Source order: rows next to each other in the file and in delivery order join one segment.
  for (size_t i = 0; i < count; ++i) {
    const int64_t position = sorted[i];
    const int64_t source = pointers[base[i]], length = pointers[base[i] + 1] - source;
    add_segment(plan, Segment{source, length, plan.row_offsets[position]}, position);
  }
  return plan;
}

namespace {

// Converts column indices to the output width and checks them against the
// column count, in one typed pass the compiler vectorises; whether all were in
// range. The bounds are taken of the converted values where the conversion
// loses nothing, else of the stored values (int64 stored, int32 out). kWrite
// false (Out the stored type): checked only, `out` unused.
template <typename Stored, typename Out, bool kWrite>
[[gnu::always_inline]] inline bool convert_in_range(const Stored* __restrict stored, Out* __restrict out, int64_t count,
                                                    int64_t num_cols) {
  static_assert(kWrite || std::is_same_v<Stored, Out>, "indices of another width are written");
  if constexpr (sizeof(Stored) <= sizeof(Out)) {  // widening, or a reinterpretation that flips the sign of large values
    Out low = static_cast<Out>(stored[0]), high = low;
    for (int64_t i = 0; i < count; ++i) {
      const Out value = static_cast<Out>(stored[i]);
      low = std::min(low, value);
      high = std::max(high, value);
      if constexpr (kWrite) out[i] = value;
    }
    return low >= 0 && static_cast<int64_t>(high) < num_cols;
  } else {
    Stored low = stored[0], high = stored[0];
    for (int64_t i = 0; i < count; ++i) {
      low = std::min(low, stored[i]);
      high = std::max(high, stored[i]);
      out[i] = static_cast<Out>(stored[i]);
    }
    return !(std::is_signed_v<Stored> && low < 0) && static_cast<uint64_t>(high) < static_cast<uint64_t>(num_cols);
  }
}

#ifdef TORCH_SHARDS_CPU_DISPATCH
// The same pass with AVX2 (used where the CPU has it): baseline x86-64 has no
// unsigned 16-bit or signed 32-bit min and max (numcodecs' uint16 indices,
// int32 output), which SSE2 emulates; 2.3x faster widening uint16 to int32,
// 5.6x checking uint16 as stored (one core, from cache).
template <typename Stored, typename Out, bool kWrite>
__attribute__((target("avx2"))) bool convert_in_range_avx2(const Stored* __restrict stored, Out* __restrict out,
                                                           int64_t count, int64_t num_cols) {
  return convert_in_range<Stored, Out, kWrite>(stored, out, count, num_cols);
}
#endif

template <typename Stored, typename Out, bool kWrite>
bool convert_in_range_here(const Stored* stored, Out* out, int64_t count, int64_t num_cols) {
#ifdef TORCH_SHARDS_CPU_DISPATCH
  if (core::cpu_has_avx2()) return convert_in_range_avx2<Stored, Out, kWrite>(stored, out, count, num_cols);
#endif
  return convert_in_range<Stored, Out, kWrite>(stored, out, count, num_cols);
}

// convert_in_range (`out` null, Out the stored type: checked only), and a
// value out of range looked for as stored and named.
template <typename Stored, typename Out>
void convert_columns(const Stored* stored, Out* out, int64_t count, int64_t num_cols, const Array& indices) {
  if (count == 0) return;
  bool in_range = false;
  if constexpr (std::is_same_v<Stored, Out>) {
    in_range = out == nullptr ? convert_in_range_here<Stored, Out, false>(stored, out, count, num_cols)
                              : convert_in_range_here<Stored, Out, true>(stored, out, count, num_cols);
  } else {
    in_range = convert_in_range_here<Stored, Out, true>(stored, out, count, num_cols);
  }
  if (in_range) return;
  for (int64_t i = 0; i < count; ++i) {
    const bool below = std::is_signed_v<Stored> && stored[i] < 0;
    if (below || static_cast<uint64_t>(stored[i]) >= static_cast<uint64_t>(num_cols)) {
      // Printed as numbers (not int8 characters), unsigned ones above INT64_MAX too.
      using Printed = std::conditional_t<std::is_signed_v<Stored>, int64_t, uint64_t>;
      throw ReadError(concat(indices.where(), ": column index ", static_cast<Printed>(stored[i]), " out of range [0, ",
                             num_cols, ")"));
    }
  }
}

// Calls use(stored as a pointer to its integer type).
template <typename Use>
void with_stored_type(const uint8_t* stored, DType dtype, Use&& use) {
  switch (dtype) {
    case DType::kInt8:
      return use(reinterpret_cast<const int8_t*>(stored));
    case DType::kUInt8:
      return use(stored);
    case DType::kInt16:
      return use(reinterpret_cast<const int16_t*>(stored));
    case DType::kUInt16:
      return use(reinterpret_cast<const uint16_t*>(stored));
    case DType::kInt32:
      return use(reinterpret_cast<const int32_t*>(stored));
    case DType::kUInt32:
      return use(reinterpret_cast<const uint32_t*>(stored));
    case DType::kInt64:
      return use(reinterpret_cast<const int64_t*>(stored));
    default:
      return use(reinterpret_cast<const uint64_t*>(stored));
  }
}

constexpr size_t kGatherSegments = 2;               // segments per stretch from which they are read gathered
constexpr size_t kGatherBytes = size_t{256} << 10;  // staged at a time: they stay in the L2 cache until copied out
constexpr size_t kGroupBytes = size_t{128} << 10;   // read_groups' groups: in cache, and several per fetch to spread
constexpr int64_t kPartGroups = 4;                  // read_gathered's parts: staged groups each, at least
constexpr int64_t kPartsPerThread = 4;              // and at most this many per thread

// The stretches of source elements a plan's segments cover, each segment's
// elements placed after the previous one's: a read of these lays the planned
// values out in source order, segment after segment. Adjacent segments join
// into stretches of up to `most` elements (a fetch of every row would
// otherwise be one stretch, staged whole and read by one thread).
std::vector<Segment> source_stretches(const std::vector<Segment>& segments, int64_t most) {
  std::vector<Segment> stretches;
  int64_t staged = 0;
  for (const Segment& segment : segments) {
    if (!stretches.empty() && segment.source == stretches.back().source + stretches.back().length &&
        stretches.back().length < most) {
      stretches.back().length += segment.length;
    } else {
      stretches.push_back(Segment{segment.source, segment.length, staged});
    }
    staged += segment.length;
  }
  return stretches;
}

// Where read_gathered puts a segment: `staged` holds its elements.
using PlaceSegment = core::FunctionRef<void(const uint8_t* staged, const Segment& segment)>;

// The output read_gathered's segments are placed in (segment.dest counts elements of element_bytes from
// base), for asking for their lines ahead; none: nothing asked for.
struct PlacedOutput {
  uint8_t* base = nullptr;
  size_t element_bytes = 0;
};

// A shuffled fetch's segments (a row each, a few hundred bytes) land at scattered places of an output of
// several MB, which the caches no longer hold (a DataLoader worker's slabs cycle through tens of MB
// before one is written again): each line written first waits for its read for ownership. The lines of
// the segment this many ahead are asked for meanwhile (CSR .h5ad at batch 256: 13-17% less CPU for a
// fetch, in-process and in a worker).
constexpr size_t kSegmentsAhead = 8;

void prefetch_for_writing(const PlacedOutput& output, const Segment& segment) {
  constexpr size_t kLine = 64;
  const uint8_t* first = output.base + static_cast<size_t>(segment.dest) * output.element_bytes;
  const uint8_t* last = first + static_cast<size_t>(segment.length) * output.element_bytes;
  for (const uint8_t* line = first; line < last; line += kLine) __builtin_prefetch(line, 1, 3);
}

// The `length` elements from element `at` of a stretch held by `pieces` (piece
// p holds element `at` and starts at element `piece_begin`): where they lie
// when piece p holds them all, else copied whole into `joined` (a row across
// two chunks).
const uint8_t* elements_in_place(const std::vector<Array::InPlace>& pieces, size_t p, int64_t piece_begin, int64_t at,
                                 int64_t length, size_t element_bytes, core::ScratchBuffer& joined) {
  if (at + length <= piece_begin + pieces[p].rows) return pieces[p].bytes + (at - piece_begin) * element_bytes;
  uint8_t* whole = joined.get(static_cast<size_t>(length) * element_bytes);
  for (int64_t done = 0, begin = piece_begin; done < length; begin += pieces[p++].rows) {
    const int64_t from = at + done - begin, take = std::min(length - done, pieces[p].rows - from);
    std::memcpy(whole + done * element_bytes, pieces[p].bytes + from * element_bytes,
                static_cast<size_t>(take) * element_bytes);
    done += take;
  }
  return whole;
}

// Reads `segments` (sorted by source) of `array` through source order: a
// shuffled fetch's rows are as many segments as rows, each a read of its own;
// `stretches` (source_stretches of them) are one read per block of rows. Each
// segment is handed to `place` (on any of the pool's threads: segments do not
// overlap) where it is stored, when the array lies raw in a mapped file
// (Array::find_in_place: the bytes are copied once, into place), else from a
// few stretches at a time read into memory that stays in cache (CSR .h5ad of
// 200k rows, alternated pairs against staging every stretch: 13-17% less CPU
// an epoch at batch 4096 in-process; at batch 256 the same in-process, 6-12%
// less in DataLoader workers).
//
// With helpers, the stretches are cut into parts, each read and placed whole by
// one thread: one parallel_for per call. A parallel_for per staged group woke
// the helpers every 256 KB, and the placing between reads ran on one thread (a
// CSR fetch of 65,536 rows on 2 CPUs: two threads handing the CPU to each other
// every 50-100 us while the other CPU idled).
void read_gathered(const Array& array, const std::vector<Segment>& segments, const std::vector<Segment>& stretches,
                   core::ThreadPool& pool, PlaceSegment place, PlacedOutput output = {}) {
  if (stretches.empty()) return;
  const size_t element_bytes = array.row_bytes();
  const auto group_elements = static_cast<int64_t>(std::max<size_t>(1, kGatherBytes / element_bytes));
  // Parts of about kPartGroups groups, up to kPartsPerThread per thread (the threads finish together).
  const int64_t total = stretches.back().dest + stretches.back().length;
  const int64_t threads = pool.num_threads() + 1;
  const int64_t parts = std::clamp<int64_t>(total / (kPartGroups * group_elements), 1, kPartsPerThread * threads);
  const int64_t part_elements = (total + parts - 1) / parts;
  // Part p: stretches [first_stretch[p], first_stretch[p + 1]), their segments from first_segment[p].
  std::vector<size_t> first_stretch{0}, first_segment{0};
  int64_t staged = 0;  // where segment `s` starts in the source-order layout
  for (size_t t = 1, s = 0; t < stretches.size(); ++t) {
    if (stretches[t].dest < static_cast<int64_t>(first_stretch.size()) * part_elements) continue;
    for (; staged < stretches[t].dest; ++s) staged += segments[s].length;
    first_stretch.push_back(t);
    first_segment.push_back(s);
  }
  first_stretch.push_back(stretches.size());
  core::ThreadPool inline_pool(0);  // a part is read on one thread
  pool.parallel_for(static_cast<int64_t>(first_stretch.size()) - 1, [&](int64_t part) {
    thread_local core::ScratchBuffer staging, joined;
    thread_local std::vector<Segment> group;
    std::vector<Array::InPlace> pieces;  // not kept per thread: they hold their files open
    size_t next = first_segment[part];   // the first segment not yet placed
    const auto place_next = [&](const uint8_t* elements) {
      if (output.base != nullptr && next + kSegmentsAhead < segments.size()) {
        prefetch_for_writing(output, segments[next + kSegmentsAhead]);
      }
      place(elements, segments[next]);
      return segments[next++].length;
    };
    const size_t end = first_stretch[part + 1];
    for (size_t first = first_stretch[part]; first < end;) {
      const Segment& stretch = stretches[first];
      if (array.find_in_place(stretch.source, stretch.length, pieces)) {
        array.use_in_place(stretch.source, stretch.length, [&] {
          size_t p = 0;
          for (int64_t at = 0, piece_begin = 0; at < stretch.length;) {
            while (at >= piece_begin + pieces[p].rows) piece_begin += pieces[p++].rows;
            at +=
                place_next(elements_in_place(pieces, p, piece_begin, at, segments[next].length, element_bytes, joined));
          }
        });
        ++first;
        continue;
      }
      // Stretches [first, last): elements [begin, begin + staged_elements) of the source-order layout, staged
      // from 0.
      const int64_t begin = stretch.dest;
      group.clear();
      size_t last = first;
      for (; last < end && (last == first || stretches[last].dest - begin < group_elements); ++last) {
        group.push_back(Segment{stretches[last].source, stretches[last].length, stretches[last].dest - begin});
      }
      const int64_t staged_elements = group.back().dest + group.back().length;
      uint8_t* staged_at = staging.get(static_cast<size_t>(staged_elements) * element_bytes);
      array.read(group, staged_at, inline_pool);
      for (int64_t at = 0; at < staged_elements;) at += place_next(staged_at + at * element_bytes);
      first = last;
    }
  });
}

// The plan's segments with plan row k's values moved to start at element
// starts[k] (split where rows end, still sorted by source; merged again where
// consecutive rows stay together).
std::vector<Segment> placed_segments(const CsrPlan& plan, const std::vector<int64_t>& starts) {
  const std::vector<int64_t>& offsets = plan.row_offsets;
  std::vector<Segment> placed;
  placed.reserve(plan.segments.size());
  for (size_t s = 0; s < plan.segments.size(); ++s) {
    const Segment& segment = plan.segments[s];
    int64_t source = segment.source, dest = segment.dest, left = segment.length;
    for (auto row = static_cast<size_t>(plan.segment_rows[s]); left > 0; ++row) {
      const int64_t take = std::min(left, offsets[row + 1] - dest);
      if (take == 0) continue;  // an empty row
      const int64_t to = starts[row] + (dest - offsets[row]);
      if (!placed.empty() && placed.back().source + placed.back().length == source &&
          placed.back().dest + placed.back().length == to) {
        placed.back().length += take;
      } else {
        placed.push_back(Segment{source, take, to});
      }
      source += take;
      dest += take;
      left -= take;
    }
  }
  return placed;
}

}  // namespace

void CsrMatrix::convert_indices(const uint8_t* raw, int64_t count, DType index_dtype, void* out) const {
  const DType stored = indices_->info().dtype;
  if (index_dtype != DType::kInt32 && index_dtype != DType::kInt64 && index_dtype != stored) {
    throw std::logic_error(
        concat(where(), ": column indices stored as ", dtype_name(stored), " read as ", dtype_name(index_dtype)));
  }
  if (out == raw && index_dtype == stored) out = nullptr;  // as stored, in place: checked only
  with_stored_type(raw, stored, [&](const auto* typed) {
    using Stored = std::remove_const_t<std::remove_pointer_t<decltype(typed)>>;
    if (index_dtype == DType::kInt32) {
      convert_columns(typed, static_cast<int32_t*>(out), count, num_cols_, *indices_);
    } else if (index_dtype == DType::kInt64) {
      convert_columns(typed, static_cast<int64_t*>(out), count, num_cols_, *indices_);
    } else {  // kept as stored
      convert_columns<Stored, Stored>(typed, static_cast<Stored*>(out), count, num_cols_, *indices_);
    }
  });
}

void CsrMatrix::read(const CsrPlan& plan, void* indices_out, DType index_dtype, void* values_out,
                     core::ThreadPool& pool) const {
  read_rows(plan, nullptr, indices_out, index_dtype, values_out, pool);
}

void CsrMatrix::read_placed(const CsrPlan& plan, const std::vector<int64_t>& starts, void* indices_out,
                            DType index_dtype, void* values_out, core::ThreadPool& pool) const {
  if (starts.size() + 1 != plan.row_offsets.size() || plan.segment_rows.size() != plan.segments.size()) {
    throw std::logic_error(concat(where(), ": read_placed got ", starts.size(), " row starts for ",
                                  plan.row_offsets.size() - 1, " planned rows (or a plan not made by plan())"));
  }
  read_rows(plan, &starts, indices_out, index_dtype, values_out, pool);
}

namespace {

// Behind URLs: what a read of `segments` needs of the values and of the indices that is not open yet
// (zarr shards), opened at once (each a wait on round trips), not one after the other as each array is
// read.
void open_together(const Array& data, const Array& indices, const std::vector<Segment>& segments) {
  if (data.opens_for(segments) && indices.opens_for(segments)) {
    core::run_waiting_tasks(2, [&](int64_t part) { (part == 0 ? data : indices).open_for(segments); });
  }
}

}  // namespace

void CsrMatrix::read_rows(const CsrPlan& plan, const std::vector<int64_t>* starts, void* indices_out, DType index_dtype,
                          void* values_out, core::ThreadPool& pool) const {
  const int64_t nnz = plan.nnz();
  const DType stored = indices_->info().dtype;
  const std::vector<Segment> placed = starts ? placed_segments(plan, *starts) : std::vector<Segment>{};
  const std::vector<Segment>& segments = starts ? placed : plan.segments;
  open_together(*data_, *indices_, segments);
  // (A shuffled fetch's segments are read gathered: see read_gathered. Arrays behind URLs are read in
  // one call each, values and indices at once: each call costs round trips.)
  const size_t widest = std::max(dtype_size(data_->info().dtype), dtype_size(stored));
  const std::vector<Segment> stretches = source_stretches(segments, static_cast<int64_t>(kGatherBytes / widest));
  const bool remote = this->remote();
  const bool gathered = !remote && stretches.size() * kGatherSegments <= segments.size();
  const auto read_values = [&] {
    if (!gathered) return data_->read(segments, values_out, pool);
    const size_t element_bytes = data_->row_bytes();
    auto* out = static_cast<uint8_t*>(values_out);
    read_gathered(
        *data_, segments, stretches, pool,
        [&](const uint8_t* staged, const Segment& segment) {
          std::memcpy(out + segment.dest * element_bytes, staged, segment.length * element_bytes);
        },
        PlacedOutput{out, element_bytes});
  };
  const bool direct = stored == index_dtype;
  // Behind URLs, values and indices are requested at once, each on a thread of its own (the first
  // reads of a cold cache wait there for whole objects: both downloads run together).
  const auto read_remote = [&](void* values, void* raw_indices) {
    core::run_waiting_tasks(2, [&](int64_t part) {
      if (part == 0) {
        data_->read(segments, values, pool);
      } else {
        indices_->read(segments, raw_indices, pool);
      }
    });
  };
  if (!remote) read_values();
  if (starts != nullptr && remote) {
    // Placed rows from arrays behind URLs: the indices read in one call into a staging laid out as the
    // output, then each segment converted (or copied) and checked into place.
    const size_t stored_bytes = dtype_size(stored), out_bytes = dtype_size(index_dtype);
    int64_t extent = 0;
    for (const Segment& segment : segments) extent = std::max(extent, segment.dest + segment.length);
    thread_local core::ScratchBuffer placed_staging;
    uint8_t* staged = placed_staging.get(static_cast<size_t>(extent) * stored_bytes);
    read_remote(values_out, staged);
    for (const Segment& segment : segments) {
      const uint8_t* from = staged + segment.dest * stored_bytes;
      uint8_t* out = static_cast<uint8_t*>(indices_out) + segment.dest * out_bytes;
      convert_indices(from, segment.length, index_dtype, out);
    }
    return;
  }
  if (starts != nullptr || gathered) {
    // Each segment's indices are checked as they are copied (or converted)
    // into place, in one pass: placed rows are not one stretch of the
    // output, and the output of a large shuffled fetch (tens of MB at batch
    // 4096) would otherwise be read from memory again to be checked (5-9% of
    // an epoch at that batch).
    const size_t out_bytes = dtype_size(index_dtype);
    auto* out = static_cast<uint8_t*>(indices_out);
    read_gathered(
        *indices_, segments, stretches, pool,
        [&](const uint8_t* staged, const Segment& segment) {
          convert_indices(staged, segment.length, index_dtype, out + segment.dest * out_bytes);
        },
        PlacedOutput{out, out_bytes});
    return;
  }
  thread_local core::ScratchBuffer staging;  // stored indices of another width, converted below
  uint8_t* raw =
      direct ? static_cast<uint8_t*>(indices_out) : staging.get(static_cast<size_t>(nnz) * dtype_size(stored));
  if (remote) {
    read_remote(values_out, raw);
  } else {
    indices_->read(segments, raw, pool);
  }
  convert_indices(raw, nnz, index_dtype, indices_out);
}

void CsrMatrix::read_groups(const CsrPlan& plan, DType index_dtype, core::ThreadPool& pool, GroupVisitor visit) const {
  const std::vector<Segment>& segments = plan.segments;
  for (size_t s = 1; s < segments.size(); ++s) {
    if (segments[s].dest < segments[s - 1].dest + segments[s - 1].length) {
      throw std::logic_error(concat(where(), ": read_groups needs a plan of rows in ascending order"));
    }
  }
  open_together(*data_, *indices_, segments);
  // Groups of about kGroupBytes of stored values and indices, cut between
  // segments (a cut inside one decodes the chunk it falls in twice) unless
  // a segment is much longer.
  const size_t value_bytes = dtype_size(data_->info().dtype), stored_bytes = dtype_size(indices_->info().dtype);
  // Arrays behind URLs: one group (each read costs round trips).
  const bool remote = data_->remote() || indices_->remote();
  const auto target = remote ? std::numeric_limits<int64_t>::max() / 8
                             : static_cast<int64_t>(std::max<size_t>(1, kGroupBytes / (value_bytes + stored_bytes)));
  const auto rows = static_cast<int64_t>(plan.row_offsets.size()) - 1;
  std::vector<int64_t> cuts{0};
  size_t s = 0;  // the first segment ending after the current row's end
  for (int64_t row = 1; row <= rows; ++row) {
    const int64_t at = plan.row_offsets[row], size = at - plan.row_offsets[cuts.back()];
    while (s < segments.size() && segments[s].dest + segments[s].length <= at) ++s;
    const bool between = s == segments.size() || segments[s].dest >= at;
    if (row == rows || (size >= target && between) || size >= 4 * target) cuts.push_back(row);
  }
  pool.parallel_for(static_cast<int64_t>(cuts.size()) - 1, [&](int64_t group) {
    const int64_t begin = plan.row_offsets[cuts[group]], end = plan.row_offsets[cuts[group + 1]];
    thread_local std::vector<Segment> parts;  // the segments' parts within [begin, end), placed from 0
    parts.clear();
    auto segment = std::partition_point(segments.begin(), segments.end(),
                                        [&](const Segment& x) { return x.dest + x.length <= begin; });
    for (; segment != segments.end() && segment->dest < end; ++segment) {
      const int64_t low = std::max(segment->dest, begin), high = std::min(segment->dest + segment->length, end);
      parts.push_back(Segment{segment->source + (low - segment->dest), high - low, low - begin});
    }
    thread_local core::ScratchBuffer values, raw, converted;
    const auto count = static_cast<size_t>(end - begin);
    core::ThreadPool inline_pool(0);  // a group is read on one thread
    uint8_t* staged_values = values.get(count * value_bytes);
    uint8_t* staged_raw = raw.get(count * stored_bytes);
    data_->read(parts, staged_values, inline_pool);
    indices_->read(parts, staged_raw, inline_pool);
    const bool as_stored = index_dtype == indices_->info().dtype;
    uint8_t* indices = as_stored ? staged_raw : converted.get(count * dtype_size(index_dtype));
    convert_indices(staged_raw, end - begin, index_dtype, indices);
    visit(cuts[group], cuts[group + 1], indices, staged_values);
  });
}

}  // namespace torch_shards::io
