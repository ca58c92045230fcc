// What the GoogleTest suites share to write files: a fresh directory under
// the system's temporary directory, removed with all it holds when the
// object goes, and a file written whole (its parent directories made).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace torch_shards::testing_support {

class TempDir {
 public:
  // `prefix` names the directory (prefix_XXXXXX), so a leftover says which test made it.
  explicit TempDir(const std::string& prefix = "torch_shards_test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    root_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(root_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return root_; }
  // The path of `name` in the directory.
  std::string operator/(const std::string& name) const { return (std::filesystem::path(root_) / name).string(); }

 private:
  std::string root_;
};

// Writes `bytes` to `path` (replacing it), making its parent directories; a failed write fails the test.
inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

}  // namespace torch_shards::testing_support
