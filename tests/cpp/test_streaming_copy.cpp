// streaming_copy: byte-exact for every size and every alignment of source and
// destination (the non-temporal body, the unaligned edges, short copies; from
// 64 bytes the 16-byte stores, from 128 the 32-byte ones where the CPU has
// AVX2 and source and destination are as far from a 32-byte boundary, from
// 256 the 64-byte ones where it has AVX-512 and they are as far from a line's
// start: the sizes and alignments below take each one the CPU has),
// line_aligned_like places a staging so, and the copy is visible to another
// thread after streaming_fence().
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "core/streaming_copy.h"

namespace torch_shards::core {
namespace {

TEST(StreamingCopy, CopiesEveryByteForEverySizeAndAlignment) {
  std::vector<uint8_t> source(4096 + 64), dest(4096 + 64);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t size : {0, 1, 15, 16, 17, 63, 64, 65, 100, 127, 128, 129, 255, 256, 257, 319, 1024, 4000, 4095, 4096}) {
    for (size_t from = 0; from < 64; from += (from < 16 ? 1 : 7)) {
      for (size_t to = 0; to < 64; to += (to < 16 ? 1 : 5)) {
        std::fill(dest.begin(), dest.end(), uint8_t{0xAB});
        streaming_copy(dest.data() + to, source.data() + from, size);
        streaming_fence();
        ASSERT_EQ(std::memcmp(dest.data() + to, source.data() + from, size), 0)
            << "size " << size << " from +" << from << " to +" << to;
        for (size_t i = 0; i < to; ++i) ASSERT_EQ(dest[i], 0xAB) << "wrote before the destination";
        for (size_t i = to + size; i < dest.size(); ++i) ASSERT_EQ(dest[i], 0xAB) << "wrote past the destination";
      }
    }
  }
}

TEST(StreamingCopy, LineAlignedLikeStagesAsFarFromALineStartAsTheDestination) {
  std::vector<uint8_t> buffer(64 + 64), dest(64 + 64);
  for (size_t from = 0; from < 64; ++from) {
    for (size_t to = 0; to < 64; to += 4) {
      uint8_t* staged = line_aligned_like(buffer.data() + from, dest.data() + to);
      const auto distance = reinterpret_cast<uintptr_t>(staged) - reinterpret_cast<uintptr_t>(buffer.data() + from);
      ASSERT_LT(distance, 64U) << "from +" << from << " to +" << to;
      ASSERT_EQ((reinterpret_cast<uintptr_t>(staged) - reinterpret_cast<uintptr_t>(dest.data() + to)) % 64, 0U)
          << "from +" << from << " to +" << to;
    }
  }
}

TEST(StreamingCopy, AnotherThreadSeesTheCopyAfterTheFence) {
  std::vector<uint8_t> source(8 << 20), dest(8 << 20, 0);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i % 251);
  std::thread writer([&] {
    streaming_copy(dest.data(), source.data(), source.size());
    streaming_fence();
  });
  writer.join();
  EXPECT_EQ(dest, source);
}

TEST(StreamingCopy, CopyBytesChoosesEitherWayWithTheSameResult) {
  std::vector<uint8_t> source(1000), plain(1000), streamed(1000);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i);
  copy_bytes(plain.data(), source.data(), source.size(), false);
  copy_bytes(streamed.data(), source.data(), source.size(), true);
  streaming_fence();
  EXPECT_EQ(plain, source);
  EXPECT_EQ(streamed, source);
}

TEST(StreamingCopy, StreamsLargeOrCrossingOutputsOfRowsThatFillWholeLines) {
  constexpr size_t kLarge = size_t{8} << 20, kSmall = size_t{1} << 20;
  // Rows of whole lines, or of 4 KB and more: from 8 MB, or at any size when the output crosses.
  for (size_t row : {size_t{64}, size_t{256}, size_t{8000}, size_t{4096}, size_t{4100}}) {
    EXPECT_TRUE(streams(kLarge, row)) << row;
    EXPECT_TRUE(streams(kSmall, row, true)) << row;
    EXPECT_FALSE(streams(kSmall, row)) << row;
  }
  // Rows sharing lines with their neighbours: never (1.7-4x slower streamed).
  for (size_t row : {size_t{4}, size_t{24}, size_t{100}, size_t{200}, size_t{1028}, size_t{4095}}) {
    EXPECT_FALSE(streams(kLarge, row)) << row;
    EXPECT_FALSE(streams(kSmall, row, true)) << row;
  }
}

}  // namespace
}  // namespace torch_shards::core
