// Read-only files. Reads use pread (no shared offset: one descriptor serves
// many threads; a forked process opens its own descriptor on first use), or,
// for long-lived files opened with Access::kMapped, a copy from a read-only
// mapping of the file: no system call and no page-cache lookup per read once
// the pages are mapped, which matters for many small random reads. A mapped
// read that faults (the file shrank, the storage failed) is turned into a
// ReadError instead of a SIGBUS. TORCH_SHARDS_MMAP=0 turns mapping off.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "../core/function_ref.h"

namespace torch_shards::io {

class File {
 public:
  enum class Access { kRead, kMapped };
  // Opens path for reading; throws ReadError naming the file if it cannot.
  explicit File(std::string path, Access access = Access::kRead);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }
  // Reads exactly `bytes` bytes at `offset`; a short file is a ReadError
  // saying what `what` (e.g. "dataset /X chunk (3, 0)") expected.
  // streaming: into memory read much later (core/streaming_copy.h), from a
  // mapping with non-temporal stores.
  void read_at(int64_t offset, size_t bytes, void* out, const std::string& what, bool streaming = false) const;
  // The same, what() called only to build a message (hot paths name chunks).
  void read_at(int64_t offset, size_t bytes, void* out, core::FunctionRef<std::string()> what,
               bool streaming = false) const;
  std::vector<uint8_t> read_at(int64_t offset, size_t bytes, const std::string& what) const;
  // Runs use(bytes) on [offset, offset + bytes) of the mapping itself, no copy
  // made, and returns true; returns false, running nothing, when the file is
  // not mapped (the caller reads a copy instead). A fault in the mapping while
  // use runs (the file shrank, the storage failed) abandons it where it stands
  // and raises the ReadError of read_at: `use` must hold nothing that needs
  // destroying (it runs a decoder from the bytes into a plain buffer).
  // what() names the bytes in messages, only ever called for one.
  bool use_mapped(int64_t offset, size_t bytes, core::FunctionRef<void(const uint8_t*)> use,
                  core::FunctionRef<std::string()> what) const;
  // True when reads copy from a mapping: a read then costs no system call, so
  // callers need not gather nearby reads into one.
  bool mapped() const { return mapping() != nullptr; }
  // Throws the ReadError of read_at unless [offset, offset + bytes) lies in the file.
  void check_range(int64_t offset, size_t bytes, const std::string& what) const;

 private:
  bool contains(int64_t offset, size_t bytes) const;  // [offset, offset + bytes) lies in the file
  int descriptor() const;                             // this process's descriptor
  const uint8_t* mapping() const;                     // the mapping (made on first use), or null to use pread

  std::string path_;
  int64_t size_ = 0;
  bool map_ = false;
  mutable std::atomic<int> fd_{-1};
  mutable std::atomic<int> owner_pid_{0};
  mutable std::atomic<const uint8_t*> mapped_{nullptr};
  mutable bool mapping_failed_ = false;
};

// This process's id, cached (getpid is a system call) and refreshed after fork.
int current_process_id();

// Guards the first use, in a process, of state kept per process (a file's
// descriptor and mapping, a store's cache of shard indexes). A forked child
// gets it unlocked whatever the parent's threads were doing: a mutex of the
// objects themselves could be held by a parent thread that does not exist in
// the child, and the child's first read would wait forever.
std::mutex& first_use_mutex();

// Reads a whole (small) file; throws ReadError naming it.
std::vector<uint8_t> read_whole_file(const std::string& path);
bool file_exists(const std::string& path);
bool is_directory(const std::string& path);

}  // namespace torch_shards::io
