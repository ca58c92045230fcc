// Array::find_in_place: the rows of a raw array in a mapped file are found
// where they lie (contiguous: one piece; in chunks: a piece per chunk they
// touch, at the chunk's place in the file, which is not its place in the
// array); nothing for arrays read by copy, stored byte-swapped or as bool,
// or rows outside the array, nor looked for in stores that open a file for
// each chunk.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "io/array.h"
#include "io/chunked_array.h"
#include "io/contiguous_array.h"
#include "io/file.h"
#include "raw_arrays.h"
#include "temp_dir.h"

namespace torch_shards::io {
namespace {

using testing_support::RawLayout;
using testing_support::TempDir;

std::vector<int32_t> counting(int64_t count) {
  std::vector<int32_t> values(static_cast<size_t>(count));
  std::iota(values.begin(), values.end(), 0);
  return values;
}

// The rows the pieces hold, in order, read inside use_in_place.
std::vector<int32_t> rows_of(const Array& array, int64_t source, int64_t length,
                             const std::vector<Array::InPlace>& pieces) {
  std::vector<int32_t> rows;
  array.use_in_place(source, length, [&] {
    for (const Array::InPlace& piece : pieces) {
      const size_t at = rows.size();
      rows.resize(at + static_cast<size_t>(piece.rows));
      std::memcpy(rows.data() + at, piece.bytes, static_cast<size_t>(piece.rows) * sizeof(int32_t));
    }
  });
  return rows;
}

TEST(ArrayInPlace, MappedRawRowsAreFoundWhereTheyLieAPiecePerChunk) {
  TempDir dir("array_in_place");
  const std::vector<int32_t> values = counting(3500);
  std::vector<Array::InPlace> pieces;
  const auto contiguous = testing_support::raw_array(dir, "contiguous", values, DType::kInt32, RawLayout::kContiguous,
                                                     File::Access::kMapped);
  ASSERT_TRUE(contiguous->find_in_place(10, 3000, pieces));
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(rows_of(*contiguous, 10, 3000, pieces), std::vector<int32_t>(values.begin() + 10, values.begin() + 3010));

  const auto chunked = testing_support::raw_array(dir, "chunked", values, DType::kInt32, RawLayout::kChunksLastFirst,
                                                  File::Access::kMapped);
  // Rows [950, 3200): the end of chunk 0, chunks 1 and 2, the start of chunk 3 (of 500 rows, padded).
  ASSERT_TRUE(chunked->find_in_place(950, 2250, pieces));
  ASSERT_EQ(pieces.size(), 4u);
  EXPECT_EQ(pieces[0].rows, 50);
  EXPECT_EQ(pieces[1].rows, 1000);
  EXPECT_EQ(pieces[3].rows, 200);
  EXPECT_EQ(rows_of(*chunked, 950, 2250, pieces), std::vector<int32_t>(values.begin() + 950, values.begin() + 3200));
  ASSERT_TRUE(chunked->find_in_place(3499, 1, pieces));
  EXPECT_EQ(rows_of(*chunked, 3499, 1, pieces), std::vector<int32_t>{3499});

  // Rows outside the array: none found (a read raises the error).
  EXPECT_FALSE(chunked->find_in_place(3000, 501, pieces));
  EXPECT_FALSE(chunked->find_in_place(-1, 2, pieces));
  EXPECT_TRUE(pieces.empty());
}

TEST(ArrayInPlace, RowsReadByCopyStoredSwappedOrAsBoolAreNotInPlace) {
  TempDir dir("array_in_place");
  const std::vector<int32_t> values = counting(2000);
  std::vector<Array::InPlace> pieces;
  for (const RawLayout layout : {RawLayout::kContiguous, RawLayout::kChunksLastFirst}) {
    const auto copied = testing_support::raw_array(dir, "copied", values, DType::kInt32, layout, File::Access::kRead);
    EXPECT_FALSE(copied->find_in_place(0, 100, pieces));
  }
  testing_support::write_file(dir / "raw", std::vector<uint8_t>(8000, 1));
  const auto mapped = std::make_shared<File>(dir / "raw", File::Access::kMapped);
  const ContiguousArray native(ArrayInfo{dir / "raw", "/native", DType::kInt32, {2000}, false}, mapped, 0);
  const ContiguousArray swapped(ArrayInfo{dir / "raw", "/swapped", DType::kInt32, {2000}, true}, mapped, 0);
  const ContiguousArray flags(ArrayInfo{dir / "raw", "/flags", DType::kBool, {8000}, false}, mapped, 0);
  EXPECT_TRUE(native.find_in_place(0, 100, pieces));
  EXPECT_FALSE(swapped.find_in_place(0, 100, pieces));
  EXPECT_FALSE(flags.find_in_place(0, 100, pieces));
}

TEST(ArrayInPlace, ChunksOfAStoreThatOpensAFileForEachAreNotLookedFor) {
  // A store whose locate() opens each chunk's file to read it by copy (zarr chunk files): finding rows
  // in place would open it once more for nothing.
  class OpensEachChunk : public testing_support::LastFirstChunks {
   public:
    using LastFirstChunks::LastFirstChunks;
    bool locates_in_kept_files() const override { return false; }
    std::optional<ChunkLocation> locate(const std::vector<int64_t>& coords) const override {
      ++located;
      return LastFirstChunks::locate(coords);
    }
    mutable int located = 0;
  };
  TempDir dir("array_in_place");
  testing_support::write_file(dir / "chunks", std::vector<uint8_t>(8000, 0));
  auto store = std::make_shared<OpensEachChunk>(std::make_shared<File>(dir / "chunks", File::Access::kMapped), 2, 4000);
  const ChunkedArray array(ArrayInfo{dir / "chunks", "/x", DType::kInt32, {2000}, false}, {1000}, store,
                           std::make_shared<testing_support::StoredRaw>(), {});
  std::vector<Array::InPlace> pieces;
  EXPECT_FALSE(array.find_in_place(0, 100, pieces));
  EXPECT_EQ(store->located, 0);
}

}  // namespace
}  // namespace torch_shards::io
