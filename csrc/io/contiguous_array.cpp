#include "io/contiguous_array.h"

#include <cstring>

#include "core/errors.h"

namespace torch_shards::io {

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
  if (file_->remote()) {
    read_spans_together(*file_, offset_, spans, segments, row_size, out, [&] { return info_.path; });
    return;
  }
  const bool streaming = streams_output(segments, row_size);
  pool.parallel_for(static_cast<int64_t>(spans.size()), [&](int64_t s) {
    // File adds the offsets on error.
    read_span(
        *file_, offset_, spans[s], segments, row_size, out, [&] { return info_.path; }, streaming);
  });
}

bool ContiguousArray::find_raw_in_place(int64_t source, int64_t length, std::vector<InPlace>& pieces) const {
  const size_t row_size = row_bytes();
  const uint8_t* bytes = file_->mapped_bytes(offset_ + source * static_cast<int64_t>(row_size),
                                             static_cast<size_t>(length) * row_size, [&] { return info_.path; });
  if (bytes == nullptr) return false;
  pieces.push_back(InPlace{file_, bytes, length});
  return true;
}

}  // namespace torch_shards::io
