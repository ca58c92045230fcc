// io::File: pread and mapped reads agree (also for read_span's scattered
// segments); a mapped file that shrinks is a ReadError, not a SIGBUS; a forked
// child reads through its own descriptor; a file written or replaced after it
// was opened is found out (check_unchanged, and a forked child's reopen).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/errors.h"
#include "io/array.h"
#include "io/file.h"

using torch_shards::core::ReadError;
using torch_shards::io::File;

namespace {

std::string write_file(const std::string& name, size_t size) {
  // named by this process too: another run of the suites may write the same name at the same time
  const std::string path = testing::TempDir() + "/" + std::to_string(::getpid()) + "_" + name;
  std::ofstream out(path, std::ios::binary);
  for (size_t i = 0; i < size; ++i) out.put(static_cast<char>(i * 7 + 3));
  return path;
}

std::vector<char> read(const File& file, int64_t offset, size_t bytes) {
  std::vector<char> out(bytes);
  file.read_at(offset, bytes, out.data(), "test bytes");
  return out;
}

}  // namespace

TEST(File, MappedAndPreadReadsReturnTheSameBytes) {
  const std::string path = write_file("same.bin", 3 << 20);
  const File plain(path), mapped(path, File::Access::kMapped);
  for (int64_t offset : {int64_t{0}, int64_t{4095}, int64_t{1} << 20, (int64_t{3} << 20) - 10}) {
    EXPECT_EQ(read(plain, offset, 10), read(mapped, offset, 10)) << offset;
  }
  EXPECT_THROW(read(mapped, (3 << 20) - 5, 10), ReadError);  // past the end: checked before any copy
}

TEST(File, ReadSpanScattersTheSameRowsMappedOrNot) {
  // 64-byte rows from byte 100: a span of adjacent and gapped rows going to
  // shuffled destinations (mapped: copied one segment at a time; pread: one
  // read of the whole span through a buffer).
  const std::string path = write_file("span.bin", 100 + 64 * 40);
  const File plain(path), mapped(path, File::Access::kMapped);
  using torch_shards::io::Segment;
  const std::vector<Segment> segments = {{2, 3, 5}, {5, 1, 0}, {9, 2, 1}, {11, 2, 3}};
  const auto spans = torch_shards::io::plan_spans(segments, 64, 1 << 10, 1 << 20);
  ASSERT_EQ(spans.size(), 1u);
  std::vector<uint8_t> from_plain(8 * 64, 0), from_mapped(8 * 64, 0), expected(8 * 64, 0);
  torch_shards::io::read_span(plain, 100, spans[0], segments, 64, from_plain.data(),
                              [] { return std::string("rows"); });
  torch_shards::io::read_span(mapped, 100, spans[0], segments, 64, from_mapped.data(),
                              [] { return std::string("rows"); });
  for (const Segment& segment : segments) {
    for (int64_t r = 0; r < segment.length; ++r) {
      for (int64_t b = 0; b < 64; ++b) {
        const int64_t byte = 100 + (segment.source + r) * 64 + b;
        expected[static_cast<size_t>((segment.dest + r) * 64 + b)] = static_cast<uint8_t>(byte * 7 + 3);
      }
    }
  }
  EXPECT_EQ(from_plain, expected);
  EXPECT_EQ(from_mapped, expected);
}

TEST(File, MappedFileThatShrinksIsAReadErrorEveryTime) {
  const std::string path = write_file("shrinks.bin", 1 << 20);
  const File mapped(path, File::Access::kMapped);
  read(mapped, 0, 4096);  // maps the file
  ASSERT_EQ(truncate(path.c_str(), 100000), 0);
  for (int attempt = 0; attempt < 3; ++attempt) {
    try {
      read(mapped, 500000, 4096);
      FAIL() << "no ReadError";
    } catch (const ReadError& error) {
      EXPECT_NE(std::string(error.what()).find("shrank"), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
    }
  }
  EXPECT_EQ(read(mapped, 0, 16).size(), 16u);  // what is still there still reads
}

TEST(File, UseMappedHandsOverTheMappingOrNothing) {
  const std::string path = write_file("use.bin", 1 << 16);
  const File plain(path), mapped(path, File::Access::kMapped);
  int calls = 0;
  const auto what = [] { return std::string("test bytes"); };
  std::vector<char> seen;
  EXPECT_FALSE(plain.use_mapped(
      100, 10, [&](const uint8_t*) { ++calls; }, what));  // not mapped: nothing runs
  EXPECT_EQ(calls, 0);
  EXPECT_TRUE(mapped.use_mapped(
      100, 10, [&](const uint8_t* bytes) { seen.assign(bytes, bytes + 10); }, what));
  EXPECT_EQ(seen, read(plain, 100, 10));
  try {
    mapped.use_mapped((1 << 16) - 5, 10, [&](const uint8_t*) { ++calls; }, what);
    FAIL() << "no ReadError for a range past the end";
  } catch (const ReadError& error) {
    EXPECT_NE(std::string(error.what()).find("test bytes"), std::string::npos) << error.what();
  }
  EXPECT_EQ(calls, 0);
  // An exception from the work passes through, and the guard is gone afterwards.
  EXPECT_THROW(mapped.use_mapped(
                   0, 10, [](const uint8_t*) { throw std::runtime_error("decoder failed"); }, what),
               std::runtime_error);
  EXPECT_EQ(read(mapped, 0, 16).size(), 16u);
}

TEST(File, UseMappedOnAFileThatShrankIsAReadError) {
  const std::string path = write_file("use_shrinks.bin", 1 << 20);
  const File mapped(path, File::Access::kMapped);
  read(mapped, 0, 4096);  // maps the file
  ASSERT_EQ(truncate(path.c_str(), 100000), 0);
  volatile uint64_t sum = 0;
  try {
    mapped.use_mapped(
        500000, 4096,
        [&](const uint8_t* bytes) {
          for (int i = 0; i < 4096; ++i) sum = sum + bytes[i];
        },
        [] { return std::string("a chunk"); });
    FAIL() << "no ReadError";
  } catch (const ReadError& error) {
    EXPECT_NE(std::string(error.what()).find("shrank"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("a chunk"), std::string::npos) << error.what();
  }
}

TEST(File, ForkedChildReadsThroughItsOwnDescriptorAndMapping) {
  const std::string path = write_file("forked.bin", 1 << 20);
  const File plain(path), mapped(path, File::Access::kMapped);
  const auto expected = read(plain, 12345, 100);
  read(mapped, 0, 8);  // mapped in the parent before the fork
  const pid_t child = fork();
  if (child == 0) {
    alarm(10);  // a deadlock ends in SIGALRM
    const bool same = read(plain, 12345, 100) == expected && read(mapped, 12345, 100) == expected;
    _exit(same ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

TEST(File, AFileWrittenInPlaceAfterOpeningFailsItsCheckNamingTheChange) {
  const std::string path = write_file("rewritten.bin", 1 << 16);
  const File plain(path), mapped(path, File::Access::kMapped);
  read(mapped, 0, 8);
  plain.check_unchanged();
  mapped.check_unchanged();
  // Past a clock tick: kernels without fine-grained file times (before 6.13) stamp a write in the tick of
  // the open with the same time.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  {
    std::fstream out(path, std::ios::binary | std::ios::in | std::ios::out);  // same size, same inode
    out.seekp(100);
    out.put('x');
  }
  for (const File* file : {&plain, &mapped}) {
    try {
      file->check_unchanged();
      FAIL() << "no ReadError";
    } catch (const ReadError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(path + ": the file changed while being read (written "), std::string::npos) << message;
      EXPECT_NE(message.find("open the dataset again"), std::string::npos) << message;
    }
  }
  ASSERT_EQ(truncate(path.c_str(), 1000), 0);
  EXPECT_THROW(
      {
        try {
          plain.check_unchanged();
        } catch (const ReadError& error) {
          EXPECT_NE(std::string(error.what()).find("size 65536 -> 1000 bytes"), std::string::npos) << error.what();
          throw;
        }
      },
      ReadError);
}

TEST(File, OnlyFilesUsedSinceAReadBeganAreChecked) {
  const std::string used = write_file("used.bin", 4096), idle = write_file("idle.bin", 4096);
  const File used_file(used), idle_file(idle);
  const int64_t since = torch_shards::io::use_clock();
  read(used_file, 0, 8);
  EXPECT_GE(used_file.last_use(), since);
  ASSERT_EQ(truncate(idle.c_str(), 10), 0);  // changed, but not read since: not this read's concern
  std::vector<const File*> files{&idle_file, &used_file, &used_file};
  torch_shards::io::check_files_unchanged(files, since);
  ASSERT_EQ(truncate(used.c_str(), 10), 0);
  files = {&idle_file, &used_file};
  EXPECT_THROW(torch_shards::io::check_files_unchanged(files, since), ReadError);
}

TEST(File, AForkedChildThatFindsAnotherFileUnderThePathRefusesIt) {
  const std::string path = write_file("replaced.bin", 1 << 16);
  const File plain(path);
  read(plain, 0, 8);
  const std::string other = write_file("replacement.bin", 1 << 16);  // same size and contents
  ASSERT_EQ(std::rename(other.c_str(), path.c_str()), 0);
  read(plain, 0, 8);  // this process still reads the file it opened
  plain.check_unchanged();
  const pid_t child = fork();
  if (child == 0) {
    alarm(10);
    try {
      read(plain, 0, 8);  // opens the path again
    } catch (const ReadError& error) {
      const std::string message = error.what();
      _exit(message.find("the file changed since the dataset opened it (another file now: inode ") != std::string::npos
                ? 0
                : 2);
    }
    _exit(1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

TEST(File, RangesFromCorruptFilesAreCheckedWithoutOverflowOrAllocation) {
  const std::string path = write_file("ranges.bin", 1000);
  const File file(path), mapped(path, File::Access::kMapped);
  for (const File* f : {&file, &mapped}) {
    // offset + bytes would wrap around: still past the end.
    EXPECT_THROW(f->read_at(INT64_MAX - 5, 100, "wrap"), ReadError);
    EXPECT_THROW(f->read_at(10, SIZE_MAX - 5, "wrap"), ReadError);
    // A size no machine could allocate: refused before the vector is made.
    EXPECT_THROW(f->read_at(0, size_t{1} << 50, "huge"), ReadError);
    EXPECT_THROW(f->read_at(-1, 1, "negative"), ReadError);
  }
}

TEST(File, ArrayShapesOfTwoToTheSixtyThreeBytesAreReadErrors) {
  using torch_shards::io::ArrayInfo;
  using torch_shards::io::DType;
  using torch_shards::io::MemoryArray;
  ArrayInfo wide{"f.h5", "/x", DType::kInt32, {int64_t{1} << 62, 4}};
  EXPECT_THROW(MemoryArray(wide, {}), ReadError);
  ArrayInfo rows{"f.h5", "/x", DType::kInt32, {0, int64_t{1} << 40, int64_t{1} << 40}};
  EXPECT_THROW(MemoryArray(rows, {}), ReadError);  // empty, but its rows overflow
  ArrayInfo negative{"f.h5", "/x", DType::kInt32, {3, -1}};
  EXPECT_THROW(MemoryArray(negative, {}), ReadError);
}

TEST(File, AForkWhileAnotherThreadOpensFilesLeavesTheChildFree) {
  // A parent thread inside first use (opening a descriptor, mapping a file)
  // at the fork holds a lock no thread of the child will release.
  const std::string path = write_file("first_use.bin", 1 << 16);
  const File inherited(path, File::Access::kMapped);
  const auto expected = read(inherited, 1000, 64);
  std::mutex& mutex = torch_shards::io::first_use_mutex();
  mutex.lock();  // as if this thread were opening a file
  const pid_t child = fork();
  if (child == 0) {
    alarm(10);  // a deadlock ends in SIGALRM
    const File fresh(path);
    const bool same = read(inherited, 1000, 64) == expected && read(fresh, 1000, 64) == expected;
    _exit(same ? 0 : 1);
  }
  mutex.unlock();
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}
