// Read-only files read with pread: no shared offset, so one descriptor serves
// many threads. A process that did not open the descriptor itself (a forked
// DataLoader worker) opens its own on first use.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace torch_shards::io {

class File {
 public:
  // Opens path for reading; throws ReadError naming the file if it cannot.
  explicit File(std::string path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }
  // Reads exactly `bytes` bytes at `offset`; a short file is a ReadError
  // saying what `what` (e.g. "dataset /X chunk (3, 0)") expected.
  void read_at(int64_t offset, size_t bytes, void* out, const std::string& what) const;
  std::vector<uint8_t> read_at(int64_t offset, size_t bytes, const std::string& what) const;

 private:
  int descriptor() const;  // this process's descriptor

  std::string path_;
  int64_t size_ = 0;
  mutable std::mutex open_mutex_;
  mutable std::atomic<int> fd_{-1};
  mutable std::atomic<int> owner_pid_{0};
};

// Reads a whole (small) file; throws ReadError naming it.
std::vector<uint8_t> read_whole_file(const std::string& path);
bool file_exists(const std::string& path);
bool is_directory(const std::string& path);

}  // namespace torch_shards::io
