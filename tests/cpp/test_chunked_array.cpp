// ChunkedArray over an in-memory chunk store: rows come back from whatever
// chunks they lie in, and a read nested inside another read's chunk decode
// (on the same thread, as a store that reads a second array would do) gets
// its own lists and leaves the outer read's intact.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <vector>

#include "core/thread_pool.h"
#include "io/chunked_array.h"

namespace torch_shards::io {
namespace {

// int32 rows 0 .. rows-1 (row r holds r), in chunks of chunk_rows rows;
// before returning a chunk, runs on_read (if set) on the reading thread.
class CountingStore : public ChunkStore {
 public:
  CountingStore(int64_t rows, int64_t chunk_rows) : rows_(rows), chunk_rows_(chunk_rows) {}
  std::optional<std::vector<uint8_t>> read_chunk(const std::vector<int64_t>& coords) const override {
    if (on_read) on_read();
    std::vector<int32_t> values(static_cast<size_t>(chunk_rows_), 0);
    for (int64_t i = 0; i < chunk_rows_ && coords[0] * chunk_rows_ + i < rows_; ++i) {
      values[i] = static_cast<int32_t>(coords[0] * chunk_rows_ + i);
    }
    std::vector<uint8_t> bytes(values.size() * sizeof(int32_t));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    return bytes;
  }
  std::function<void()> on_read;

 private:
  int64_t rows_, chunk_rows_;
};

class CopyDecoder : public ChunkDecoder {
 public:
  void decode(std::vector<uint8_t>& encoded, uint8_t* out, size_t out_bytes) const override {
    ASSERT_EQ(encoded.size(), out_bytes);
    std::memcpy(out, encoded.data(), out_bytes);
  }
};

std::shared_ptr<ChunkedArray> counting_array(const std::shared_ptr<CountingStore>& store, int64_t rows,
                                             int64_t chunk_rows) {
  ArrayInfo info{"memory", "/counting", DType::kInt32, {rows}, false};
  return std::make_shared<ChunkedArray>(info, std::vector<int64_t>{chunk_rows}, store, std::make_shared<CopyDecoder>(),
                                        std::vector<uint8_t>{});
}

// Rows [first, first + count) of every segment, in delivery order.
std::vector<int32_t> read_rows(const Array& array, const std::vector<Segment>& segments, core::ThreadPool& pool) {
  int64_t total = 0;
  for (const Segment& segment : segments) total = std::max(total, segment.dest + segment.length);
  std::vector<int32_t> out(static_cast<size_t>(total), -1);
  array.read(segments, out.data(), pool);
  return out;
}

TEST(ChunkedArray, RowsComeFromTheChunksTheyLieIn) {
  const auto store = std::make_shared<CountingStore>(1000, 64);
  const auto array = counting_array(store, 1000, 64);
  for (const int threads : {0, 2}) {
    core::ThreadPool pool(threads);
    const std::vector<Segment> segments{{900, 100, 0}, {10, 70, 100}, {500, 1, 170}, {63, 2, 171}};
    const std::vector<int32_t> out = read_rows(*array, segments, pool);
    for (const Segment& segment : segments) {
      for (int64_t i = 0; i < segment.length; ++i) {
        ASSERT_EQ(out[segment.dest + i], segment.source + i) << "threads " << threads;
      }
    }
  }
}

TEST(ChunkedArray, AReadNestedInAnotherReadsChunkKeepsBothIntact) {
  const auto outer_store = std::make_shared<CountingStore>(4096, 16);
  const auto inner_store = std::make_shared<CountingStore>(300, 7);
  const auto outer = counting_array(outer_store, 4096, 16);
  const auto inner = counting_array(inner_store, 300, 7);
  core::ThreadPool inline_pool(0);  // every chunk of the outer read on this thread
  int nested_reads = 0;
  outer_store->on_read = [&] {
    const std::vector<Segment> segments{{250, 50, 0}, {3, 40, 50}};
    const std::vector<int32_t> rows = read_rows(*inner, segments, inline_pool);
    for (const Segment& segment : segments) {
      for (int64_t i = 0; i < segment.length; ++i) ASSERT_EQ(rows[segment.dest + i], segment.source + i);
    }
    ++nested_reads;
  };
  std::vector<Segment> segments;  // many chunks, in an order the read sorts
  for (int64_t block = 255; block >= 0; block -= 3) segments.push_back(Segment{block * 16, 16, (255 - block) / 3 * 16});
  const std::vector<int32_t> out = read_rows(*outer, segments, inline_pool);
  EXPECT_EQ(nested_reads, static_cast<int>(segments.size()));
  for (const Segment& segment : segments) {
    for (int64_t i = 0; i < segment.length; ++i) ASSERT_EQ(out[segment.dest + i], segment.source + i);
  }
}

}  // namespace
}  // namespace torch_shards::io
