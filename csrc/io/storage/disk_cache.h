// A node-local cache of byte blobs on disk (data read from object storage),
// shared by every process of a node at once: DDP ranks, DataLoader workers,
// forked or spawned. The object holds only its directory and its bound; every
// call opens what it needs and closes it again, so a forked child inherits
// nothing that could break (no descriptor, no lock).
//
// On disk, under dir/:
//   .accounting       the bytes held, kept under flock(LOCK_EX) by writers and evictors
//   00/ .. ff/        the entries, one file each, named by a 128-bit hash of the key
//                     (32 hex digits; the first two name the subdirectory)
//   .tmp-<pid>-<hex>  an entry being written (renamed into place when complete)
// An entry file is a 32-byte header (magic "TSDCACH2", payload size, key size,
// CRC-32C of the key, CRC-32C of the payload, CRC-32C of the header), the key,
// then the payload. A read checks all of them: a hash collision (another key)
// is a miss, a damaged file is a miss and is removed; never wrong data.
//
// LRU: a read sets the entry's modification time to now (at most once per
// kTouchIntervalSeconds); eviction removes the oldest modification times first.
// Renames into place and removals happen under the lock, with the total in
// .accounting updated in the same critical section; the writer that takes the
// total past max_bytes scans the entries (stat) and evicts the least recently
// used down to 90% of max_bytes, counting the total afresh. A missing or
// damaged .accounting, or one left marked dirty by a process that died inside
// the critical section, is recovered by the same scan, which also removes
// temporary files of crashed writers (untouched for kStaleTemporarySeconds).
// The total held therefore exceeds max_bytes only by files being written.
//
// Whole entries, mapped (map, map_or_fill): an entry read many times in
// small pieces (a whole object of a remote store) is mapped read-only and
// verified once (header, key, payload CRC); the bytes are then read from the
// mapping with no system call and no check per read. Entries are only ever
// replaced by a rename or removed by an unlink, never changed in place, so
// a mapping stays valid (and its bytes right) after its entry is evicted or
// replaced. map_or_fill has one process of the node fill a missing entry at
// a time: it holds flock(LOCK_EX) on a lock file beside the entry
// (<entry>.lock, removed when the entry is in place) while it fills a
// temporary file (fallocated, written) and renames it into place;
// the others wait (polling, bounded in time), then map the entry; a waiter
// whose filler died (its lock released by the kernel, no entry) fills it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torch_shards::io::storage {

// A whole entry's payload mapped read-only; unmapped when the last holder lets it go. Read it with
// io::run_guarded (file.h): a file truncated behind the cache's back faults instead of reading.
class MappedEntry {
 public:
  // Adopts the mapping [base, base + length); the payload is `size` bytes at `offset` in it.
  MappedEntry(void* base, size_t length, size_t offset, size_t size);
  ~MappedEntry();
  MappedEntry(const MappedEntry&) = delete;
  MappedEntry& operator=(const MappedEntry&) = delete;
  const uint8_t* data() const { return static_cast<const uint8_t*>(base_) + offset_; }
  size_t size() const { return size_; }

 private:
  void* base_;
  size_t length_, offset_, size_;
};

class DiskCache {
 public:
  // A read touches an entry's modification time at most this often.
  static constexpr int64_t kTouchIntervalSeconds = 5;
  // A temporary file untouched this long belongs to a writer that died; a scan removes it.
  static constexpr int64_t kStaleTemporarySeconds = 600;
  // The bytes an entry of `key_size` + `size` payload bytes holds on disk (and is accounted).
  static constexpr size_t kHeaderSize = 32;
  static int64_t entry_bytes(size_t key_size, size_t size) {
    return static_cast<int64_t>(kHeaderSize + key_size + size);
  }

  // Creates `dir` (and parents) if missing; max_bytes > 0 else InvalidArgument naming the value.
  // Throws ReadError if dir cannot be created or written (naming it and errno text).
  DiskCache(std::string dir, int64_t max_bytes);

  const std::string& dir() const { return dir_; }
  int64_t max_bytes() const { return max_bytes_; }

  // Copies the entry stored under `key` into out when it exists and holds exactly `size` bytes: true.
  // False when absent, of another size, damaged (a damaged entry is removed) or unreadable; out's
  // contents are then unspecified. Marks the entry used (LRU). Never throws.
  bool read(const std::string& key, void* out, size_t size) const;
  // The whole entry, or nullopt (as above).
  std::optional<std::vector<uint8_t>> read(const std::string& key) const;

  // Stores `size` bytes under `key` (replacing any entry). Never visible half-written: written to a
  // temporary file in the cache directory, then rename()d into place. Then, if the cache holds more
  // than max_bytes, evicts least-recently-used entries until it holds at most 90% of max_bytes (never
  // the entry just written). An entry larger than max_bytes is not stored (and any older entry under
  // the key is removed). A failure to write (disk full, permissions) does not throw: false, and no
  // temporary file is left behind; true when stored.
  bool write(const std::string& key, const void* data, size_t size) const;

  // The entry under `key`, mapped and verified, when it exists and holds exactly `size` bytes; null
  // when absent, of another size, damaged (removed) or not mappable. Marks it used (LRU). Never throws.
  std::shared_ptr<const MappedEntry> map(const std::string& key, size_t size) const;
  // map(key, size), else the entry filled: by this call, fill(fd, at) writing its `size` bytes to the
  // open file fd from offset `at` (write_all_at) and returning their CRC-32C (codecs::crc32c, taken
  // as they were written: the entry is not read back for it), unless
  // another process (or thread) of the node is filling it, which this call then waits for (up to
  // wait_s seconds) and maps. Null when it cannot be stored (larger than max_bytes, disk full, no
  // lock file) or the wait ran out: the caller reads otherwise. An exception from fill passes
  // through (nothing stored, the lock released); a fill that returns nullopt stores nothing (null).
  std::shared_ptr<const MappedEntry> map_or_fill(const std::string& key, size_t size,
                                                 const std::function<std::optional<uint32_t>(int fd, int64_t at)>& fill,
                                                 double wait_s) const;

  // Bytes held now (the entries' file sizes, as accounted; a rescan when the accounting is missing or
  // stale), for tests and monitoring. Throws ReadError naming .accounting if it cannot be opened.
  int64_t held_bytes() const;

  // The file an entry for `key` is stored in (whether or not it exists), for tests and tools.
  std::string entry_path(const std::string& key) const;

 private:
  std::string dir_;
  int64_t max_bytes_;
};

// Writes `size` bytes at `offset` of the open file fd (pwrite, again while interrupted or short);
// false, with errno saying why, when the file takes no more.
bool write_all_at(int fd, const uint8_t* data, size_t size, int64_t offset);

}  // namespace torch_shards::io::storage
