#include "io/storage/connection_sockets.h"

#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <unordered_map>

namespace torch_shards::io::storage {
namespace {

struct Recorded {
  std::mutex mutex;
  std::unordered_map<int, ino_t> inodes;  // open socket -> its inode
};

// Never destroyed: a fork may come at any time, even during exit.
Recorded& recorded() {
  static Recorded* sockets = new Recorded;
  return *sockets;
}

ino_t inode_of(int fd) {
  struct stat status {};
  return ::fstat(fd, &status) == 0 && S_ISSOCK(status.st_mode) ? status.st_ino : 0;
}

// The table is locked across fork, so that the child finds it whole.
void before_fork() { recorded().mutex.lock(); }
void after_fork_in_parent() { recorded().mutex.unlock(); }
void after_fork_in_child() {
  Recorded& sockets = recorded();
  const int saved = errno;
  for (const auto& [fd, inode] : sockets.inodes) {
    if (inode != 0 && inode_of(fd) == inode) ::close(fd);  // the parent's connection: never used here
  }
  sockets.inodes.clear();
  errno = saved;
  sockets.mutex.unlock();
}

void install_fork_handler() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child); });
}

}  // namespace

int open_connection_socket(int family, int type, int protocol) {
  install_fork_handler();
  const int fd = ::socket(family, type, protocol);
  if (fd < 0) return fd;
  const int saved = errno;
  const ino_t inode = inode_of(fd);
  {
    std::lock_guard<std::mutex> lock(recorded().mutex);
    recorded().inodes[fd] = inode;
  }
  errno = saved;
  return fd;
}

int close_connection_socket(int fd) {
  {
    std::lock_guard<std::mutex> lock(recorded().mutex);
    recorded().inodes.erase(fd);
  }
  return ::close(fd);
}

}  // namespace torch_shards::io::storage
