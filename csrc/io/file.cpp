#include "io/file.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <system_error>

#include "core/errors.h"
#include "core/random.h"
#include "core/stable_hash.h"
#include "core/streaming_copy.h"
#include "io/storage/remote_pages.h"
#include "io/storage/remote_paths.h"

namespace torch_shards::io {

using core::concat;
using core::ReadError;

namespace {

std::atomic<int> cached_pid{0};

void refresh_pid_after_fork() { cached_pid.store(static_cast<int>(::getpid())); }

// SIGBUS during a copy from a mapping (the file shrank, the storage failed)
// jumps back to the copy's caller instead of killing the process. Other
// SIGBUS go to whichever handler was installed before.
thread_local sigjmp_buf* guarded_copy_target = nullptr;
struct sigaction previous_sigbus {};

void on_sigbus(int signal, siginfo_t* info, void* context) {
  if (guarded_copy_target != nullptr) siglongjmp(*guarded_copy_target, 1);
  if (previous_sigbus.sa_flags & SA_SIGINFO) {
    previous_sigbus.sa_sigaction(signal, info, context);
  } else if (previous_sigbus.sa_handler != SIG_DFL && previous_sigbus.sa_handler != SIG_IGN) {
    previous_sigbus.sa_handler(signal);
  } else {
    ::signal(SIGBUS, SIG_DFL);
    ::raise(SIGBUS);
  }
}

// The process whose SIGBUS handler is on_sigbus. A forked DataLoader worker
// inherits it, then torch replaces it with its own (which reports a bus
// error and exits): the worker installs it again, chained to torch's.
std::atomic<int> sigbus_handler_pid{0};

void install_sigbus_handler();

// Runs work() with a SIGBUS on this thread jumping back here: false if one
// did (work was abandoned where it stood). An exception from work() passes
// through, the guard removed.
template <typename Work>
bool guarded(const Work& work) {
  install_sigbus_handler();
  sigjmp_buf target;
  if (sigsetjmp(target, 0) != 0) {
    guarded_copy_target = nullptr;
    return false;
  }
  guarded_copy_target = &target;
  // The handler reads the target: keep the stores around the work (the
  // compiler would otherwise drop the first one as dead).
  std::atomic_signal_fence(std::memory_order_seq_cst);
  try {
    work();
  } catch (...) {
    guarded_copy_target = nullptr;
    throw;
  }
  std::atomic_signal_fence(std::memory_order_seq_cst);
  guarded_copy_target = nullptr;
  return true;
}

bool guarded_copy(void* out, const void* in, size_t bytes, bool streaming) {
  return guarded([&] {
    core::copy_bytes(out, in, bytes, streaming);
    if (streaming) core::streaming_fence();
  });
}

// The error of a read whose mapping faulted (SIGBUS).
ReadError mapping_fault(const std::string& path, int64_t offset, size_t bytes, const std::string& what) {
  return ReadError(concat(path, ": reading ", what, " (bytes [", offset, ", ", offset + static_cast<int64_t>(bytes),
                          ")) failed: the file shrank or its storage failed while mapped"));
}

bool mapping_enabled() {
  static const bool enabled = [] {
    const char* setting = std::getenv("TORCH_SHARDS_MMAP");
    return setting == nullptr || std::strcmp(setting, "0") != 0;
  }();
  return enabled;
}

// Storage that is never destroyed: the atfork handler may run at any time.
alignas(std::mutex) unsigned char first_use_storage[sizeof(std::mutex)];
std::mutex* first_use = new (first_use_storage) std::mutex;

void reset_after_fork_in_child() {
  refresh_pid_after_fork();
  first_use = new (first_use_storage) std::mutex;  // the only thread now: a fresh, unlocked mutex
}

void install_fork_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    refresh_pid_after_fork();
    pthread_atfork(nullptr, nullptr, reset_after_fork_in_child);
  });
}

// Once per process (a fork's child included), before its first guarded read.
void install_sigbus_handler() {
  const int pid = current_process_id();
  if (sigbus_handler_pid.load(std::memory_order_acquire) == pid) return;
  std::lock_guard<std::mutex> lock(*first_use);
  if (sigbus_handler_pid.load(std::memory_order_relaxed) == pid) return;
  struct sigaction current {};
  sigaction(SIGBUS, nullptr, &current);
  if (!(current.sa_flags & SA_SIGINFO) || current.sa_sigaction != on_sigbus) {
    struct sigaction action {};
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;  // NODEFER: jumping out leaves SIGBUS unblocked
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &previous_sigbus);
  }
  sigbus_handler_pid.store(pid, std::memory_order_release);
}

std::optional<FileStamp> stamp_of(int result, const struct stat& info) {
  if (result != 0) return std::nullopt;
  FileStamp stamp;
  stamp.device = static_cast<uint64_t>(info.st_dev);
  stamp.inode = static_cast<uint64_t>(info.st_ino);
  stamp.size = static_cast<int64_t>(info.st_size);
  stamp.modified_ns = static_cast<int64_t>(info.st_mtim.tv_sec) * 1000000000 + info.st_mtim.tv_nsec;
  return stamp;
}

}  // namespace

std::optional<FileStamp> FileStamp::of_descriptor(int fd) {
  struct stat info {};
  return stamp_of(::fstat(fd, &info), info);
}

namespace {

FileStamp stamp_of_object(const storage::ObjectStamp& object) {
  FileStamp stamp;
  stamp.size = object.size;
  stamp.etag = object.etag;
  return stamp;
}

}  // namespace

std::optional<FileStamp> FileStamp::of_path(const std::string& path) {
  if (storage::is_url(path)) {
    const std::optional<storage::ObjectStamp> object = storage::stat_remote(path);
    if (!object) return std::nullopt;
    return stamp_of_object(*object);
  }
  struct stat info {};
  return stamp_of(::stat(path.c_str(), &info), info);
}

std::string FileStamp::changes_to(const FileStamp& now) const {
  if (now.etag != etag) return concat("ETag ", etag, " -> ", now.etag, " (replaced)");
  if (now.device != device || now.inode != inode) {
    return concat("another file now: inode ", inode, " -> ", now.inode, " (replaced)");
  }
  if (now.size != size) return concat("size ", size, " -> ", now.size, " bytes");
  if (now.modified_ns > modified_ns) {
    return concat("written ", static_cast<double>(now.modified_ns - modified_ns) / 1e9,
                  " s after its stamp when opened");
  }
  if (now.modified_ns != modified_ns) return "its modification time changed";
  return "";
}

bool file_checks_enabled() {
  static const bool enabled = [] {
    const char* setting = std::getenv("TORCH_SHARDS_CHECK_FILES");
    return setting == nullptr || std::strcmp(setting, "0") != 0;
  }();
  return enabled;
}

uint64_t FileStamp::digest() const {
  uint64_t h = core::mix64(device + 0x9e3779b97f4a7c15ULL);
  h = core::mix64(h ^ inode);
  h = core::mix64(h ^ static_cast<uint64_t>(size));
  h = core::mix64(h ^ static_cast<uint64_t>(modified_ns));
  if (!etag.empty()) h = core::mix64(h ^ static_cast<uint64_t>(core::stable_hash(etag)));
  return h == 0 ? 1 : h;
}

int64_t use_clock() {
  struct timespec now {};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

int current_process_id() {
  install_fork_handler();
  return cached_pid.load(std::memory_order_relaxed);
}

bool run_guarded(core::FunctionRef<void()> work) {
  return guarded([&] { work(); });
}

std::mutex& first_use_mutex() {
  install_fork_handler();
  return *first_use;
}

File::File(std::string path, Access access)
    : path_(std::move(path)), map_(access != Access::kRead && mapping_enabled()) {
  if (storage::is_url(path_)) {
    std::optional<storage::RemoteObject> object = storage::open_remote(path_);
    if (!object) throw core::FileNotFound(path_);
    map_ = false;
    paged_ = access == Access::kMetadata;
    remote_ = std::make_shared<const storage::RemoteObject>(std::move(*object));
    stamp_ = stamp_of_object(remote_->stamp);
    size_ = stamp_.size;
    return;
  }
  take_stamp(descriptor());
}

File::File(std::string path, std::shared_ptr<const storage::RemoteObject> remote, Access access)
    : path_(std::move(path)), remote_(std::move(remote)), paged_(access == Access::kMetadata) {
  stamp_ = stamp_of_object(remote_->stamp);
  size_ = stamp_.size;
}

File::File(std::string path, Access access, int fd)
    : path_(std::move(path)), map_(access != Access::kRead && mapping_enabled()) {
  fd_.store(fd);
  owner_pid_.store(current_process_id());
  take_stamp(fd);
}

void File::take_stamp(int fd) {
  const std::optional<FileStamp> stamp = FileStamp::of_descriptor(fd);
  if (!stamp) throw ReadError(concat(path_, ": cannot stat: ", std::strerror(errno)));
  stamp_ = *stamp;
  size_ = stamp_.size;
}

std::shared_ptr<const File> File::open_if_exists(const std::string& path, Access access) {
  if (storage::is_url(path)) {
    std::optional<storage::RemoteObject> object = storage::open_remote(path);
    if (!object) return nullptr;
    return std::shared_ptr<const File>(
        new File(path, std::make_shared<const storage::RemoteObject>(std::move(*object)), access));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) return nullptr;
  if (fd < 0) throw ReadError(concat(path, ": cannot open: ", std::strerror(errno)));
  try {
    return std::shared_ptr<const File>(new File(path, access, fd));
  } catch (...) {
    ::close(fd);  // a constructor that throws runs no destructor
    throw;
  }
}

File::~File() {
  // A descriptor or mapping inherited from the parent is this process's copy: release it too.
  if (const uint8_t* mapped = mapped_.load()) ::munmap(const_cast<uint8_t*>(mapped), static_cast<size_t>(size_));
  if (fd_ >= 0) ::close(fd_);
}

const uint8_t* File::remote_mapping(core::FunctionRef<std::string()> what) const {
  if (const uint8_t* data = whole_data_.load(std::memory_order_acquire)) return data;
  if (size_ == 0 || whole_missing_.load(std::memory_order_relaxed)) return nullptr;
  // Outside the lock: this may fetch the object (the store lets one thread of the process do it).
  std::shared_ptr<const storage::MappedEntry> entry = storage::map_remote(*remote_, [&] { return what(); });
  if (!entry) {
    whole_missing_.store(true, std::memory_order_relaxed);
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(first_use_mutex());
  if (!whole_) {
    whole_ = std::move(entry);
    whole_data_.store(whole_->data(), std::memory_order_release);
  }
  return whole_data_.load(std::memory_order_acquire);
}

const uint8_t* File::mapping() const {
  if (remote_) return remote_mapping([] { return std::string("the object"); });
  if (!map_ || size_ == 0) return nullptr;
  if (const uint8_t* mapped = mapped_.load(std::memory_order_acquire)) return mapped;
  const int fd = descriptor();  // before the lock: descriptor() takes it to reopen in a new process
  std::lock_guard<std::mutex> lock(first_use_mutex());
  if (mapping_failed_) return nullptr;
  if (mapped_.load() == nullptr) {
    void* address = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd, 0);
    if (address == MAP_FAILED) {
      mapping_failed_ = true;  // e.g. a file system without mmap: pread it is
      return nullptr;
    }
    mapped_.store(static_cast<const uint8_t*>(address), std::memory_order_release);
  }
  return mapped_.load();
}

int File::descriptor() const {
  const int pid = current_process_id();
  if (owner_pid_.load(std::memory_order_acquire) == pid) return fd_.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(first_use_mutex());
  if (owner_pid_.load(std::memory_order_relaxed) != pid) {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw ReadError(concat(path_, ": cannot open: ", std::strerror(errno)));
    // Opened again in a new process: the same file?
    if (owner_pid_.load(std::memory_order_relaxed) != 0 && file_checks_enabled()) {
      const std::string change = change_since_opened(fd);
      if (!change.empty()) {
        ::close(fd);
        throw ReadError(concat(path_, ": the file changed since the dataset opened it (", change,
                               "); open the dataset again once the file is written"));
      }
    }
    const int inherited = fd_.exchange(fd);
    if (inherited >= 0) ::close(inherited);
    owner_pid_.store(pid, std::memory_order_release);
  }
  return fd_.load(std::memory_order_relaxed);
}

void File::note_use() const {
  const int64_t now = use_clock();
  int64_t seen = last_use_.load(std::memory_order_relaxed);
  while (seen < now && !last_use_.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

std::string File::change_since_opened(int fd) const {
  const std::optional<FileStamp> now = FileStamp::of_descriptor(fd);
  return now ? stamp_.changes_to(*now) : concat("cannot stat: ", std::strerror(errno));
}

void File::check_unchanged() const {
  // An object behind a URL: every request for its bytes carries the ETag stamped at open (If-Match),
  // and the cache serves that version only: a replaced object fails the read that would mix.
  if (!file_checks_enabled() || remote_) return;
  const std::string change = change_since_opened(descriptor());
  if (change.empty()) return;
  throw ReadError(concat(path_, ": the file changed while being read (", change,
                         "): rows read from it may mix its old and new contents, so they are not delivered; open "
                         "the dataset again once the file is written"));
}

bool File::contains(int64_t offset, size_t bytes) const {
  // In unsigned arithmetic, so that no offset or size read from a file can overflow the check.
  return offset >= 0 && static_cast<uint64_t>(offset) <= static_cast<uint64_t>(size_) &&
         bytes <= static_cast<uint64_t>(size_) - static_cast<uint64_t>(offset);
}

void File::check_range(int64_t offset, size_t bytes, const std::string& what) const {
  if (!contains(offset, bytes)) {
    throw ReadError(concat(path_, ": ", what, " needs ", bytes, " bytes at offset ", offset, " but the file has ",
                           size_, " bytes (truncated or corrupt)"));
  }
}

void File::read_at(int64_t offset, size_t bytes, void* out, const std::string& what, bool streaming) const {
  read_at(
      offset, bytes, out, [&] { return what; }, streaming);
}

void File::read_at(int64_t offset, size_t bytes, void* out, core::FunctionRef<std::string()> what,
                   bool streaming) const {
  if (!contains(offset, bytes)) check_range(offset, bytes, what());  // raises
  note_use();
  if (remote_ && remote_mapping(what) == nullptr) {
    if (paged_ && bytes <= kPagedReadBytes) {
      storage::read_remote_paged(*remote_, offset, static_cast<int64_t>(bytes), static_cast<uint8_t*>(out),
                                 [&] { return what(); });
    } else {
      read_remote({Range{offset, bytes, out}}, what);
    }
    return;
  }
  if (const uint8_t* mapped = mapping()) {
    if (!guarded_copy(out, mapped + offset, bytes, streaming)) throw mapping_fault(path_, offset, bytes, what());
    return;
  }
  auto* cursor = static_cast<uint8_t*>(out);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t got = ::pread(descriptor(), cursor + done, bytes - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw ReadError(concat(path_, ": reading ", what(), " failed: ", std::strerror(errno)));
    }
    if (got == 0) throw ReadError(concat(path_, ": unexpected end of file reading ", what()));
    done += static_cast<size_t>(got);
  }
}

bool File::use_mapped(int64_t offset, size_t bytes, core::FunctionRef<void(const uint8_t*)> use,
                      core::FunctionRef<std::string()> what) const {
  if (!contains(offset, bytes)) check_range(offset, bytes, what());  // raises; what() only for a message
  note_use();
  const uint8_t* mapped = mapping();
  if (mapped == nullptr) return false;
  if (!guarded([&] { use(mapped + offset); })) throw mapping_fault(path_, offset, bytes, what());
  return true;
}

const uint8_t* File::mapped_bytes(int64_t offset, size_t bytes, core::FunctionRef<std::string()> what) const {
  if (!contains(offset, bytes)) check_range(offset, bytes, what());  // raises; what() only for a message
  if (remote_) return nullptr;
  note_use();
  const uint8_t* mapped = mapping();
  return mapped == nullptr ? nullptr : mapped + offset;
}

void File::read_ranges(const std::vector<Range>& ranges, core::FunctionRef<std::string()> what) const {
  for (const Range& range : ranges) {
    if (!contains(range.offset, range.bytes)) check_range(range.offset, range.bytes, what());  // raises
  }
  if (!remote_) {
    for (const Range& range : ranges) read_at(range.offset, range.bytes, range.out, what);
    return;
  }
  note_use();
  if (const uint8_t* mapped = remote_mapping(what)) {
    for (const Range& range : ranges) {
      if (range.bytes > 0 && !guarded_copy(range.out, mapped + range.offset, range.bytes, false)) {
        throw mapping_fault(path_, range.offset, range.bytes, what());
      }
    }
    return;
  }
  read_remote(ranges, what);
}

void File::hold_pages(const std::vector<std::pair<int64_t, int64_t>>& ranges) const {
  if (!remote_ || !paged_ || whole_data_.load(std::memory_order_acquire) != nullptr) return;
  storage::hold_remote_pages(*remote_, ranges, [] { return std::string("metadata read ahead"); });
}

void File::read_remote(const std::vector<Range>& ranges, core::FunctionRef<std::string()> what) const {
  std::vector<storage::RangeRead> reads;
  reads.reserve(ranges.size());
  for (const Range& range : ranges) {
    reads.push_back({range.offset, static_cast<int64_t>(range.bytes), static_cast<uint8_t*>(range.out)});
  }
  storage::read_remote(*remote_, reads, [&] { return what(); });
}

std::vector<uint8_t> File::read_at(int64_t offset, size_t bytes, const std::string& what) const {
  check_range(offset, bytes, what);  // before allocating: `bytes` may come from a corrupt file
  std::vector<uint8_t> out(bytes);
  read_at(offset, bytes, out.data(), what);
  return out;
}

void check_files_unchanged(std::vector<const File*>& files, int64_t since) {
  // Those used first (of a store's many shards, a read uses few), then each once.
  files.erase(std::remove_if(files.begin(), files.end(), [&](const File* file) { return file->last_use() < since; }),
              files.end());
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  for (const File* file : files) file->check_unchanged();
}

std::vector<uint8_t> read_whole_file(const std::string& path) {
  if (storage::is_url(path)) {
    std::vector<std::optional<std::vector<uint8_t>>> objects = storage::read_remote_objects({path});
    if (!objects[0].has_value()) throw core::FileNotFound(path);
    return std::vector<uint8_t>(std::move(objects[0].value()));
  }
  File file(path);
  return file.read_at(0, static_cast<size_t>(file.size()), "the whole file");
}

std::vector<std::optional<std::vector<uint8_t>>> read_whole_files_if_exist(const std::vector<std::string>& paths,
                                                                           std::vector<FileStamp>* stamps) {
  std::vector<std::optional<std::vector<uint8_t>>> out(paths.size());
  if (stamps != nullptr) stamps->assign(paths.size(), FileStamp{});
  std::vector<std::string> urls;
  std::vector<size_t> remote;
  for (size_t i = 0; i < paths.size(); ++i) {
    if (storage::is_url(paths[i])) {
      urls.push_back(paths[i]);
      remote.push_back(i);
      continue;
    }
    const std::shared_ptr<const File> file = File::open_if_exists(paths[i]);
    if (!file) continue;
    out[i] = file->read_at(0, static_cast<size_t>(file->size()), "the whole file");
    if (stamps != nullptr) (*stamps)[i] = file->stamp();
  }
  if (urls.empty()) return out;
  std::vector<std::string> etags;
  std::vector<std::optional<std::vector<uint8_t>>> fetched = storage::read_remote_objects(urls, &etags);
  for (size_t k = 0; k < remote.size(); ++k) {
    if (stamps != nullptr && fetched[k]) {
      (*stamps)[remote[k]] = stamp_of_object({static_cast<int64_t>(fetched[k]->size()), etags[k]});
    }
    out[remote[k]] = std::move(fetched[k]);
  }
  return out;
}

std::optional<std::vector<uint8_t>> read_whole_file_if_exists(const std::string& path) {
  if (storage::is_url(path)) return std::move(storage::read_remote_objects({path})[0]);
  if (!file_exists(path)) return std::nullopt;
  return read_whole_file(path);
}

bool file_exists(const std::string& path) {
  if (storage::is_url(path)) return storage::remote_exists(path);
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

bool is_directory(const std::string& path) {
  if (storage::is_url(path)) return storage::remote_is_directory(path);
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

void list_store(const std::string& path) {
  if (storage::is_url(path)) storage::list_remote_store(path);
}

std::vector<std::pair<std::string, bool>> list_directory(const std::string& path) {
  if (storage::is_url(path)) return storage::list_remote(path);
  std::vector<std::pair<std::string, bool>> entries;
  std::error_code error;
  for (std::filesystem::directory_iterator entry(path, error), end; !error && entry != end; entry.increment(error)) {
    std::error_code kind_error;
    entries.emplace_back(entry->path().filename().string(), entry->is_directory(kind_error));
  }
  if (error) throw ReadError(concat(path, ": cannot list the directory: ", error.message()));
  std::sort(entries.begin(), entries.end());
  return entries;
}

}  // namespace torch_shards::io
