// io::File: pread and mapped reads agree; a mapped file that shrinks is a
// ReadError, not a SIGBUS; a forked child reads through its own descriptor.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "errors.h"
#include "file.h"

using torch_shards::core::ReadError;
using torch_shards::io::File;

namespace {

std::string write_file(const std::string& name, size_t size) {
  const std::string path = testing::TempDir() + "/" + name;
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
