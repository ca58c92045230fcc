#include "io/array.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/errors.h"
#include "core/radix_sort.h"
#include "core/scratch_buffer.h"
#include "core/streaming_copy.h"
#include "io/codecs.h"

namespace torch_shards::io {

using core::concat;

Array::Array(ArrayInfo info) : info_(std::move(info)) {
  // Shapes come from files: the whole array must be addressable in bytes
  // (as numpy, h5py and zarr require), so no size computed from it overflows.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (size_t d = 0; d < info_.shape.size(); ++d) {
    if (info_.shape[d] < 0) throw core::ReadError(concat(where(), ": dimension ", d, " is ", info_.shape[d]));
  }
  int64_t row_bytes = static_cast<int64_t>(dtype_size(info_.dtype));
  for (size_t d = 1; d < info_.shape.size(); ++d) {
    const int64_t extent = info_.shape[d];
    if (extent != 0 && (row_elements_ > kMax / extent || row_bytes > kMax / extent)) {
      throw core::ReadError(
          concat(where(), ": rows of more than 2^63 bytes (dimension ", d, " is ", extent, "; corrupt metadata?)"));
    }
    row_elements_ *= extent;
    row_bytes *= extent;
  }
  if (row_bytes != 0 && num_rows() > kMax / row_bytes) {
    throw core::ReadError(concat(where(), ": ", num_rows(), " rows of ", row_bytes,
                                 " bytes make more than 2^63 bytes (corrupt metadata?)"));
  }
}

void Array::read(const std::vector<Segment>& segments, void* out, core::ThreadPool& pool) const {
  const int64_t rows = num_rows();
  for (const Segment& segment : segments) {
    if (segment.source < 0 || segment.length < 0 || segment.source + segment.length > rows) {  // where() allocates
      throw core::InvalidArgument(concat(where(), ": rows [", segment.source, ", ", segment.source + segment.length,
                                         ") outside [0, ", rows, ")"));
    }
  }
  if (segments.empty() || row_bytes() == 0) return;
  auto* bytes = static_cast<uint8_t*>(out);
  read_raw(segments, bytes, pool);
  const size_t unit = dtype_swap_unit(info_.dtype);
  const bool swap = info_.big_endian && unit > 1;
  const bool boolean = info_.dtype == DType::kBool;
  if (!swap && !boolean) return;
  const size_t row_size = row_bytes();
  for (const Segment& segment : segments) {
    uint8_t* first = bytes + segment.dest * row_size;
    const size_t size = static_cast<size_t>(segment.length) * row_size;
    if (swap) codecs::byteswap(first, size / unit, unit);
    if (boolean) {
      for (size_t i = 0; i < size; ++i) first[i] = first[i] != 0;
    }
  }
}

bool Array::find_in_place(int64_t source, int64_t length, std::vector<InPlace>& pieces) const {
  pieces.clear();
  if (source < 0 || length <= 0 || source + length > num_rows() || row_bytes() == 0) return false;
  if ((info_.big_endian && dtype_swap_unit(info_.dtype) > 1) || info_.dtype == DType::kBool) return false;
  if (find_raw_in_place(source, length, pieces)) return true;
  pieces.clear();
  return false;
}

void Array::use_in_place(int64_t source, int64_t length, core::FunctionRef<void()> work) const {
  if (!run_guarded(work)) {
    throw core::ReadError(concat(where(), ": reading rows [", source, ", ", source + length,
                                 ") failed: the file shrank or its storage failed while mapped"));
  }
}

std::vector<uint8_t> Array::read_range(int64_t begin, int64_t end, core::ThreadPool& pool) const {
  std::vector<uint8_t> out(static_cast<size_t>(end - begin) * row_bytes());
  read({Segment{begin, end - begin, 0}}, out.data(), pool);
  return out;
}

std::vector<Segment> segments_for_rows(const std::vector<int64_t>& rows, const std::vector<int64_t>& dests,
                                       const std::vector<int64_t>* sorted) {
  // Kept per thread (a leaf: nothing else runs on this thread while they are in use).
  thread_local std::vector<int64_t> order, scratch;
  if (sorted == nullptr) {
    if (std::is_sorted(rows.begin(), rows.end())) {
      order.resize(rows.size());
      std::iota(order.begin(), order.end(), 0);
    } else {
      core::sort_positions_by_row(rows, order, scratch);
    }
    sorted = &order;
  }
  std::vector<Segment> segments;
  for (int64_t i : *sorted) {
    if (!segments.empty()) {
      Segment& last = segments.back();
      if (rows[i] == last.source + last.length && dests[i] == last.dest + last.length) {
        ++last.length;
        continue;
      }
    }
    segments.push_back(Segment{rows[i], 1, dests[i]});
  }
  return segments;
}

std::vector<Segment> segments_in_delivery_order(const std::vector<int64_t>& rows, const std::vector<int64_t>* sorted) {
  std::vector<int64_t> dests(rows.size());
  std::iota(dests.begin(), dests.end(), 0);
  return segments_for_rows(rows, dests, sorted);
}

std::vector<Span> plan_spans(const std::vector<Segment>& segments, size_t row_bytes, size_t max_gap_bytes,
                             size_t max_span_bytes) {
  std::vector<Span> spans;
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& segment = segments[i];
    const int64_t end = segment.source + segment.length;
    if (!spans.empty()) {
      Span& span = spans.back();
      const int64_t gap = std::max<int64_t>(0, segment.source - span.end);
      const int64_t new_end = std::max(span.end, end);
      if (static_cast<size_t>(gap) * row_bytes <= max_gap_bytes &&
          static_cast<size_t>(new_end - span.begin) * row_bytes <= max_span_bytes) {
        span.end = new_end;
        span.last = i + 1;
        continue;
      }
    }
    spans.push_back(Span{segment.source, end, i, i + 1});
  }
  return spans;
}

namespace {

// Copies each segment of `span` from the span's bytes to its place in out.
void copy_span_segments(const Span& span, const std::vector<Segment>& segments, size_t row_bytes,
                        const uint8_t* bytes_of_span, uint8_t* out, bool streaming) {
  for (size_t i = span.first; i < span.last; ++i) {
    const Segment& segment = segments[i];
    core::copy_bytes(out + segment.dest * row_bytes, bytes_of_span + (segment.source - span.begin) * row_bytes,
                     static_cast<size_t>(segment.length) * row_bytes, streaming);
  }
  if (streaming) core::streaming_fence();
}

}  // namespace

void read_span(const File& file, int64_t region_offset, const Span& span, const std::vector<Segment>& segments,
               size_t row_bytes, uint8_t* out, core::FunctionRef<std::string()> what, bool streaming) {
  const int64_t offset = region_offset + span.begin * static_cast<int64_t>(row_bytes);
  const size_t bytes = static_cast<size_t>(span.end - span.begin) * row_bytes;
  const Segment& first = segments[span.first];
  if (span.last == span.first + 1 && first.source == span.begin && first.length == span.end - span.begin) {
    file.read_at(offset, bytes, out + first.dest * row_bytes, what, streaming);
    return;
  }
  // Mapped: no request cost, every segment straight from the mapping to its place, under one
  // guard and one fence for the span (a fence per row would wait on every row's stores).
  const auto copy_segments = [&](const uint8_t* bytes_of_span) {
    copy_span_segments(span, segments, row_bytes, bytes_of_span, out, streaming);
  };
  if (file.use_mapped(offset, bytes, copy_segments, what)) return;
  thread_local core::ScratchBuffer scratch;
  uint8_t* buffer = scratch.get(bytes);
  file.read_at(offset, bytes, buffer, what);
  copy_segments(buffer);
}

void read_spans_together(const File& file, int64_t region_offset, const std::vector<Span>& spans,
                         const std::vector<Segment>& segments, size_t row_bytes, uint8_t* out,
                         core::FunctionRef<std::string()> what) {
  std::vector<std::vector<uint8_t>> buffers(spans.size());
  std::vector<File::Range> ranges(spans.size());
  for (size_t s = 0; s < spans.size(); ++s) {
    buffers[s].resize(static_cast<size_t>(spans[s].end - spans[s].begin) * row_bytes);
    ranges[s] = {region_offset + spans[s].begin * static_cast<int64_t>(row_bytes), buffers[s].size(),
                 buffers[s].data()};
  }
  file.read_ranges(ranges, what);
  for (size_t s = 0; s < spans.size(); ++s)
    copy_span_segments(spans[s], segments, row_bytes, buffers[s].data(), out, false);
}

bool streams_output(const std::vector<Segment>& segments, size_t row_bytes) {
  int64_t rows = 0;
  for (const Segment& segment : segments) rows += segment.length;
  return core::streams(static_cast<size_t>(rows) * row_bytes, row_bytes);
}

MemoryArray::MemoryArray(ArrayInfo info, std::vector<uint8_t> bytes)
    : Array(std::move(info)), bytes_(std::move(bytes)) {
  const size_t expected = static_cast<size_t>(num_rows()) * row_bytes();
  if (bytes_.size() != expected) {
    throw core::ReadError(concat(where(), ": holds ", bytes_.size(), " bytes, expected ", expected));
  }
}

void MemoryArray::read_raw(const std::vector<Segment>& segments, uint8_t* out, core::ThreadPool&) const {
  const size_t row_size = row_bytes();
  for (const Segment& segment : segments) {
    std::memcpy(out + segment.dest * row_size, bytes_.data() + segment.source * row_size, segment.length * row_size);
  }
}

}  // namespace torch_shards::io
