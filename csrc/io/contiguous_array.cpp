#include "contiguous_array.h"

#include <cstring>

#include "../core/errors.h"

namespace torch_shards::io {

namespace {
// Rows between two requested segments are read through rather than skipped
// when they are fewer bytes than this (one request costs about as much).
constexpr size_t kMaxGapBytes = 256 << 10;
constexpr size_t kMaxSpanBytes = 32 << 20;
}  // namespace

ContiguousArray::ContiguousArray(ArrayInfo info, std::shared_ptr<const File> file, int64_t offset)
    : Array(std::move(info)), file_(std::move(file)), offset_(offset) {
  const int64_t bytes = num_rows() * static_cast<int64_t>(row_bytes());
  if (offset_ < 0 || offset_ + bytes > file_->size()) {
    throw core::ReadError(core::concat(where(), ": the data needs bytes [", offset_, ", ", offset_ + bytes,
                                       ") but the file has ", file_->size(), " bytes (truncated?)"));
  }
}

void ContiguousArray::read_raw(const std::vector<Segment>& segments, uint8_t* out, core::ThreadPool& pool) const {
  const size_t row_size = row_bytes();
  const std::vector<Span> spans = plan_spans(segments, row_size, kMaxGapBytes, kMaxSpanBytes);
  pool.parallel_for(static_cast<int64_t>(spans.size()), [&](int64_t s) {
    const Span& span = spans[s];
    const int64_t offset = offset_ + span.begin * static_cast<int64_t>(row_size);
    const size_t bytes = static_cast<size_t>(span.end - span.begin) * row_size;
    const std::string what =
        "rows [" + std::to_string(span.begin) + ", " + std::to_string(span.end) + ") of " + info_.path;
    const Segment& first = segments[span.first];
    if (span.last == span.first + 1 && first.source == span.begin && first.length == span.end - span.begin) {
      file_->read_at(offset, bytes, out + first.dest * row_size, what);  // straight into place
      return;
    }
    thread_local std::vector<uint8_t> buffer;
    buffer.resize(bytes);
    file_->read_at(offset, bytes, buffer.data(), what);
    for (size_t i = span.first; i < span.last; ++i) {
      const Segment& segment = segments[i];
      std::memcpy(out + segment.dest * row_size, buffer.data() + (segment.source - span.begin) * row_size,
                  static_cast<size_t>(segment.length) * row_size);
    }
  });
}

}  // namespace torch_shards::io
