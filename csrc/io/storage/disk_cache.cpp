#include "io/storage/disk_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>

#include "core/errors.h"
#include "core/stable_hash.h"
#include "io/codecs.h"
#include "io/file.h"

namespace torch_shards::io::storage {

namespace {

using core::concat;

// Version 2: CRC-32C (version 1's zlib CRC-32 entries read as damaged: removed, fetched again).
constexpr char kEntryMagic[8] = {'T', 'S', 'D', 'C', 'A', 'C', 'H', '2'};
constexpr char kAccountingMagic[8] = {'T', 'S', 'D', 'C', 'A', 'C', 'C', '2'};
constexpr size_t kAccountingSize = 24;
constexpr const char* kAccountingName = ".accounting";
constexpr const char* kTemporaryPrefix = ".tmp-";
constexpr size_t kNameLength = 32;  // two 64-bit hashes in hex
constexpr int64_t kNanoseconds = 1000000000;

// ---- small helpers ----------------------------------------------------------------------------------------

std::string error_text(int error) { return std::strerror(error); }

bool starts_with(const char* text, const char* prefix) { return std::strncmp(text, prefix, std::strlen(prefix)) == 0; }

int64_t nanoseconds(const timespec& time) { return static_cast<int64_t>(time.tv_sec) * kNanoseconds + time.tv_nsec; }

int64_t now_ns() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return nanoseconds(now);
}

bool same_file(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

// CRC-32C: by the CPU's instruction, about 5x zlib's crc32 (a whole entry is checked as it is
// stored, and once by each process that maps it).
uint32_t crc32_of(const void* data, size_t size) { return codecs::crc32c(static_cast<const uint8_t*>(data), size); }

void put_u32(uint8_t* out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}
void put_u64(uint8_t* out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}
uint32_t get_u32(const uint8_t* in) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= static_cast<uint32_t>(in[i]) << (8 * i);
  return value;
}
uint64_t get_u64(const uint8_t* in) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= static_cast<uint64_t>(in[i]) << (8 * i);
  return value;
}

std::string hex(uint64_t value, int digits) {
  static const char kDigits[] = "0123456789abcdef";
  std::string text(digits, '0');
  for (int i = digits - 1; i >= 0; --i, value >>= 4) text[i] = kDigits[value & 15];
  return text;
}

bool is_entry_name(const char* name) {
  size_t i = 0;
  for (; name[i] != '\0'; ++i) {
    if (i >= kNameLength || !((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f'))) return false;
  }
  return i == kNameLength;
}

// ---- the entry name: two independent 64-bit hashes of the key ------------------------------------------------

uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t rotl(uint64_t x, int bits) { return (x << bits) | (x >> (64 - bits)); }

// A word-at-a-time hash (the same on every platform), independent of FNV-1a (core::stable_hash).
uint64_t word_hash(const std::string& text) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  const size_t size = text.size();
  uint64_t hash = mix64(size ^ 0x243f6a8885a308d3ull);
  size_t i = 0;
  for (; i + 8 <= size; i += 8) hash = (rotl(hash, 29) ^ mix64(get_u64(bytes + i) + 0x9e3779b97f4a7c15ull)) * 3;
  uint64_t tail = 0;
  for (size_t j = 0; i + j < size; ++j) tail |= static_cast<uint64_t>(bytes[i + j]) << (8 * j);
  hash = (rotl(hash, 29) ^ mix64(tail + 0x9e3779b97f4a7c15ull * (size - i + 1))) * 3;
  return mix64(hash);
}

std::string entry_name(const std::string& key) {
  return hex(word_hash(key), 16) + hex(static_cast<uint64_t>(core::stable_hash(key)), 16);
}

// ---- the entry header -----------------------------------------------------------------------------------------

struct Header {
  uint64_t payload_size = 0;
  uint32_t key_size = 0, key_crc = 0, payload_crc = 0;
};

void encode_header(const Header& header, uint8_t* out) {
  std::memcpy(out, kEntryMagic, 8);
  put_u64(out + 8, header.payload_size);
  put_u32(out + 16, header.key_size);
  put_u32(out + 20, header.key_crc);
  put_u32(out + 24, header.payload_crc);
  put_u32(out + 28, crc32_of(out, 28));
}

bool decode_header(const uint8_t* in, Header* header) {
  if (std::memcmp(in, kEntryMagic, 8) != 0 || get_u32(in + 28) != crc32_of(in, 28)) return false;
  header->payload_size = get_u64(in + 8);
  header->key_size = get_u32(in + 16);
  header->key_crc = get_u32(in + 20);
  header->payload_crc = get_u32(in + 24);
  return true;
}

// ---- descriptors ----------------------------------------------------------------------------------------------

class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  ~Descriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

bool pread_all(int fd, void* out, size_t size, off_t offset) {
  auto* bytes = static_cast<uint8_t*>(out);
  while (size > 0) {
    const ssize_t got = ::pread(fd, bytes, size, offset);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    bytes += got;
    size -= static_cast<size_t>(got);
    offset += got;
  }
  return true;
}

// Fills iov[0..count) from `offset` on (one system call when the file cooperates).
bool preadv_all(int fd, iovec* iov, int count, off_t offset) {
  for (;;) {
    while (count > 0 && iov->iov_len == 0) ++iov, --count;
    if (count == 0) return true;
    ssize_t got = ::preadv(fd, iov, count, offset);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    offset += got;
    for (; count > 0 && static_cast<size_t>(got) >= iov->iov_len; ++iov, --count) got -= iov->iov_len;
    if (count > 0) {
      iov->iov_base = static_cast<uint8_t*>(iov->iov_base) + got;
      iov->iov_len -= static_cast<size_t>(got);
    }
  }
}

bool write_all(int fd, const void* data, size_t size) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const ssize_t put = ::write(fd, bytes, size);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    bytes += put;
    size -= static_cast<size_t>(put);
  }
  return true;
}

}  // namespace

bool write_all_at(int fd, const uint8_t* data, size_t size, int64_t offset) {
  while (size > 0) {
    const ssize_t put = ::pwrite(fd, data, size, static_cast<off_t>(offset));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) {
      if (put == 0) errno = ENOSPC;
      return false;
    }
    data += put;
    offset += put;
    size -= static_cast<size_t>(put);
  }
  return true;
}

namespace {

// ---- the accounting file and its lock ---------------------------------------------------------------------------

// dir/.accounting, opened and locked (flock, exclusive) for one operation; unlocked and closed when it
// ends. A descriptor of its own each time: threads of one process exclude each other too (flock locks
// belong to open file descriptions), and no locked descriptor outlives the operation to be inherited
// by a fork. LOCK_UN before close: a child forked meanwhile holds the same description open.
class AccountingLock {
 public:
  explicit AccountingLock(const std::string& dir) : path_(dir + "/" + kAccountingName) {
    for (int attempt = 0; attempt < 16; ++attempt) {
      fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
      if (fd_ < 0) {
        error_ = errno;
        return;
      }
      int locked;
      while ((locked = ::flock(fd_, LOCK_EX)) != 0 && errno == EINTR) {
      }
      if (locked != 0) {
        error_ = errno;
        ::close(fd_);
        fd_ = -1;
        return;
      }
      // Locked the file that is there now, not one removed or replaced meanwhile.
      struct stat held {};
      struct stat there {};
      if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &there) == 0 && same_file(held, there)) return;
      error_ = ESTALE;
      unlock();
    }
  }
  ~AccountingLock() { unlock(); }
  AccountingLock(const AccountingLock&) = delete;
  AccountingLock& operator=(const AccountingLock&) = delete;

  bool ok() const { return fd_ >= 0; }
  int error() const { return error_; }
  const std::string& path() const { return path_; }

  // The total recorded, or nullopt when the file is missing, damaged, or marked dirty (a process died
  // between renaming/removing an entry and recording the new total).
  std::optional<int64_t> load() const {
    uint8_t buffer[kAccountingSize];
    if (!pread_all(fd_, buffer, sizeof buffer, 0)) return std::nullopt;
    if (std::memcmp(buffer, kAccountingMagic, 8) != 0 || get_u32(buffer + 20) != crc32_of(buffer, 20)) {
      return std::nullopt;
    }
    const auto total = static_cast<int64_t>(get_u64(buffer + 8));
    if (get_u32(buffer + 16) != 0 || total < 0) return std::nullopt;
    return total;
  }

  bool store(int64_t total, bool dirty) const {
    uint8_t buffer[kAccountingSize];
    std::memcpy(buffer, kAccountingMagic, 8);
    put_u64(buffer + 8, static_cast<uint64_t>(std::max<int64_t>(total, 0)));
    put_u32(buffer + 16, dirty ? 1 : 0);
    put_u32(buffer + 20, crc32_of(buffer, 20));
    ssize_t put;
    while ((put = ::pwrite(fd_, buffer, sizeof buffer, 0)) < 0 && errno == EINTR) {
    }
    return put == static_cast<ssize_t>(sizeof buffer);
  }

 private:
  void unlock() {
    if (fd_ < 0) return;
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
    fd_ = -1;
  }

  std::string path_;
  int fd_ = -1;
  int error_ = 0;
};

// ---- scanning and eviction -------------------------------------------------------------------------------------

// Removes `name` in the directory `dir_fd` if it is a temporary file untouched for kStaleTemporarySeconds.
void remove_if_stale_temporary(int dir_fd, const char* name, int64_t now) {
  struct stat st {};
  if (::fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) return;
  if (now - nanoseconds(st.st_mtim) > DiskCache::kStaleTemporarySeconds * kNanoseconds) {
    ::unlinkat(dir_fd, name, 0);
  }
}

struct Found {
  int64_t used_ns;
  int64_t size;
  std::string path;
};

// Under the lock: the bytes the entries hold, found by stat'ing them all; removes temporary files of
// crashed writers; when the entries hold more than max_bytes, removes the least recently used (never
// `keep`) until they hold at most 90% of max_bytes. Returns what they hold then.
int64_t scan(const std::string& dir, int64_t max_bytes, const std::string& keep) {
  const int64_t now = now_ns();
  std::vector<Found> found;
  int64_t total = 0;
  for (int sub = -1; sub < 256; ++sub) {
    const std::string path = sub < 0 ? dir : dir + "/" + hex(static_cast<uint64_t>(sub), 2);
    DIR* listing = ::opendir(path.c_str());
    if (listing == nullptr) continue;
    const int dir_fd = ::dirfd(listing);
    while (const dirent* item = ::readdir(listing)) {
      if (starts_with(item->d_name, kTemporaryPrefix)) {
        remove_if_stale_temporary(dir_fd, item->d_name, now);
      } else if (sub >= 0 && is_entry_name(item->d_name)) {
        struct stat st {};
        if (::fstatat(dir_fd, item->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
        found.push_back({nanoseconds(st.st_mtim), static_cast<int64_t>(st.st_size), path + "/" + item->d_name});
        total += st.st_size;
      }
    }
    ::closedir(listing);
  }
  if (total <= max_bytes) return total;
  const int64_t target = max_bytes - max_bytes / 10;
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return std::tie(a.used_ns, a.path) < std::tie(b.used_ns, b.path); });
  for (const Found& entry : found) {
    if (total <= target) break;
    if (entry.path == keep) continue;
    if (::unlink(entry.path.c_str()) == 0 || errno == ENOENT) total -= entry.size;
  }
  return total;
}

// The total under the lock: as recorded, or counted afresh (and recorded) when the record is not to be trusted.
std::optional<int64_t> current_total(const AccountingLock& lock, const std::string& dir, int64_t max_bytes) {
  if (std::optional<int64_t> total = lock.load()) return total;
  const int64_t total = scan(dir, max_bytes, "");
  if (!lock.store(total, false)) return std::nullopt;
  return total;
}

// Removes the entry file at `path` under the lock and takes it off the total; when `opened` is given,
// only if the file there is still that one (a writer may have replaced it meanwhile). `recount`: the
// file's size is not the one accounted when it was stored (it was truncated or appended to), so the
// total is counted afresh.
void remove_entry(const std::string& dir, int64_t max_bytes, const std::string& path, const struct stat* opened,
                  bool recount) {
  AccountingLock lock(dir);
  if (!lock.ok()) return;
  struct stat there {};
  if (::lstat(path.c_str(), &there) != 0 || !S_ISREG(there.st_mode)) return;
  if (opened != nullptr && !same_file(*opened, there)) return;
  const std::optional<int64_t> total = lock.load();
  if (::unlink(path.c_str()) != 0) return;
  if (total && !recount) {
    lock.store(*total - static_cast<int64_t>(there.st_size), false);
  } else {
    lock.store(scan(dir, max_bytes, ""), false);
  }
}

// ---- entries being written --------------------------------------------------------------------------------------

// dir/.tmp-<pid>-<hex>, created exclusively; removed when destroyed unless renamed into place.
class Temporary {
 public:
  explicit Temporary(const std::string& dir) {
    const auto pid = static_cast<uint64_t>(::getpid());
    const auto thread = static_cast<uint64_t>(::syscall(SYS_gettid));
    for (uint64_t attempt = 0; attempt < 16; ++attempt) {
      const uint64_t unique = mix64(thread * 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(now_ns()) ^
                                    reinterpret_cast<uintptr_t>(this) ^ (attempt << 56));
      path_ = dir + "/" + kTemporaryPrefix + hex(pid, 8) + "-" + hex(unique, 16);
      fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);  // RDWR: map_or_fill maps it
      if (fd_ >= 0 || errno != EEXIST) return;
    }
  }
  ~Temporary() {
    if (fd_ >= 0) ::close(fd_);
    if (!kept_ && !path_.empty() && (fd_ >= 0 || closed_)) ::unlink(path_.c_str());
  }
  Temporary(const Temporary&) = delete;
  Temporary& operator=(const Temporary&) = delete;

  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // Closes the file: false if that reports a write error (e.g. on NFS, or a full disk).
  bool close() {
    const int fd = fd_;
    fd_ = -1;
    closed_ = true;
    return ::close(fd) == 0;
  }
  // Renamed into place: nothing to remove.
  void keep() { kept_ = true; }

 private:
  std::string path_;
  int fd_ = -1;
  bool closed_ = false, kept_ = false;
};

// kDamaged: bytes changed; kResized: a size that no entry written has (shorter than a header, or
// other than its header says).
enum class Verdict { kMatch, kOtherKey, kDamaged, kResized };

// Checks an entry file of `file_size` bytes against `key`: `head` holds its first
// min(file_size, kHeaderSize + key.size()) bytes (`got`).
Verdict check_head(int fd, int64_t file_size, const uint8_t* head, size_t got, const std::string& key, Header* header) {
  if (got < DiskCache::kHeaderSize) return Verdict::kResized;
  if (!decode_header(head, header)) return Verdict::kDamaged;
  const uint64_t expected = DiskCache::kHeaderSize + uint64_t{header->key_size} + header->payload_size;
  if (header->payload_size > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
      expected != static_cast<uint64_t>(file_size)) {
    return Verdict::kResized;
  }
  const uint8_t* stored = head + DiskCache::kHeaderSize;
  if (header->key_size == key.size() && std::memcmp(stored, key.data(), key.size()) == 0) return Verdict::kMatch;
  // Another key stored under the same name (a hash collision), or this key damaged: its CRC tells.
  std::vector<uint8_t> other;
  if (header->key_size != key.size()) {
    other.resize(header->key_size);
    if (!pread_all(fd, other.data(), other.size(), DiskCache::kHeaderSize)) return Verdict::kOtherKey;
    stored = other.data();
  }
  return crc32_of(stored, header->key_size) == header->key_crc ? Verdict::kOtherKey : Verdict::kDamaged;
}

// Marks an entry used: its modification time is when it was last written or read (to within
// kTouchIntervalSeconds, to keep hot reads free of metadata writes).
void touch(int fd, const struct stat& st) {
  if (now_ns() - nanoseconds(st.st_mtim) >= DiskCache::kTouchIntervalSeconds * kNanoseconds) {
    ::futimens(fd, nullptr);  // allowed to the owner or anyone who may write the file; else the LRU is coarser
  }
}

// Renames the complete, closed `temporary` into place at `path` (an entry of `bytes` bytes on disk)
// and adds it to the total, in one critical section (marked dirty while inside it); evicts down to 90%
// of max_bytes (never this entry) when the total passes max_bytes. False when it could not.
bool place(const std::string& dir, int64_t max_bytes, Temporary& temporary, const std::string& path, int64_t bytes) {
  AccountingLock lock(dir);
  if (!lock.ok()) return false;
  const std::optional<int64_t> total = current_total(lock, dir, max_bytes);
  if (!total || !lock.store(*total, true)) return false;
  struct stat old {};
  const int64_t replaced = ::lstat(path.c_str(), &old) == 0 && S_ISREG(old.st_mode) ? old.st_size : 0;
  bool renamed = ::rename(temporary.path().c_str(), path.c_str()) == 0;
  if (!renamed && errno == ENOENT) {  // the first entry of its subdirectory
    const std::string sub = path.substr(0, path.rfind('/'));
    renamed =
        (::mkdir(sub.c_str(), 0777) == 0 || errno == EEXIST) && ::rename(temporary.path().c_str(), path.c_str()) == 0;
  }
  if (!renamed) {
    lock.store(*total, false);
    return false;
  }
  temporary.keep();
  int64_t held = *total - replaced + bytes;
  if (held > max_bytes) held = scan(dir, max_bytes, path);
  lock.store(held, false);  // if this fails the record stays dirty: the next operation counts afresh
  return true;
}

}  // namespace

// ---- DiskCache ---------------------------------------------------------------------------------------------------

DiskCache::DiskCache(std::string dir, int64_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {
  core::check_argument(max_bytes_ > 0, "disk cache ", dir_, ": max_bytes must be > 0, got ", max_bytes_);
  core::check_argument(!dir_.empty(), "disk cache: the directory must not be empty");
  struct stat st {};
  if (::stat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    // mkdir -p
    for (size_t end = dir_.find('/', 1);; end = dir_.find('/', end + 1)) {
      const std::string prefix = dir_.substr(0, end);
      if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) {
        const int error = errno;
        if (::stat(prefix.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
          throw core::ReadError(
              concat("disk cache directory ", dir_, ": cannot create ", prefix, ": ", error_text(error)));
        }
      }
      if (end == std::string::npos) break;
    }
    if (::stat(dir_.c_str(), &st) != 0) {
      throw core::ReadError(concat("disk cache directory ", dir_, ": cannot create it: ", error_text(errno)));
    }
    if (!S_ISDIR(st.st_mode)) {
      throw core::ReadError(concat("disk cache directory ", dir_, ": exists and is not a directory"));
    }
  }
  if (::faccessat(AT_FDCWD, dir_.c_str(), W_OK | X_OK, AT_EACCESS) != 0) {
    throw core::ReadError(concat("disk cache directory ", dir_, ": cannot write in it: ", error_text(errno)));
  }
  const std::string accounting = dir_ + "/" + kAccountingName;
  const int fd = ::open(accounting.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) {
    throw core::ReadError(
        concat("disk cache directory ", dir_, ": cannot write ", accounting, ": ", error_text(errno)));
  }
  ::close(fd);
}

std::string DiskCache::entry_path(const std::string& key) const {
  const std::string name = entry_name(key);
  return concat(dir_, "/", name.substr(0, 2), "/", name);
}

bool DiskCache::read(const std::string& key, void* out, size_t size) const {
  try {
    if (size > 0 && out == nullptr) return false;
    const std::string path = entry_path(key);
    const Descriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st {};
    if (file.get() < 0 || ::fstat(file.get(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
    std::vector<uint8_t> head(kHeaderSize + key.size());
    Header header;
    if (static_cast<uint64_t>(st.st_size) != kHeaderSize + uint64_t{key.size()} + size) {
      // Not this key with this size: of another size (a miss), or damaged (removed).
      const size_t got = std::min<size_t>(head.size(), static_cast<size_t>(st.st_size));
      if (!pread_all(file.get(), head.data(), got, 0)) return false;
      const Verdict verdict = check_head(file.get(), st.st_size, head.data(), got, key, &header);
      if (verdict == Verdict::kDamaged || verdict == Verdict::kResized) {
        remove_entry(dir_, max_bytes_, path, &st, verdict == Verdict::kResized);
      }
      return false;
    }
    iovec parts[2] = {{head.data(), head.size()}, {out, size}};
    if (!preadv_all(file.get(), parts, 2, 0)) return false;
    const Verdict verdict = check_head(file.get(), st.st_size, head.data(), head.size(), key, &header);
    if (verdict == Verdict::kOtherKey) return false;
    if (verdict != Verdict::kMatch || crc32_of(out, size) != header.payload_crc) {
      remove_entry(dir_, max_bytes_, path, &st, verdict == Verdict::kResized);
      return false;
    }
    touch(file.get(), st);
    return true;
  } catch (...) {  // e.g. std::bad_alloc: a miss
    return false;
  }
}

std::optional<std::vector<uint8_t>> DiskCache::read(const std::string& key) const {
  try {
    const std::string path = entry_path(key);
    const Descriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st {};
    if (file.get() < 0 || ::fstat(file.get(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
    std::vector<uint8_t> head(kHeaderSize + key.size());
    const size_t got = std::min<size_t>(head.size(), static_cast<size_t>(st.st_size));
    if (!pread_all(file.get(), head.data(), got, 0)) return std::nullopt;
    Header header;
    const Verdict verdict = check_head(file.get(), st.st_size, head.data(), got, key, &header);
    if (verdict == Verdict::kMatch) {
      // The size was checked against the file's: the allocation is bounded by what is on disk.
      std::vector<uint8_t> payload(static_cast<size_t>(header.payload_size));
      if (!pread_all(file.get(), payload.data(), payload.size(), static_cast<off_t>(head.size()))) return std::nullopt;
      if (crc32_of(payload.data(), payload.size()) == header.payload_crc) {
        touch(file.get(), st);
        return payload;
      }
    }
    if (verdict != Verdict::kOtherKey) remove_entry(dir_, max_bytes_, path, &st, verdict == Verdict::kResized);
    return std::nullopt;
  } catch (...) {
    return std::nullopt;
  }
}

bool DiskCache::write(const std::string& key, const void* data, size_t size) const {
  try {
    if (size > 0 && data == nullptr) return false;
    const std::string path = entry_path(key);
    if (key.size() > std::numeric_limits<uint32_t>::max() || size > static_cast<uint64_t>(max_bytes_) ||
        entry_bytes(key.size(), size) > max_bytes_) {
      // Not stored; nor is an older value left behind under the key.
      if (::access(path.c_str(), F_OK) == 0) remove_entry(dir_, max_bytes_, path, nullptr, false);
      return false;
    }
    const int64_t bytes = entry_bytes(key.size(), size);

    // The file, complete, under a name no reader looks for.
    Temporary temporary(dir_);
    if (!temporary.ok()) return false;
    std::vector<uint8_t> head(kHeaderSize + key.size());
    Header header;
    header.payload_size = size;
    header.key_size = static_cast<uint32_t>(key.size());
    header.key_crc = crc32_of(key.data(), key.size());
    header.payload_crc = crc32_of(data, size);
    encode_header(header, head.data());
    std::memcpy(head.data() + kHeaderSize, key.data(), key.size());
    if (!write_all(temporary.fd(), head.data(), head.size()) || !write_all(temporary.fd(), data, size) ||
        !temporary.close()) {
      return false;
    }

    return place(dir_, max_bytes_, temporary, path, bytes);
  } catch (...) {  // e.g. std::bad_alloc: not stored (Temporary removes its file)
    return false;
  }
}

// ---- whole entries, mapped -------------------------------------------------------------------------------------

MappedEntry::MappedEntry(void* base, size_t length, size_t offset, size_t size)
    : base_(base), length_(length), offset_(offset), size_(size) {}

MappedEntry::~MappedEntry() {
  if (base_ != nullptr && length_ > 0) ::munmap(base_, length_);
}

namespace {

// A page-sized mapping for an empty payload would be no mapping at all: an entry file is never empty
// (its header), so every mapping here has a length.
void* map_file(int fd, size_t length, int protection) {
  void* address = ::mmap(nullptr, length, protection, MAP_SHARED, fd, 0);
  return address == MAP_FAILED ? nullptr : address;
}

// <entry>.lock, held (flock, exclusive) by the one process filling the entry; removed once it is in
// place. Not an entry name: scans neither count nor evict it.
class FillLock {
 public:
  explicit FillLock(std::string path) : path_(std::move(path)) {}
  ~FillLock() { release(false); }
  FillLock(const FillLock&) = delete;
  FillLock& operator=(const FillLock&) = delete;

  enum class Result { kHeld, kTimedOut, kFailed };
  // Polls for the lock until `deadline_ns` (CLOCK_REALTIME); `ready()` is asked between polls and ends
  // the wait (kTimedOut) when it returns true (the entry appeared).
  template <typename Ready>
  Result acquire(int64_t deadline_ns, const Ready& ready) {
    int64_t pause_us = 200;
    for (;;) {
      fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
      if (fd_ < 0 && errno == ENOENT) {
        const std::string sub = path_.substr(0, path_.rfind('/'));
        if (::mkdir(sub.c_str(), 0777) == 0 || errno == EEXIST)
          fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
      }
      if (fd_ < 0) return Result::kFailed;
      for (;;) {
        if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) break;
        if (errno != EWOULDBLOCK && errno != EINTR) {
          close_descriptor();
          return Result::kFailed;
        }
        if (ready() || now_ns() >= deadline_ns) {
          close_descriptor();
          return Result::kTimedOut;
        }
        ::usleep(static_cast<useconds_t>(pause_us));
        pause_us = std::min<int64_t>(pause_us * 2, 20000);
      }
      // Locked the file that is there now, not one its last holder removed meanwhile.
      struct stat held {};
      struct stat there {};
      if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &there) == 0 && same_file(held, there))
        return Result::kHeld;
      release(false);
    }
  }
  // Unlocks (removing the file first when `remove`: the entry is in place, no one needs it).
  void release(bool remove) {
    if (fd_ < 0) return;
    if (remove) ::unlink(path_.c_str());
    ::flock(fd_, LOCK_UN);
    close_descriptor();
  }

 private:
  void close_descriptor() {
    ::close(fd_);
    fd_ = -1;
  }
  std::string path_;
  int fd_ = -1;
};

}  // namespace

std::shared_ptr<const MappedEntry> DiskCache::map(const std::string& key, size_t size) const {
  try {
    const std::string path = entry_path(key);
    const Descriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st {};
    if (file.get() < 0 || ::fstat(file.get(), &st) != 0 || !S_ISREG(st.st_mode)) return nullptr;
    Header header;
    if (static_cast<uint64_t>(st.st_size) != kHeaderSize + uint64_t{key.size()} + size) {
      std::vector<uint8_t> head(kHeaderSize + key.size());
      const size_t got = std::min<size_t>(head.size(), static_cast<size_t>(st.st_size));
      if (!pread_all(file.get(), head.data(), got, 0)) return nullptr;
      const Verdict verdict = check_head(file.get(), st.st_size, head.data(), got, key, &header);
      if (verdict == Verdict::kDamaged || verdict == Verdict::kResized) {
        remove_entry(dir_, max_bytes_, path, &st, verdict == Verdict::kResized);
      }
      return nullptr;
    }
    const size_t length = static_cast<size_t>(st.st_size);
    void* base = map_file(file.get(), length, PROT_READ);
    if (base == nullptr) return nullptr;
    auto entry = std::make_shared<const MappedEntry>(base, length, kHeaderSize + key.size(), size);
    Verdict verdict = Verdict::kDamaged;
    bool intact = false;
    // Guarded: a file truncated behind the cache's back faults here, and is a damaged entry.
    const bool read = io::run_guarded([&] {
      verdict =
          check_head(file.get(), st.st_size, static_cast<const uint8_t*>(base), kHeaderSize + key.size(), key, &header);
      intact = verdict == Verdict::kMatch && crc32_of(entry->data(), size) == header.payload_crc;
    });
    if (read && verdict == Verdict::kOtherKey) return nullptr;
    if (!read || !intact) {
      remove_entry(dir_, max_bytes_, path, &st, !read || verdict == Verdict::kResized);
      return nullptr;
    }
    touch(file.get(), st);
    return entry;
  } catch (...) {
    return nullptr;
  }
}

std::shared_ptr<const MappedEntry> DiskCache::map_or_fill(
    const std::string& key, size_t size, const std::function<std::optional<uint32_t>(int, int64_t)>& fill,
    double wait_s) const {
  if (std::shared_ptr<const MappedEntry> entry = map(key, size)) return entry;
  if (key.size() > std::numeric_limits<uint32_t>::max() || size > static_cast<uint64_t>(max_bytes_) ||
      entry_bytes(key.size(), size) > max_bytes_) {
    return nullptr;
  }
  const std::string path = entry_path(key);
  FillLock lock(path + ".lock");
  std::shared_ptr<const MappedEntry> found;
  const int64_t deadline = now_ns() + static_cast<int64_t>(std::max(wait_s, 0.0) * 1e9);
  int64_t next_look = 0;
  const FillLock::Result result = lock.acquire(deadline, [&] {
    // Now and then (not at every poll: a map verifies the whole entry), whether the entry is there.
    if (now_ns() < next_look) return false;
    next_look = now_ns() + kNanoseconds / 4;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return false;
    found = map(key, size);
    return found != nullptr;
  });
  if (found) return found;
  if (result != FillLock::Result::kHeld) return nullptr;
  // Held: whoever held it before filled the entry, or died (or failed) without.
  if (std::shared_ptr<const MappedEntry> entry = map(key, size)) return entry;

  Temporary temporary(dir_);
  if (!temporary.ok()) return nullptr;
  const size_t offset = kHeaderSize + key.size();
  const size_t length = offset + size;
  // Allocated up front: a full disk fails here, not halfway through the fill.
  if (::posix_fallocate(temporary.fd(), 0, static_cast<off_t>(length)) != 0) return nullptr;
  // Filled by writes, not through a writable mapping: a mapping's first write to each page faults and
  // reads it in (zeros) first, 2-4x the cost of writing the same bytes (100 MB on ext4: 50-120 ms
  // against 30).
  const std::optional<uint32_t> payload_crc = fill(temporary.fd(), static_cast<int64_t>(offset));
  if (!payload_crc) return nullptr;  // an exception passes: all released
  std::vector<uint8_t> head(offset);
  std::memcpy(head.data() + kHeaderSize, key.data(), key.size());
  void* base = map_file(temporary.fd(), length, PROT_READ);
  if (base == nullptr) return nullptr;
  auto entry = std::make_shared<MappedEntry>(base, length, offset, size);
  Header header;
  header.payload_size = size;
  header.key_size = static_cast<uint32_t>(key.size());
  header.key_crc = crc32_of(key.data(), key.size());
  header.payload_crc = *payload_crc;  // taken as the bytes were written: the entry is not read back
  encode_header(header, head.data());
  if (!write_all_at(temporary.fd(), head.data(), head.size(), 0)) return nullptr;
  if (!temporary.close()) return nullptr;
  // Not placed (the lock or rename failed): the mapping still holds the bytes, filled and checked by
  // this process; the temporary file is removed and the mapping stays valid.
  if (place(dir_, max_bytes_, temporary, path, entry_bytes(key.size(), size))) lock.release(true);
  return entry;
}

int64_t DiskCache::held_bytes() const {
  AccountingLock lock(dir_);
  if (!lock.ok()) {
    throw core::ReadError(
        concat("disk cache directory ", dir_, ": cannot lock ", lock.path(), ": ", error_text(lock.error())));
  }
  const std::optional<int64_t> total = current_total(lock, dir_, max_bytes_);
  if (!total) {
    throw core::ReadError(
        concat("disk cache directory ", dir_, ": cannot write ", lock.path(), ": ", error_text(errno)));
  }
  return *total;
}

}  // namespace torch_shards::io::storage
