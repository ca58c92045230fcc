#include "io/chunked_array.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>

#include "core/errors.h"
#include "core/scratch_buffer.h"
#include "core/waiting_tasks.h"
#include "io/file.h"

namespace torch_shards::io {

using core::concat;
using core::ReadError;

namespace {

// This thread's T, kept from one use to the next (a read runs once per fetch
// and field: its lists need not be allocated every time), or a fresh one while
// a caller up this thread's stack holds it (a read nested in another's task).
template <typename T>
class Reused {
 public:
  Reused() : nested_(in_use()) { in_use() = true; }
  ~Reused() { in_use() = nested_; }
  Reused(const Reused&) = delete;
  Reused& operator=(const Reused&) = delete;
  T& get() {  // empty
    if (nested_) return own_;
    thread_local T kept;
    kept.clear();
    return kept;
  }

 private:
  static bool& in_use() {
    thread_local bool flag = false;
    return flag;
  }
  bool nested_;
  T own_;
};

std::string format_coords(const std::vector<int64_t>& coords) {
  std::string text = "(";
  for (size_t i = 0; i < coords.size(); ++i) text += (i ? ", " : "") + std::to_string(coords[i]);
  return text + (coords.size() == 1 ? ",)" : ")");
}

}  // namespace

std::string ChunkStore::describe_chunk(const std::vector<int64_t>& coords) const {
  return "chunk " + format_coords(coords);
}

std::optional<ChunkLocation> ChunkStore::locate(const std::vector<int64_t>& coords) const {
  throw std::logic_error("this chunk store cannot locate " + describe_chunk(coords));
}

std::vector<std::optional<std::vector<uint8_t>>> ChunkStore::read_chunks(
    const std::vector<std::vector<int64_t>>& coords, core::ThreadPool& /*pool*/) const {
  std::vector<std::optional<std::vector<uint8_t>>> out(coords.size());
  if (!can_locate()) {
    for (size_t i = 0; i < coords.size(); ++i) out[i] = read_chunk(coords[i]);
    return out;
  }
  // By file: each file's ranges requested together.
  std::map<const File*, std::vector<File::Range>> by_file;
  std::map<const File*, std::shared_ptr<const File>> files;
  for (size_t i = 0; i < coords.size(); ++i) {
    const std::optional<ChunkLocation> location = locate(coords[i]);
    if (!location) continue;
    out[i].emplace(static_cast<size_t>(location->size));
    by_file[location->file.get()].push_back({location->offset, static_cast<size_t>(location->size), out[i]->data()});
    files[location->file.get()] = location->file;
  }
  // The files at once, each on a thread of its own (each read waits on its own round trips).
  std::vector<std::pair<const File*, const std::vector<File::Range>*>> reads;
  for (const auto& [file, ranges] : by_file) reads.emplace_back(file, &ranges);
  core::run_waiting_tasks(static_cast<int64_t>(reads.size()), [&](int64_t k) {
    const auto& [file, ranges] = reads[static_cast<size_t>(k)];
    file->read_ranges(*ranges, [&] { return concat(ranges->size(), " chunks"); });
  });
  return out;
}

ChunkedArray::ChunkedArray(ArrayInfo info, std::vector<int64_t> chunk_shape, std::shared_ptr<const ChunkStore> store,
                           std::shared_ptr<const ChunkDecoder> decoder, std::vector<uint8_t> fill_value)
    : Array(std::move(info)),
      chunk_shape_(std::move(chunk_shape)),
      store_(std::move(store)),
      decoder_(std::move(decoder)),
      fill_value_(std::move(fill_value)) {
  const auto& shape = info_.shape;
  if (chunk_shape_.size() != shape.size() || shape.empty()) {
    throw ReadError(
        concat(where(), ": chunk shape has ", chunk_shape_.size(), " dimensions but the array has ", shape.size()));
  }
  // Chunk shapes come from files: a chunk's bytes must fit in 63 bits (its
  // decode buffer is allocated only once a chunk's header confirms its size).
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t chunk_bytes = static_cast<int64_t>(dtype_size(info_.dtype));
  for (size_t d = 0; d < shape.size(); ++d) {
    if (chunk_shape_[d] < 1)
      throw ReadError(concat(where(), ": invalid chunk shape (dimension ", d, " is ", chunk_shape_[d], ")"));
    if (chunk_bytes > kMax / chunk_shape_[d]) {
      throw ReadError(
          concat(where(), ": chunks of more than 2^63 bytes (chunk dimension ", d, " is ", chunk_shape_[d], ")"));
    }
    chunk_bytes *= chunk_shape_[d];
    grid_.push_back(shape[d] / chunk_shape_[d] + (shape[d] % chunk_shape_[d] != 0));  // cannot overflow
    if (d > 0) {
      if (grid_.back() != 0 && inner_chunks_ > kMax / grid_.back()) {
        throw ReadError(concat(where(), ": more than 2^63 chunks per row of chunks"));
      }
      inner_chunks_ *= grid_.back();
    }
  }
  chunk_bytes_ = static_cast<size_t>(chunk_bytes);
  if (fill_value_.size() != dtype_size(info_.dtype)) fill_value_.assign(dtype_size(info_.dtype), 0);
  whole_rows_ = inner_chunks_ == 1 && std::equal(chunk_shape_.begin() + 1, chunk_shape_.end(), shape.begin() + 1);
}

void ChunkedArray::read_raw_chunk_rows(int64_t chunk_row, const std::vector<const Segment*>& touching, uint8_t* out,
                                       bool streaming) const {
  const size_t row_size = row_bytes();
  const int64_t first_row = chunk_row * chunk_shape_[0];
  const int64_t end_row = first_row + std::min(chunk_shape_[0], num_rows() - first_row);  // no overflow at 2^63
  // The requested rows of this chunk, as segments relative to its first row.
  std::vector<Segment> pieces;
  for (const Segment* segment : touching) {
    const int64_t lo = std::max(segment->source, first_row), hi = std::min(segment->source + segment->length, end_row);
    pieces.push_back(Segment{lo - first_row, hi - lo, segment->dest + lo - segment->source});
  }
  std::sort(pieces.begin(), pieces.end(), [](const Segment& a, const Segment& b) { return a.source < b.source; });
  std::vector<int64_t> coords(info_.shape.size(), 0);
  coords[0] = chunk_row;
  std::optional<ChunkLocation> location;
  try {
    location = store_->locate(coords);
  } catch (const ReadError&) {
    throw;
  } catch (const std::exception& error) {
    throw ReadError(concat(where(), ": ", store_->describe_chunk(coords), ": ", error.what()));
  }
  if (!location) {  // never written: the fill value
    const size_t item = fill_value_.size();
    for (const Segment& piece : pieces) {
      uint8_t* dest = out + piece.dest * row_size;
      for (size_t i = 0; i < static_cast<size_t>(piece.length) * row_size; i += item) {
        std::memcpy(dest + i, fill_value_.data(), item);
      }
    }
    return;
  }
  if (static_cast<size_t>(location->size) != chunk_bytes_) {
    throw ReadError(concat(where(), ": ", store_->describe_chunk(coords), ": stored chunk holds ", location->size,
                           " bytes, expected ", chunk_bytes_));
  }
  const auto what = [&] { return concat(info_.path, " ", store_->describe_chunk(coords)); };
  for (const Span& span : plan_spans(pieces, row_size, kMaxGapBytes, kMaxSpanBytes)) {
    read_span(*location->file, location->offset, span, pieces, row_size, out, what, streaming);
  }
}

bool ChunkedArray::find_raw_in_place(int64_t source, int64_t length, std::vector<InPlace>& pieces) const {
  if (!whole_rows_ || !decoder_->stores_raw() || !store_->can_locate() || !store_->locates_in_kept_files() ||
      store_->reads_together() || store_->opens_objects()) {
    return false;
  }
  const size_t row_size = row_bytes();
  thread_local std::vector<int64_t> coords;
  coords.assign(info_.shape.size(), 0);
  for (int64_t row = source, end = source + length; row < end;) {
    coords[0] = row / chunk_shape_[0];
    const int64_t first_row = coords[0] * chunk_shape_[0];
    const int64_t piece_end = std::min(end, first_row + chunk_shape_[0]);
    std::optional<ChunkLocation> location;
    try {
      location = store_->locate(coords);
    } catch (const std::exception&) {
      return false;  // the read by copy raises it, naming the chunk
    }
    if (!location || static_cast<size_t>(location->size) != chunk_bytes_) return false;  // a fill, or as above
    const uint8_t* bytes =
        location->file->mapped_bytes(location->offset + (row - first_row) * static_cast<int64_t>(row_size),
                                     static_cast<size_t>(piece_end - row) * row_size,
                                     [&] { return concat(info_.path, " ", store_->describe_chunk(coords)); });
    if (bytes == nullptr) return false;
    pieces.push_back(InPlace{std::move(location->file), bytes, piece_end - row});
    row = piece_end;
  }
  return true;
}

bool ChunkedArray::use_mapped_chunk(const std::vector<int64_t>& coords,
                                    core::FunctionRef<void(const uint8_t*, size_t)> use) const {
  if (!store_->maps_chunks() || store_->skipped_filters(coords) != 0) return false;
  const std::optional<ChunkLocation> location = store_->locate(coords);
  if (!location) return false;  // never written: the caller fills it
  const size_t size = static_cast<size_t>(location->size);
  return location->file->use_mapped(
      location->offset, size, [&](const uint8_t* bytes) { use(bytes, size); },
      [&] { return store_->describe_chunk(coords); });
}

int64_t chunk_count_capped(const std::vector<int64_t>& grid, int64_t cap) {
  int64_t chunks = 1;
  for (const int64_t extent : grid) chunks = extent > cap ? cap + 1 : std::min(chunks * extent, cap + 1);
  return chunks;
}

std::atomic<uint64_t>* ChunkedArray::checked_chunks() const {
  const int pid = current_process_id();
  if (checked_pid_.load(std::memory_order_acquire) != pid) {
    std::lock_guard<std::mutex> lock(first_use_mutex());
    if (checked_pid_.load(std::memory_order_relaxed) != pid) {
      const int64_t chunks = chunk_count_capped(grid_, kMaxCheckedChunks);
      checked_chunks_.reset(
          chunks > kMaxCheckedChunks ? nullptr : new std::atomic<uint64_t>[static_cast<size_t>(chunks + 63) / 64]());
      checked_pid_.store(pid, std::memory_order_release);
    }
  }
  return checked_chunks_.get();
}

bool ChunkedArray::decode_rows_from_mapping(const std::vector<int64_t>& coords, int64_t first_row, int64_t end_row,
                                            const std::vector<const Segment*>& touching, uint8_t* out) const {
  if (!store_->maps_chunks()) return false;  // before the bits are made: chunks read by copy are never trusted
  return decode_rows_from(
      coords, first_row, end_row, touching, out,
      [&](core::FunctionRef<void(const uint8_t*, size_t)> use) { return use_mapped_chunk(coords, use); });
}

bool ChunkedArray::decode_rows_from(
    const std::vector<int64_t>& coords, int64_t first_row, int64_t end_row, const std::vector<const Segment*>& touching,
    uint8_t* out, core::FunctionRef<bool(core::FunctionRef<void(const uint8_t*, size_t)>)> with_bytes) const {
  const size_t row_size = row_bytes();
  thread_local std::vector<codecs::ByteRange> ranges;
  ranges.clear();
  for (const Segment* segment : touching) {
    const int64_t lo = std::max(segment->source, first_row), hi = std::min(segment->source + segment->length, end_row);
    ranges.push_back(codecs::ByteRange{static_cast<size_t>(lo - first_row) * row_size,
                                       static_cast<size_t>(hi - first_row) * row_size,
                                       out + (segment->dest + lo - segment->source) * row_size});
  }
  // The chunk's bit (a mapping is read-only and lasts as long as the array:
  // a chunk checked once keeps its bytes).
  std::atomic<uint64_t>* const bits = checked_chunks();
  int64_t chunk = 0;
  for (size_t d = 0; d < coords.size(); ++d) chunk = chunk * grid_[d] + coords[d];
  std::atomic<uint64_t>* word = bits != nullptr ? &bits[static_cast<size_t>(chunk) / 64] : nullptr;
  const uint64_t bit = uint64_t{1} << (chunk % 64);
  const bool trusted = word != nullptr && (word->load(std::memory_order_relaxed) & bit) != 0;
  return with_bytes([&](const uint8_t* bytes, size_t size) {
    if (decoder_->decode_view_ranges(bytes, size, chunk_bytes_, ranges, trusted) && word != nullptr && !trusted) {
      word->fetch_or(bit, std::memory_order_relaxed);
    }
  });
}

void ChunkedArray::copy_row_part(const uint8_t* chunk, int64_t row_in_chunk, const std::vector<int64_t>& inner_coords,
                                 uint8_t* out_row) const {
  const size_t item = dtype_size(info_.dtype);
  const size_t dims = info_.shape.size();
  if (dims == 1) {
    std::memcpy(out_row, chunk + row_in_chunk * item, item);
    return;
  }
  // Strides (in elements) of the chunk's row block and of the output row.
  int64_t chunk_row_elements = 1;
  for (size_t d = 1; d < dims; ++d) chunk_row_elements *= chunk_shape_[d];
  const uint8_t* chunk_row = chunk + static_cast<size_t>(row_in_chunk * chunk_row_elements) * item;
  // Extent of this chunk inside the output row, per inner dimension.
  std::vector<int64_t> origin(dims), extent(dims);
  for (size_t d = 1; d < dims; ++d) {
    origin[d] = inner_coords[d - 1] * chunk_shape_[d];
    extent[d] = std::min(chunk_shape_[d], info_.shape[d] - origin[d]);
  }
  const size_t run_bytes = static_cast<size_t>(extent[dims - 1]) * item;
  std::vector<int64_t> index(dims, 0);  // over dimensions 1 .. dims-2
  for (;;) {
    int64_t chunk_offset = 0, out_offset = 0;
    for (size_t d = 1; d < dims; ++d) {
      const int64_t i = d + 1 < dims ? index[d] : 0;
      chunk_offset = chunk_offset * chunk_shape_[d] + i;
      out_offset = out_offset * info_.shape[d] + origin[d] + i;
    }
    std::memcpy(out_row + out_offset * item, chunk_row + chunk_offset * item, run_bytes);
    size_t d = dims - 2;
    while (d >= 1) {
      if (++index[d] < extent[d]) break;
      index[d] = 0;
      --d;
    }
    if (d == 0) return;
  }
}

std::vector<std::vector<int64_t>> ChunkedArray::chunks_of(const std::vector<Segment>& segments) const {
  std::vector<int64_t> chunk_rows;
  for (const Segment& segment : segments) {
    if (segment.length <= 0) continue;
    const int64_t last = (segment.source + segment.length - 1) / chunk_shape_[0];
    for (int64_t row = segment.source / chunk_shape_[0]; row <= last; ++row) {
      if (chunk_rows.empty() || chunk_rows.back() != row) chunk_rows.push_back(row);
    }
  }
  std::sort(chunk_rows.begin(), chunk_rows.end());
  chunk_rows.erase(std::unique(chunk_rows.begin(), chunk_rows.end()), chunk_rows.end());
  std::vector<std::vector<int64_t>> chunks;
  for (int64_t row : chunk_rows) {
    for (int64_t inner = 0; inner < inner_chunks_; ++inner) {
      std::vector<int64_t>& coords = chunks.emplace_back(info_.shape.size());
      coords[0] = row;
      for (size_t d = info_.shape.size() - 1, rest = static_cast<size_t>(inner); d >= 1; --d) {
        coords[d] = static_cast<int64_t>(rest) % grid_[d];
        rest /= static_cast<size_t>(grid_[d]);
      }
    }
  }
  return chunks;
}

bool ChunkedArray::opens_for(const std::vector<Segment>& segments) const {
  return store_->opens_objects() && store_->opens(chunks_of(segments));
}

void ChunkedArray::open_for(const std::vector<Segment>& segments) const {
  if (!store_->opens_objects()) return;
  try {
    store_->open(chunks_of(segments));
  } catch (const ReadError&) {
    throw;
  } catch (const std::exception& error) {
    throw ReadError(concat(where(), ": ", error.what()));
  }
}

void ChunkedArray::read_raw(const std::vector<Segment>& segments, uint8_t* out, core::ThreadPool& pool) const {
  // What the read needs that is not open yet, opened together first (behind URLs: each a wait).
  open_for(segments);
  const int64_t rows_per_chunk = chunk_shape_[0];
  const int64_t rows = num_rows();
  const size_t row_size = row_bytes();
  // (chunk row, segment) pairs, grouped by chunk row: each chunk decodes
  // once. The tasks below see the caller's lists through these references.
  Reused<std::vector<std::pair<int64_t, size_t>>> touches_of_thread;
  Reused<std::vector<size_t>> starts_of_thread;
  std::vector<std::pair<int64_t, size_t>>& touches = touches_of_thread.get();
  std::vector<size_t>& starts = starts_of_thread.get();  // where each chunk row begins in touches
  // The chunk row last found, [known_begin, known_end) its rows: segments in
  // source order mostly land in it again, and a division per segment end
  // (a 64-bit idiv) was 40% of this function with a row per segment.
  int64_t known = -1, known_begin = 0, known_end = 0;
  const auto chunk_of = [&](int64_t row) {
    if (row < known_begin || row >= known_end) {
      known = row / rows_per_chunk;
      known_begin = known * rows_per_chunk;
      known_end = known_begin + rows_per_chunk;
    }
    return known;
  };
  for (size_t s = 0; s < segments.size(); ++s) {
    const Segment& segment = segments[s];
    if (segment.length == 0) continue;
    const int64_t first = chunk_of(segment.source);
    for (int64_t c = first, last = chunk_of(segment.source + segment.length - 1); c <= last; ++c) {
      touches.emplace_back(c, s);
    }
  }
  if (!std::is_sorted(touches.begin(), touches.end())) {  // segments in source order touch chunks in order
    std::sort(touches.begin(), touches.end());
  }
  for (size_t i = 0; i < touches.size(); ++i) {
    if (i == 0 || touches[i].first != touches[i - 1].first) starts.push_back(i);
  }
  starts.push_back(touches.size());
  const int64_t chunk_rows = static_cast<int64_t>(starts.size()) - 1;
  const bool together = store_->reads_together();
  if (whole_rows_ && decoder_->stores_raw() && store_->can_locate() && !together) {
    const bool streaming = streams_output(segments, row_size);
    pool.parallel_for(chunk_rows, [&](int64_t group) {
      std::vector<const Segment*> touching;
      for (size_t t = starts[group]; t < starts[group + 1]; ++t) touching.push_back(&segments[touches[t].second]);
      read_raw_chunk_rows(touches[starts[group]].first, touching, out, streaming);
    });
    return;
  }

  // Only the rows wanted, into place: from a shard's mapping, or from the bytes fetched (behind URLs, a
  // chunk's bytes are those of the object stamped at open, every time: checked once, then trusted).
  const bool decodes_rows = whole_rows_ && decoder_->decodes_ranges();
  // The grid coordinates of task's chunk: chunk row `group`, inner chunk task % inner_chunks_.
  const auto coords_of = [&](int64_t task, std::vector<int64_t>& coords) {
    int64_t inner = task % inner_chunks_;
    coords.resize(info_.shape.size());
    coords[0] = touches[starts[task / inner_chunks_]].first;
    for (size_t d = info_.shape.size() - 1; d >= 1; --d) {
      coords[d] = inner % grid_[d];
      inner /= grid_[d];
    }
  };
  // Fetched together before decoding (ChunkStore::reads_together).
  std::vector<std::optional<std::vector<uint8_t>>> fetched;
  if (together) {
    std::vector<std::vector<int64_t>> all(static_cast<size_t>(chunk_rows * inner_chunks_));
    for (int64_t task = 0; task < chunk_rows * inner_chunks_; ++task) coords_of(task, all[static_cast<size_t>(task)]);
    try {
      fetched = store_->read_chunks(all, pool);
    } catch (const ReadError&) {
      throw;
    } catch (const std::exception& error) {
      throw ReadError(concat(where(), ": ", error.what()));
    }
  }
  pool.parallel_for(chunk_rows * inner_chunks_, [&](int64_t task) {
    const int64_t group = task / inner_chunks_;
    const int64_t chunk_row = touches[starts[group]].first;
    Reused<std::vector<int64_t>> coords_of_thread;
    std::vector<int64_t>& coords = coords_of_thread.get();
    coords_of(task, coords);
    const int64_t first_row = chunk_row * rows_per_chunk;
    const int64_t end_row = first_row + std::min(rows_per_chunk, rows - first_row);
    // A whole chunk wanted once, in one piece, decodes straight into the output.
    uint8_t* direct = nullptr;
    if (whole_rows_ && starts[group + 1] - starts[group] == 1 && end_row - first_row == rows_per_chunk) {
      const Segment& segment = segments[touches[starts[group]].second];
      if (segment.source <= first_row && segment.source + segment.length >= end_row) {
        direct = out + (segment.dest + first_row - segment.source) * row_size;
      }
    }
    thread_local core::ScratchBuffer buffer;
    uint8_t* decoded = nullptr;
    const auto reserve = [&] { return decoded = direct != nullptr ? direct : buffer.get(chunk_bytes_); };
    try {
      if (decodes_rows) {
        thread_local std::vector<const Segment*> touching;
        touching.clear();
        for (size_t t = starts[group]; t < starts[group + 1]; ++t) touching.push_back(&segments[touches[t].second]);
        if (together) {
          const std::optional<std::vector<uint8_t>>& bytes = fetched[static_cast<size_t>(task)];
          if (bytes && store_->skipped_filters(coords) == 0 &&
              decode_rows_from(coords, first_row, end_row, touching, out,
                               [&](core::FunctionRef<void(const uint8_t*, size_t)> use) {
                                 use(bytes->data(), bytes->size());
                                 return true;
                               })) {
            return;
          }
        } else if (decode_rows_from_mapping(coords, first_row, end_row, touching, out)) {
          return;
        }
      }
      const bool mapped =
          !together && decoder_->decodes_views() && use_mapped_chunk(coords, [&](const uint8_t* bytes, size_t size) {
            decoder_->decode_view(bytes, size, chunk_bytes_, reserve);
          });
      if (!mapped) {
        std::optional<std::vector<uint8_t>> encoded =
            together ? std::move(fetched[static_cast<size_t>(task)]) : store_->read_chunk(coords);
        if (encoded) {
          const uint32_t skipped = store_->skipped_filters(coords);
          decoder_->check_encoded(*encoded, chunk_bytes_, skipped);
          decoder_->decode(*encoded, reserve(), chunk_bytes_, skipped);
        } else {
          reserve();
          const size_t item = fill_value_.size();
          for (size_t i = 0; i < chunk_bytes_; i += item) std::memcpy(decoded + i, fill_value_.data(), item);
        }
      }
    } catch (const ReadError&) {
      throw;
    } catch (const std::exception& error) {
      throw ReadError(concat(where(), ": ", store_->describe_chunk(coords), ": ", error.what()));
    }
    if (direct != nullptr) return;
    const std::vector<int64_t> inner_coords(coords.begin() + 1, coords.end());
    for (size_t t = starts[group]; t < starts[group + 1]; ++t) {
      const Segment& segment = segments[touches[t].second];
      const int64_t lo = std::max(segment.source, first_row);
      const int64_t hi = std::min(segment.source + segment.length, end_row);
      uint8_t* dest = out + (segment.dest + lo - segment.source) * row_size;
      if (whole_rows_) {
        std::memcpy(dest, decoded + (lo - first_row) * row_size, (hi - lo) * row_size);
        continue;
      }
      for (int64_t row = lo; row < hi; ++row, dest += row_size) {
        copy_row_part(decoded, row - first_row, inner_coords, dest);
      }
    }
  });
}

}  // namespace torch_shards::io
