// Read-only files. Reads use pread (no shared offset: one descriptor serves
// many threads; a forked process opens its own descriptor on first use), or,
// for long-lived files opened with Access::kMapped, a copy from a read-only
// mapping of the file: no system call and no page-cache lookup per read once
// the pages are mapped, which matters for many small random reads. A mapped
// read that faults (the file shrank, the storage failed) is turned into a
// ReadError instead of a SIGBUS. TORCH_SHARDS_MMAP=0 turns mapping off.
//
// Paths may be URLs (s3://, http://, https://: storage/url.h): a File of a
// URL is an object stamped with its size and ETag when opened, read with
// ranged requests (storage/object_store.h); the functions below take URLs
// too. With a cache and an object it holds whole (cache_whole_bytes), the
// File keeps the cache entry's mapping from its first read on and reads it
// as it reads a mapped local file.
//
// A file rewritten while a job reads it would hand out rows that mix old and
// new contents: each File keeps the stamp it had when opened (FileStamp), and
// readers check the files a unit read once it is read (check_unchanged);
// a process that opens it again (a forked DataLoader worker) checks that it
// finds the same file. TORCH_SHARDS_CHECK_FILES=0 turns these checks off
// (file_checks_enabled): for storage whose files are touched (a scratch purge
// script setting their times) but never rewritten while jobs read them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/function_ref.h"

namespace torch_shards::io {

namespace storage {
struct RemoteObject;
class MappedEntry;
}  // namespace storage

// What tells one state of a file from another: the file itself (device and
// inode: a path replaced by a rename has another) and when it last changed
// (size and modification time: a file written in place).
struct FileStamp {
  uint64_t device = 0, inode = 0;
  int64_t size = 0, modified_ns = 0;
  std::string etag;  // objects behind URLs: their ETag (device and inode are then 0)
  // The stamp of an open descriptor / of the file at `path`; nullopt when
  // it cannot be stat'ed (errno says why).
  static std::optional<FileStamp> of_descriptor(int fd);
  static std::optional<FileStamp> of_path(const std::string& path);
  // How `now` differs from this stamp ("size 120 -> 96 bytes"), or "" when
  // it does not.
  std::string changes_to(const FileStamp& now) const;
  // The stamp in one word (never 0), for tables of many files.
  uint64_t digest() const;
};

// False when TORCH_SHARDS_CHECK_FILES=0: stamps are then never compared.
bool file_checks_enabled();

// A monotonic clock (nanoseconds, coarse: a few ns to read) ordering reads
// against checks: a read that starts after use_clock() returned t has its
// file's last_use() >= t.
int64_t use_clock();

class File {
 public:
  // kMapped: a local file is read from a mapping of it. kMetadata: the same, and an object behind a URL
  // serves reads of at most kPagedReadBytes from pages of it kept per process (storage/remote_pages.h):
  // for a format's metadata, read in many small, repeated pieces.
  enum class Access { kRead, kMapped, kMetadata };
  static constexpr size_t kPagedReadBytes = 64 << 10;
  // Opens path for reading; throws ReadError naming the file if it cannot.
  explicit File(std::string path, Access access = Access::kRead);
  // The file at `path`, or null when there is none (ENOENT): one system call
  // fewer than asking first. Throws ReadError if it cannot be opened otherwise.
  static std::shared_ptr<const File> open_if_exists(const std::string& path, Access access = Access::kRead);
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
  // Reads each range (out: `bytes` bytes); those of an object behind a URL
  // are requested together. what() names them in messages.
  struct Range {
    int64_t offset = 0;
    size_t bytes = 0;
    void* out = nullptr;
  };
  void read_ranges(const std::vector<Range>& ranges, core::FunctionRef<std::string()> what) const;
  // An object behind a URL opened with kMetadata: the pages holding each (offset, bytes) range are fetched
  // together now (one round trip), for the small reads about to be made of them. Nothing otherwise.
  void hold_pages(const std::vector<std::pair<int64_t, int64_t>>& ranges) const;
  // Whether the file is an object behind a URL.
  bool remote() const { return remote_ != nullptr; }
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
  // Bytes [offset, offset + bytes) of the mapping of a local file, no copy
  // made, or null when the file is read by copy (opened kRead, behind a URL,
  // TORCH_SHARDS_MMAP=0). Read them only inside run_guarded. Raises the
  // ReadError of read_at for bytes outside the file.
  const uint8_t* mapped_bytes(int64_t offset, size_t bytes, core::FunctionRef<std::string()> what) const;
  // Throws the ReadError of read_at unless [offset, offset + bytes) lies in the file.
  void check_range(int64_t offset, size_t bytes, const std::string& what) const;
  // Throws ReadError unless the file is still the one opened, unmodified
  // (its stamp unchanged): the rows read from it since may mix old and new
  // contents. One fstat.
  void check_unchanged() const;
  // The stamp the file had when opened.
  const FileStamp& stamp() const { return stamp_; }
  // When a read last used this file (use_clock()).
  int64_t last_use() const { return last_use_.load(std::memory_order_relaxed); }

 private:
  File(std::string path, Access access, int fd);  // adopts fd, opened by this process
  void take_stamp(int fd);
  std::string change_since_opened(int fd) const;      // FileStamp::changes_to of fd's stamp now
  bool contains(int64_t offset, size_t bytes) const;  // [offset, offset + bytes) lies in the file
  int descriptor() const;                             // this process's descriptor
  const uint8_t* mapping() const;                     // the mapping (made on first use), or null to use pread
  void note_use() const;                              // last_use_ = now (never moved back)

  File(std::string path, std::shared_ptr<const storage::RemoteObject> remote, Access access);
  void read_remote(const std::vector<Range>& ranges, core::FunctionRef<std::string()> what) const;
  // The object's whole cache entry, mapped (fetched at the first call), or null: not held whole.
  const uint8_t* remote_mapping(core::FunctionRef<std::string()> what) const;

  std::string path_;
  int64_t size_ = 0;
  bool map_ = false;
  std::shared_ptr<const storage::RemoteObject> remote_;  // set for an object behind a URL
  bool paged_ = false;                                   // its small reads go through pages (kMetadata)
  // Its whole cache entry once mapped (inherited through a fork: read-only, still valid), or
  // whole_missing_ once the cache said it does not hold it whole.
  mutable std::shared_ptr<const storage::MappedEntry> whole_;
  mutable std::atomic<const uint8_t*> whole_data_{nullptr};
  mutable std::atomic<bool> whole_missing_{false};
  mutable std::atomic<int> fd_{-1};
  mutable std::atomic<int> owner_pid_{0};
  mutable std::atomic<const uint8_t*> mapped_{nullptr};
  mutable bool mapping_failed_ = false;
  FileStamp stamp_;  // when first opened
  mutable std::atomic<int64_t> last_use_{0};
};

// This process's id, cached (getpid is a system call) and refreshed after fork.
int current_process_id();

// Runs work() (copies from a mapping made elsewhere: the cache's entries)
// with a SIGBUS on this thread (the mapped file shrank, its storage failed)
// abandoning it where it stands: false then, true when it ran to its end.
// work() must hold nothing that needs destroying.
bool run_guarded(core::FunctionRef<void()> work);

// Guards the first use, in a process, of state kept per process (a file's
// descriptor and mapping, a store's cache of shard indexes). A forked child
// gets it unlocked whatever the parent's threads were doing: a mutex of the
// objects themselves could be held by a parent thread that does not exist in
// the child, and the child's first read would wait forever.
std::mutex& first_use_mutex();

// This process's T, made at its first use in each process. One inherited
// through a fork is abandoned, never used or destroyed: a parent thread may
// have held its locks.
template <typename T>
T& per_process() {
  static std::atomic<int> pid{0};
  static std::atomic<T*> instance{nullptr};
  const int now = current_process_id();
  if (pid.load(std::memory_order_acquire) != now) {
    std::lock_guard<std::mutex> lock(first_use_mutex());
    if (pid.load(std::memory_order_relaxed) != now) {
      instance.store(new T(), std::memory_order_release);
      pid.store(now, std::memory_order_release);
    }
  }
  return *instance.load(std::memory_order_acquire);
}

// Files by path, each with its stamp's digest when opened: what a process
// that opens a dataset again compares with the one that opened it first.
using FileStamps = std::map<std::string, uint64_t>;

// Checks (File::check_unchanged) each of `files` (duplicates checked once)
// that a read used at or after `since` (use_clock()).
void check_files_unchanged(std::vector<const File*>& files, int64_t since);

// Reads a whole (small) file; throws ReadError naming it.
std::vector<uint8_t> read_whole_file(const std::string& path);
// Whole files, nullopt for those that do not exist; objects behind URLs are
// fetched together. stamps (if given) gets each one's stamp.
std::vector<std::optional<std::vector<uint8_t>>> read_whole_files_if_exist(const std::vector<std::string>& paths,
                                                                           std::vector<FileStamp>* stamps = nullptr);
// A whole (small) file, or nullopt if it does not exist: behind a URL one
// GET, where file_exists + read_whole_file would cost a HEAD first (and a
// listing when there is no such object). ReadError naming it otherwise.
std::optional<std::vector<uint8_t>> read_whole_file_if_exists(const std::string& path);
bool file_exists(const std::string& path);
bool is_directory(const std::string& path);
// The entries of a directory (or the objects and prefixes below a URL):
// (name, is a directory), sorted, hidden names included. ReadError naming
// it when it cannot be listed.
std::vector<std::pair<std::string, bool>> list_directory(const std::string& path);
// A store about to be opened: behind an s3:// URL, what lies below it listed at once and its zarr
// metadata fetched together (storage::list_remote_store); nothing for local paths and HTTP.
void list_store(const std::string& path);

}  // namespace torch_shards::io
