#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "../core/errors.h"

namespace torch_shards::io {

using core::concat;
using core::ReadError;

File::File(std::string path) : path_(std::move(path)) {
  const int fd = descriptor();
  struct stat info {};
  if (::fstat(fd, &info) != 0) throw ReadError(concat(path_, ": cannot stat: ", std::strerror(errno)));
  size_ = static_cast<int64_t>(info.st_size);
}

File::~File() {
  // A descriptor inherited from the parent is closed too: it is this process's copy.
  if (fd_ >= 0) ::close(fd_);
}

int File::descriptor() const {
  const int pid = static_cast<int>(::getpid());
  if (owner_pid_.load(std::memory_order_acquire) == pid) return fd_.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(open_mutex_);
  if (owner_pid_.load(std::memory_order_relaxed) != pid) {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw ReadError(concat(path_, ": cannot open: ", std::strerror(errno)));
    const int inherited = fd_.exchange(fd);
    if (inherited >= 0) ::close(inherited);
    owner_pid_.store(pid, std::memory_order_release);
  }
  return fd_.load(std::memory_order_relaxed);
}

void File::read_at(int64_t offset, size_t bytes, void* out, const std::string& what) const {
  if (offset < 0 || offset + static_cast<int64_t>(bytes) > size_) {
    throw ReadError(concat(path_, ": ", what, " needs bytes [", offset, ", ", offset + static_cast<int64_t>(bytes),
                           ") but the file has ", size_, " bytes (truncated or corrupt)"));
  }
  auto* cursor = static_cast<uint8_t*>(out);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t got = ::pread(descriptor(), cursor + done, bytes - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw ReadError(concat(path_, ": reading ", what, " failed: ", std::strerror(errno)));
    }
    if (got == 0) throw ReadError(concat(path_, ": unexpected end of file reading ", what));
    done += static_cast<size_t>(got);
  }
}

std::vector<uint8_t> File::read_at(int64_t offset, size_t bytes, const std::string& what) const {
  std::vector<uint8_t> out(bytes);
  read_at(offset, bytes, out.data(), what);
  return out;
}

std::vector<uint8_t> read_whole_file(const std::string& path) {
  File file(path);
  return file.read_at(0, static_cast<size_t>(file.size()), "the whole file");
}

bool file_exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

bool is_directory(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

}  // namespace torch_shards::io
