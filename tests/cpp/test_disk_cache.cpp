// storage::DiskCache: round trips; a size mismatch, another key under the same
// name, or a damaged file is a miss (damage removed), never wrong data; LRU
// eviction order (modification times set with utimensat, no sleeping); the
// bound after every write, in the accounting and on disk; failed writes (a
// read-only directory, a file size limit) return false and leave no temporary
// file; the accounting recovered by a rescan; stale temporary files removed;
// forked processes and threads hammering one small cache, every hit verified.
// Whole entries: filled once then mapped, damage (payload, header, cut short)
// a miss and removed, one fill per node among forked processes and their
// threads, a waiter taking over from a filler that died, a bounded wait, and
// mappings intact after their entry is evicted or replaced.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/errors.h"
#include "io/codecs.h"
#include "io/storage/disk_cache.h"

using torch_shards::core::InvalidArgument;
using torch_shards::core::ReadError;
using torch_shards::io::storage::DiskCache;
namespace fs = std::filesystem;

namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t key_seed(const std::string& key) {
  uint64_t seed = 1469598103934665603ull;
  for (const unsigned char c : key) seed = (seed ^ c) * 1099511628211ull;
  return seed;
}

// The value stored under a key, derived from the key alone so that any process can check it.
std::vector<uint8_t> value_for(const std::string& key, size_t size) {
  std::vector<uint8_t> value(size);
  uint64_t state = key_seed(key);
  for (size_t i = 0; i < size; ++i) value[i] = static_cast<uint8_t>(mix(state + i / 8) >> (8 * (i % 8)));
  return value;
}
std::vector<uint8_t> value_for(const std::string& key) { return value_for(key, 64 + key_seed(key) % 1500); }

struct OnDisk {
  int64_t entry_bytes = 0;
  int entries = 0, temporaries = 0;
};

// What the directory holds: entry files (in the subdirectories) and temporary files (anywhere).
OnDisk on_disk(const std::string& dir) {
  OnDisk found;
  for (const auto& item : fs::recursive_directory_iterator(dir)) {
    if (!item.is_regular_file()) continue;
    const std::string name = item.path().filename().string();
    if (name.rfind(".tmp", 0) == 0) {
      ++found.temporaries;
    } else if (item.path().parent_path() != fs::path(dir)) {
      found.entry_bytes += static_cast<int64_t>(item.file_size());
      ++found.entries;
    }
  }
  return found;
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

void set_modified(const std::string& path, int64_t seconds_ago) {
  timespec times[2];
  clock_gettime(CLOCK_REALTIME, &times[0]);
  times[0].tv_sec -= seconds_ago;
  times[1] = times[0];
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path << ": " << std::strerror(errno);
}

void overwrite_byte(const std::string& path, off_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  uint8_t byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, offset), 1);
  byte ^= 0x5a;
  ASSERT_EQ(::pwrite(fd, &byte, 1, offset), 1);
  ::close(fd);
}

int wait_for(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Writes and reads back random keys (some shared with other workers, some its own) and checks every
// hit; returns the number of failures (wrong bytes, a bound exceeded, an exception, nothing stored or hit).
int hammer(const DiskCache& cache, int worker, int operations) {
  int failures = 0, stored = 0, hits = 0;
  try {
    std::mt19937_64 random(1000 + worker);
    std::vector<uint8_t> out;
    for (int i = 0; i < operations; ++i) {
      const uint64_t pick = random();
      const std::string key = pick % 2 == 0
                                  ? "s3://bucket/shared/object-" + std::to_string(pick % 40) + "?etag=\"e1\"&range=0-"
                                  : "https://host/worker-" + std::to_string(worker) + "/" + std::to_string(pick % 40);
      const std::vector<uint8_t> value = value_for(key);
      if ((pick >> 8) % 4 != 0 && cache.write(key, value.data(), value.size())) ++stored;
      out.assign(value.size(), 0);
      if (cache.read(key, out.data(), out.size())) {
        ++hits;
        if (out != value) ++failures;
      }
      if ((pick >> 16) % 4 == 0) {
        const std::optional<std::vector<uint8_t>> whole = cache.read(key);
        if (whole && *whole != value) ++failures;
        out.resize(value.size() + 1);
        if (cache.read(key, out.data(), out.size())) ++failures;  // another size: never a hit
      }
      if (i % 50 == 0 && cache.held_bytes() > cache.max_bytes()) ++failures;
    }
  } catch (...) {
    ++failures;
  }
  return failures + (stored == 0 ? 1 : 0) + (hits == 0 ? 1 : 0);
}

class DiskCacheTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = testing::TempDir();
    if (pattern.empty() || pattern.back() != '/') pattern += '/';
    pattern += "disk_cache_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code error;
    for (const auto& item : fs::recursive_directory_iterator(dir_, error)) {
      if (item.is_directory()) fs::permissions(item.path(), fs::perms::owner_all, fs::perm_options::add, error);
    }
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, error);
    fs::remove_all(dir_, error);
  }

  std::string dir_;
};

TEST_F(DiskCacheTest, RoundTrip) {
  const DiskCache cache(dir_ + "/nested/cache", 1 << 20);
  EXPECT_EQ(cache.dir(), dir_ + "/nested/cache");
  EXPECT_EQ(cache.max_bytes(), 1 << 20);
  EXPECT_EQ(cache.held_bytes(), 0);

  std::string key = "s3://bucket/a/b.zarr/c/0.0?etag=\"0123\"&range=10-1033";
  key += std::string("\0/\n\xff", 4) + std::string(3000, 'x');  // any characters, long
  const std::vector<uint8_t> value = value_for(key, 1024);
  ASSERT_TRUE(cache.write(key, value.data(), value.size()));
  std::vector<uint8_t> out(value.size());
  ASSERT_TRUE(cache.read(key, out.data(), out.size()));
  EXPECT_EQ(out, value);
  EXPECT_EQ(cache.read(key), value);
  EXPECT_EQ(cache.held_bytes(), DiskCache::entry_bytes(key.size(), value.size()));

  // The entry: <dir>/<2 hex>/<32 hex>, the subdirectory its first two digits.
  const fs::path path = cache.entry_path(key);
  EXPECT_EQ(path.filename().string().size(), 32u);
  EXPECT_EQ(path.parent_path().filename().string(), path.filename().string().substr(0, 2));
  EXPECT_TRUE(exists(path));

  // Absent keys, and a key differing in one character, are misses.
  EXPECT_FALSE(cache.read("s3://bucket/other", out.data(), out.size()));
  EXPECT_FALSE(cache.read("s3://bucket/other").has_value());
  EXPECT_FALSE(cache.read(key.substr(0, key.size() - 1) + "y", out.data(), out.size()));

  // Replacing an entry: the new value, and the total follows.
  const std::vector<uint8_t> second = value_for("second", 300);
  ASSERT_TRUE(cache.write(key, second.data(), second.size()));
  EXPECT_EQ(cache.read(key), second);
  EXPECT_EQ(cache.held_bytes(), DiskCache::entry_bytes(key.size(), second.size()));

  // An empty payload is an entry like any other.
  ASSERT_TRUE(cache.write("empty", nullptr, 0));
  EXPECT_TRUE(cache.read("empty", nullptr, 0));
  EXPECT_EQ(cache.read("empty"), std::vector<uint8_t>());

  // Another object on the same directory (another process, say) sees the same entries.
  const DiskCache again(dir_ + "/nested/cache", 1 << 20);
  EXPECT_EQ(again.read(key), second);
  EXPECT_EQ(again.held_bytes(), on_disk(cache.dir()).entry_bytes);
  EXPECT_EQ(on_disk(cache.dir()).temporaries, 0);
}

TEST_F(DiskCacheTest, SizeMismatchIsAMiss) {
  const DiskCache cache(dir_, 1 << 20);
  const std::vector<uint8_t> value = value_for("key", 100);
  ASSERT_TRUE(cache.write("key", value.data(), value.size()));
  std::vector<uint8_t> out(200);
  EXPECT_FALSE(cache.read("key", out.data(), 99));
  EXPECT_FALSE(cache.read("key", out.data(), 101));
  EXPECT_FALSE(cache.read("key", out.data(), 0));
  // Not damage: the entry stays.
  ASSERT_TRUE(cache.read("key", out.data(), 100));
  EXPECT_TRUE(std::equal(value.begin(), value.end(), out.begin()));
}

TEST_F(DiskCacheTest, DamagedKeyIsAMissAndRemoved) {
  const DiskCache cache(dir_, 1 << 20);
  const std::vector<uint8_t> value = value_for("s3://bucket/key", 500);
  ASSERT_TRUE(cache.write("s3://bucket/key", value.data(), value.size()));
  const std::string path = cache.entry_path("s3://bucket/key");
  overwrite_byte(path, DiskCache::kHeaderSize + 3);
  std::vector<uint8_t> out(value.size());
  EXPECT_FALSE(cache.read("s3://bucket/key", out.data(), out.size()));
  EXPECT_FALSE(exists(path));
  EXPECT_EQ(cache.held_bytes(), 0);
  EXPECT_FALSE(cache.read("s3://bucket/key").has_value());
}

TEST_F(DiskCacheTest, DamagedPayloadIsAMissAndRemoved) {
  const DiskCache cache(dir_, 1 << 20);
  const std::vector<uint8_t> value = value_for("a", 500);
  ASSERT_TRUE(cache.write("a", value.data(), value.size()));
  ASSERT_TRUE(cache.write("b", value.data(), value.size()));
  ASSERT_TRUE(cache.write("c", value.data(), value.size()));
  ASSERT_TRUE(cache.write("d", value.data(), value.size()));
  const int64_t each = DiskCache::entry_bytes(1, value.size());
  ASSERT_EQ(cache.held_bytes(), 4 * each);

  // The payload's last byte, through each read.
  overwrite_byte(cache.entry_path("a"), each - 1);
  std::vector<uint8_t> out(value.size());
  EXPECT_FALSE(cache.read("a", out.data(), out.size()));
  EXPECT_FALSE(exists(cache.entry_path("a")));
  overwrite_byte(cache.entry_path("b"), each - 200);
  EXPECT_FALSE(cache.read("b").has_value());
  EXPECT_FALSE(exists(cache.entry_path("b")));
  // The header (its payload size), read with the size that was written.
  overwrite_byte(cache.entry_path("c"), 9);
  EXPECT_FALSE(cache.read("c", out.data(), out.size()));
  EXPECT_FALSE(exists(cache.entry_path("c")));
  // A truncated file.
  ASSERT_EQ(::truncate(cache.entry_path("d").c_str(), each - 10), 0);
  EXPECT_FALSE(cache.read("d").has_value());
  EXPECT_FALSE(exists(cache.entry_path("d")));
  EXPECT_EQ(cache.held_bytes(), on_disk(dir_).entry_bytes);
  EXPECT_EQ(on_disk(dir_).entries, 0);
}

TEST_F(DiskCacheTest, AnotherKeyUnderTheSameNameIsAMissNotWrongData) {
  // A hash collision, made by moving key A's entry to where key B's would be.
  const DiskCache cache(dir_, 1 << 20);
  const std::vector<uint8_t> value = value_for("key A", 64);
  ASSERT_TRUE(cache.write("key A", value.data(), value.size()));
  const std::string b = cache.entry_path("key B, a little longer");
  fs::create_directories(fs::path(b).parent_path());
  ASSERT_EQ(::rename(cache.entry_path("key A").c_str(), b.c_str()), 0);
  std::vector<uint8_t> out(value.size());
  EXPECT_FALSE(cache.read("key B, a little longer", out.data(), out.size()));
  EXPECT_FALSE(cache.read("key B, a little longer").has_value());
  EXPECT_TRUE(exists(b));                           // a sound entry of another key: left alone
  const std::string c = cache.entry_path("key C");  // same length as "key A"
  fs::create_directories(fs::path(c).parent_path());
  ASSERT_EQ(::rename(b.c_str(), c.c_str()), 0);
  EXPECT_FALSE(cache.read("key C", out.data(), out.size()));
  EXPECT_FALSE(cache.read("key C").has_value());
  EXPECT_TRUE(exists(c));
}

TEST_F(DiskCacheTest, LeastRecentlyUsedIsEvictedFirst) {
  const int64_t each = DiskCache::entry_bytes(2, 1000);
  const DiskCache cache(dir_, 10 * each + 100);
  std::vector<std::string> keys;
  for (int i = 0; i <= 10; ++i) keys.push_back("k" + std::string(1, static_cast<char>('a' + i)));
  for (int i = 0; i < 10; ++i) {
    const std::vector<uint8_t> value = value_for(keys[i], 1000);
    ASSERT_TRUE(cache.write(keys[i], value.data(), value.size()));
    set_modified(cache.entry_path(keys[i]), 1000 - i);  // keys[0] the oldest
  }
  ASSERT_EQ(cache.held_bytes(), 10 * each);
  // Reading the two oldest makes them the most recently used.
  std::vector<uint8_t> out(1000);
  ASSERT_TRUE(cache.read(keys[0], out.data(), out.size()));
  ASSERT_TRUE(cache.read(keys[1]).has_value());

  // One more goes over the bound: the least recently used go, down to 90% of it.
  const std::vector<uint8_t> value = value_for(keys[10], 1000);
  ASSERT_TRUE(cache.write(keys[10], value.data(), value.size()));
  EXPECT_FALSE(exists(cache.entry_path(keys[2])));
  EXPECT_FALSE(exists(cache.entry_path(keys[3])));
  for (int i : {0, 1, 4, 5, 6, 7, 8, 9, 10}) EXPECT_TRUE(exists(cache.entry_path(keys[i]))) << keys[i];
  EXPECT_EQ(cache.held_bytes(), 9 * each);
  EXPECT_EQ(on_disk(dir_).entry_bytes, 9 * each);
  EXPECT_LE(cache.held_bytes(), cache.max_bytes() - cache.max_bytes() / 10);
}

TEST_F(DiskCacheTest, BoundHoldsAfterEveryWrite) {
  const DiskCache cache(dir_, 20000);
  std::mt19937_64 random(7);
  for (int i = 0; i < 200; ++i) {
    const std::string key = "object-" + std::to_string(random() % 120);
    const std::vector<uint8_t> value = value_for(key, 100 + random() % 3000);
    ASSERT_TRUE(cache.write(key, value.data(), value.size()));
    const int64_t held = cache.held_bytes();
    ASSERT_LE(held, cache.max_bytes());
    ASSERT_EQ(held, on_disk(dir_).entry_bytes);
    ASSERT_EQ(cache.read(key), value);  // the entry just written is never the one evicted
  }
  EXPECT_EQ(on_disk(dir_).temporaries, 0);
}

TEST_F(DiskCacheTest, EntryLargerThanTheBoundIsNotStored) {
  const DiskCache cache(dir_, 1000);
  const std::vector<uint8_t> small = value_for("key", 100);
  ASSERT_TRUE(cache.write("key", small.data(), small.size()));
  const std::vector<uint8_t> large = value_for("key", 2000);
  EXPECT_FALSE(cache.write("key", large.data(), large.size()));
  EXPECT_FALSE(cache.read("key").has_value());  // nor is the older value kept
  EXPECT_EQ(cache.held_bytes(), 0);
  EXPECT_EQ(on_disk(dir_).entries, 0);
  EXPECT_EQ(on_disk(dir_).temporaries, 0);
  // Exactly the bound fits.
  const std::vector<uint8_t> exact = value_for("key", 1000 - DiskCache::entry_bytes(3, 0));
  EXPECT_TRUE(cache.write("key", exact.data(), exact.size()));
  EXPECT_EQ(cache.held_bytes(), 1000);
}

TEST_F(DiskCacheTest, InvalidArguments) {
  try {
    DiskCache(dir_, 0);
    FAIL() << "max_bytes 0 accepted";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("max_bytes must be > 0, got 0"), std::string::npos) << error.what();
  }
  EXPECT_THROW(DiskCache(dir_, -5), InvalidArgument);

  const std::string file = dir_ + "/a_file";
  ::close(::open(file.c_str(), O_WRONLY | O_CREAT, 0644));
  for (const std::string& dir : {file, file + "/below"}) {
    try {
      DiskCache cache(dir, 1000);
      FAIL() << dir << " accepted";
    } catch (const ReadError& error) {
      EXPECT_NE(std::string(error.what()).find(dir), std::string::npos) << error.what();
    }
  }
  try {
    DiskCache cache(file + "/below", 1000);
  } catch (const ReadError& error) {
    EXPECT_NE(std::string(error.what()).find("Not a directory"), std::string::npos) << error.what();
  }
}

TEST_F(DiskCacheTest, WriteIntoReadOnlyDirectoryReturnsFalse) {
  const DiskCache cache(dir_, 1 << 20);
  const std::vector<uint8_t> value = value_for("present", 100);
  ASSERT_TRUE(cache.write("present", value.data(), value.size()));
  for (const auto& item : fs::recursive_directory_iterator(dir_)) {
    if (item.is_directory()) ::chmod(item.path().c_str(), 0555);
  }
  ::chmod(dir_.c_str(), 0555);
  // Root writes anyway: the child gives up root first.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(3);
    try {
      const std::vector<uint8_t> other = value_for("absent", 100);
      if (cache.write("absent", other.data(), other.size())) ::_exit(1);
      if (cache.write("present", other.data(), other.size())) ::_exit(1);
      if (cache.read("present") != value) ::_exit(4);  // a read-only cache still reads
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(0);
  }
  const int status = wait_for(child);
  if (status == 3) GTEST_SKIP() << "cannot give up root to test permissions";
  EXPECT_EQ(status, 0) << "1: a write returned true, 2: it threw, 4: the entry was not read";
  EXPECT_EQ(on_disk(dir_).temporaries, 0);
  EXPECT_FALSE(cache.read("absent").has_value());
}

TEST_F(DiskCacheTest, FailedWriteLeavesNoTemporaryFile) {
  // A full disk, as a file size limit (which binds root too): the write fails halfway.
  const DiskCache cache(dir_, 1 << 20);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{4096, 4096};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(3);
    try {
      const std::vector<uint8_t> value = value_for("large", 100000);
      if (cache.write("large", value.data(), value.size())) ::_exit(1);
      const std::vector<uint8_t> small = value_for("small", 100);
      if (!cache.write("small", small.data(), small.size())) ::_exit(4);
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(0);
  }
  EXPECT_EQ(wait_for(child), 0) << "1: the write returned true, 2: it threw, 4: a small write failed";
  EXPECT_EQ(on_disk(dir_).temporaries, 0);
  EXPECT_FALSE(cache.read("large").has_value());
  EXPECT_EQ(cache.read("small"), value_for("small", 100));
  EXPECT_EQ(cache.held_bytes(), DiskCache::entry_bytes(5, 100));
}

TEST_F(DiskCacheTest, MissingOrDamagedAccountingIsRecounted) {
  const DiskCache cache(dir_, 1 << 20);
  for (const std::string key : {"x", "yy", "zzz"}) {
    const std::vector<uint8_t> value = value_for(key, 1000);
    ASSERT_TRUE(cache.write(key, value.data(), value.size()));
  }
  const int64_t held = cache.held_bytes();
  ASSERT_EQ(held, on_disk(dir_).entry_bytes);
  ASSERT_EQ(::unlink((dir_ + "/.accounting").c_str()), 0);
  EXPECT_EQ(cache.held_bytes(), held);
  overwrite_byte(dir_ + "/.accounting", 9);
  EXPECT_EQ(cache.held_bytes(), held);
  ASSERT_EQ(::truncate((dir_ + "/.accounting").c_str(), 3), 0);
  const std::vector<uint8_t> value = value_for("w", 10);
  ASSERT_TRUE(cache.write("w", value.data(), value.size()));
  EXPECT_EQ(cache.held_bytes(), held + DiskCache::entry_bytes(1, 10));
}

TEST_F(DiskCacheTest, ScanRemovesTemporaryFilesOfCrashedWriters) {
  const DiskCache cache(dir_, 1 << 20);
  const std::string dead = dir_ + "/.tmp-0000dead-0123456789abcdef";
  const std::string live = dir_ + "/.tmp-0000beef-0123456789abcdef";
  for (const std::string& path : {dead, live}) ::close(::open(path.c_str(), O_WRONLY | O_CREAT, 0644));
  set_modified(dead, DiskCache::kStaleTemporarySeconds + 60);
  ASSERT_EQ(::unlink((dir_ + "/.accounting").c_str()), 0);  // the next operation rescans
  EXPECT_EQ(cache.held_bytes(), 0);
  EXPECT_FALSE(exists(dead));
  EXPECT_TRUE(exists(live));  // a writer at work
}

TEST_F(DiskCacheTest, ForkedProcessesShareOneSmallCache) {
  // Small enough to evict all the time: about 70 entries of the ~200 keys.
  const DiskCache cache(dir_ + "/cache", 64 << 10);
  std::vector<pid_t> children;
  for (int worker = 0; worker < 4; ++worker) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      int failures = 0;
      if (worker < 2) {
        failures = hammer(cache, worker, 400);  // the object made before the fork
      } else {
        try {
          failures = hammer(DiskCache(dir_ + "/cache", 64 << 10), worker, 400);
        } catch (...) {
          failures = 1;
        }
      }
      ::_exit(std::min(failures, 100));
    }
    children.push_back(child);
  }
  for (const pid_t child : children) EXPECT_EQ(wait_for(child), 0) << "failures in child " << child;
  const OnDisk found = on_disk(cache.dir());
  EXPECT_EQ(found.temporaries, 0);
  EXPECT_GT(found.entries, 0);
  EXPECT_LE(found.entry_bytes, cache.max_bytes());
  EXPECT_EQ(cache.held_bytes(), found.entry_bytes);
}

TEST_F(DiskCacheTest, ThreadsShareOneCache) {
  const DiskCache cache(dir_, 24 << 10);
  std::vector<int> failures(4, 0);
  std::vector<std::thread> threads;
  for (int worker = 0; worker < 4; ++worker) {
    threads.emplace_back([&, worker] { failures[worker] = hammer(cache, worker, 200); });
  }
  for (std::thread& thread : threads) thread.join();
  for (int worker = 0; worker < 4; ++worker) EXPECT_EQ(failures[worker], 0) << "worker " << worker;
  const OnDisk found = on_disk(dir_);
  EXPECT_EQ(found.temporaries, 0);
  EXPECT_LE(found.entry_bytes, cache.max_bytes());
  EXPECT_EQ(cache.held_bytes(), found.entry_bytes);
}

}  // namespace

// ---- whole entries, mapped (map, map_or_fill) --------------------------------------------------------------------

namespace {

// A fill that writes value_for(key, size) and counts its runs in `counter` (one byte appended per run,
// O_APPEND: atomic across processes), sleeping `pause_ms` first so that others find it under way.
std::function<std::optional<uint32_t>(int, int64_t)> counted_fill(const std::string& key, size_t size,
                                                                  const std::string& counter, int pause_ms = 0) {
  return [=](int out, int64_t at) -> std::optional<uint32_t> {
    const int fd = ::open(counter.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0666);
    if (fd >= 0) {
      const char one = '1';
      (void)!::write(fd, &one, 1);
      ::close(fd);
    }
    if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    const std::vector<uint8_t> value = value_for(key, size);
    if (!torch_shards::io::storage::write_all_at(out, value.data(), size, at)) return std::nullopt;
    return torch_shards::io::codecs::crc32c(value.data(), size);
  };
}

int64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

bool same_bytes(const torch_shards::io::storage::MappedEntry& entry, const std::vector<uint8_t>& value) {
  return entry.size() == value.size() && std::memcmp(entry.data(), value.data(), value.size()) == 0;
}

}  // namespace

TEST_F(DiskCacheTest, WriteAllAtWritesAtItsOffsetAndSaysWhyItCannot) {
  const std::string path = dir_ + "/written";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0666);
  ASSERT_GE(fd, 0);
  const std::vector<uint8_t> value = value_for("written", 3 << 20);  // more than one write may take
  ASSERT_TRUE(torch_shards::io::storage::write_all_at(fd, value.data(), value.size(), 100));
  EXPECT_EQ(file_size(path), static_cast<int64_t>(value.size()) + 100);
  std::vector<uint8_t> back(value.size());
  ASSERT_EQ(::pread(fd, back.data(), back.size(), 100), static_cast<ssize_t>(back.size()));
  EXPECT_EQ(back, value);
  ::close(fd);
  const int read_only = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(read_only, 0);
  errno = 0;
  EXPECT_FALSE(torch_shards::io::storage::write_all_at(read_only, value.data(), 10, 0));
  EXPECT_EQ(errno, EBADF);
  ::close(read_only);
}

TEST_F(DiskCacheTest, WholeEntryIsFilledOnceThenMapped) {
  const DiskCache cache(dir_, 1 << 24);
  const std::string key = "object\ns3://bucket/shard-0\n\"etag-1\"\n300000";
  const std::string counter = dir_ + "/fills";
  const std::vector<uint8_t> value = value_for(key, 300000);
  EXPECT_EQ(cache.map(key, value.size()), nullptr);  // absent
  const auto filled = cache.map_or_fill(key, value.size(), counted_fill(key, value.size(), counter), 5);
  ASSERT_NE(filled, nullptr);
  EXPECT_TRUE(same_bytes(*filled, value));
  EXPECT_EQ(file_size(counter), 1);
  // One entry, accounted; no temporary file or lock file left behind.
  EXPECT_EQ(cache.held_bytes(), DiskCache::entry_bytes(key.size(), value.size()));
  EXPECT_EQ(on_disk(dir_).entries, 1);
  EXPECT_EQ(on_disk(dir_).temporaries, 0);
  EXPECT_FALSE(exists(cache.entry_path(key) + ".lock"));
  // Mapped again (verified) without filling; the same bytes through a plain read too.
  const auto mapped = cache.map_or_fill(key, value.size(), counted_fill(key, value.size(), counter), 5);
  ASSERT_NE(mapped, nullptr);
  EXPECT_TRUE(same_bytes(*mapped, value));
  EXPECT_EQ(file_size(counter), 1);
  std::vector<uint8_t> out(value.size());
  EXPECT_TRUE(cache.read(key, out.data(), out.size()));
  EXPECT_EQ(out, value);
  // Another size is a miss, not the entry.
  EXPECT_EQ(cache.map(key, value.size() - 1), nullptr);
  // Larger than the bound: not stored, nothing filled.
  EXPECT_EQ(cache.map_or_fill("big", 1 << 25, counted_fill("big", 1 << 25, counter), 5), nullptr);
  EXPECT_EQ(file_size(counter), 1);
}

TEST_F(DiskCacheTest, DamagedWholeEntryIsAMissAndRemoved) {
  const DiskCache cache(dir_, 1 << 24);
  const std::string counter = dir_ + "/fills";
  for (const int damage : {0, 1, 2}) {
    const std::string key = "object\nkey-" + std::to_string(damage);
    const std::vector<uint8_t> value = value_for(key, 100000);
    ASSERT_NE(cache.map_or_fill(key, value.size(), counted_fill(key, value.size(), counter), 5), nullptr);
    const std::string path = cache.entry_path(key);
    const int64_t each = DiskCache::entry_bytes(key.size(), value.size());
    if (damage == 0) overwrite_byte(path, each - 1);  // the payload
    if (damage == 1) overwrite_byte(path, 9);         // the header
    if (damage == 2) {
      ASSERT_EQ(::truncate(path.c_str(), each - 4096), 0);  // cut short
    }
    EXPECT_EQ(cache.map(key, value.size()), nullptr) << "damage " << damage;
    EXPECT_FALSE(exists(path)) << "damage " << damage;
    // Filled afresh, with the right bytes.
    const auto again = cache.map_or_fill(key, value.size(), counted_fill(key, value.size(), counter), 5);
    ASSERT_NE(again, nullptr);
    EXPECT_TRUE(same_bytes(*again, value));
  }
  EXPECT_EQ(file_size(counter), 6);
  EXPECT_EQ(cache.held_bytes(), on_disk(dir_).entry_bytes);
}

TEST_F(DiskCacheTest, ForkedProcessesFillAWholeEntryOnce) {
  const std::string key = "object\nhttp://127.0.0.1/shared\n\"e\"\n2000000";
  const std::string counter = dir_ + "/fills";
  const size_t size = 2000000;
  std::vector<pid_t> children;
  for (int worker = 0; worker < 6; ++worker) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      int failures = 0;
      try {
        const DiskCache cache(dir_ + "/cache", 1 << 26);
        // Two threads of each process too: one fill per node.
        std::vector<std::thread> threads;
        std::atomic<int> wrong{0};
        for (int t = 0; t < 2; ++t) {
          threads.emplace_back([&] {
            const auto entry = cache.map_or_fill(key, size, counted_fill(key, size, counter, 300), 30);
            if (entry == nullptr || !same_bytes(*entry, value_for(key, size))) ++wrong;
          });
        }
        for (auto& thread : threads) thread.join();
        failures = wrong.load();
      } catch (...) {
        failures = 1;
      }
      ::_exit(failures);
    }
    children.push_back(child);
  }
  for (const pid_t child : children) EXPECT_EQ(wait_for(child), 0) << "failures in child " << child;
  EXPECT_EQ(file_size(counter), 1);
  EXPECT_EQ(on_disk(dir_ + "/cache").temporaries, 0);
}

TEST_F(DiskCacheTest, WaiterTakesOverWhenTheFillerDies) {
  const DiskCache cache(dir_, 1 << 24);
  const std::string key = "object\ndies";
  const std::string counter = dir_ + "/fills";
  const size_t size = 50000;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Dies in the middle of its fill, holding the lock.
    cache.map_or_fill(
        key, size,
        [&](int, int64_t) -> std::optional<uint32_t> {
          const int scratch = ::open("/dev/null", O_WRONLY);
          counted_fill(key, size, counter)(scratch, 0);
          ::_exit(0);
        },
        5);
    ::_exit(1);
  }
  EXPECT_EQ(wait_for(child), 0);
  EXPECT_EQ(file_size(counter), 1);
  const auto entry = cache.map_or_fill(key, size, counted_fill(key, size, counter), 5);
  ASSERT_NE(entry, nullptr);
  EXPECT_TRUE(same_bytes(*entry, value_for(key, size)));
  EXPECT_EQ(file_size(counter), 2);
}

TEST_F(DiskCacheTest, WaitForAnotherFillIsBounded) {
  const DiskCache cache(dir_, 1 << 24);
  const std::string key = "object\nslow";
  const std::string counter = dir_ + "/fills";
  std::thread slow(
      [&] { EXPECT_NE(cache.map_or_fill(key, 1000, counted_fill(key, 1000, counter, 1500), 5), nullptr); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(cache.map_or_fill(key, 1000, counted_fill(key, 1000, counter), 0.2), nullptr);  // gave up waiting
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1000));
  slow.join();
  EXPECT_EQ(file_size(counter), 1);
  EXPECT_NE(cache.map(key, 1000), nullptr);
}

TEST_F(DiskCacheTest, EvictionAndReplacementLeaveMappingsIntact) {
  // Room for about three entries of 200 kB: writing more evicts the mapped one.
  const DiskCache cache(dir_, 700000);
  const std::string key = "object\nmapped";
  const std::string counter = dir_ + "/fills";
  const std::vector<uint8_t> value = value_for(key, 200000);
  const auto entry = cache.map_or_fill(key, value.size(), counted_fill(key, value.size(), counter), 5);
  ASSERT_NE(entry, nullptr);
  for (int i = 0; i < 6; ++i) {
    const std::string other = "other-" + std::to_string(i);
    const std::vector<uint8_t> bytes = value_for(other, 200000);
    ASSERT_TRUE(cache.write(other, bytes.data(), bytes.size()));
  }
  EXPECT_FALSE(exists(cache.entry_path(key)));  // evicted
  EXPECT_TRUE(same_bytes(*entry, value));       // still readable, unchanged
  // Replaced by a rename (a write under the same key): the mapping still holds the old bytes.
  const auto again = cache.map_or_fill(key, value.size(), counted_fill(key, value.size(), counter), 5);
  ASSERT_NE(again, nullptr);
  std::vector<uint8_t> other_value(value.size(), 7);
  ASSERT_TRUE(cache.write(key, other_value.data(), other_value.size()));
  EXPECT_TRUE(same_bytes(*again, value));
  EXPECT_EQ(cache.held_bytes(), on_disk(dir_).entry_bytes);
  EXPECT_LE(cache.held_bytes(), cache.max_bytes());
}
