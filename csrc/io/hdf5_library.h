// Access to the HDF5 C library.
//
// Every HDF5 call torch_shards makes holds `hdf5_lock()`. A pthread_atfork
// handler takes the same lock around fork(), so a child never inherits the
// library mid-call (its internal lock held by a thread that does not exist
// in the child). No HDF5 identifier stays open between calls: files are
// opened, read and closed inside one locked section, and data is read with
// pread, so nothing HDF5-related crosses a fork.
#pragma once

#include <hdf5.h>
#include <pthread.h>

#include <atomic>
#include <mutex>
#include <string>

namespace torch_shards::io {

// The process-wide HDF5 lock: recursive, and usable in a forked child.
// std::recursive_mutex is not: glibc records its owner by kernel thread id,
// which changes in the child, so the child's at-fork handler cannot unlock
// the mutex the parent's handler locked and the child's first HDF5 call
// waits forever. This one records its owner by pthread_self() (the forking
// thread keeps its value in the child) and is re-initialised in the child.
class Hdf5Mutex {
 public:
  Hdf5Mutex() = default;
  Hdf5Mutex(const Hdf5Mutex&) = delete;
  Hdf5Mutex& operator=(const Hdf5Mutex&) = delete;

  void lock();
  void unlock();
  // In a forked child (one thread): back to the state the forking thread had
  // before the at-fork handler locked it.
  void reset_in_child();
  // Whether the calling thread holds the lock.
  bool held_by_this_thread() const;

 private:
  pthread_mutex_t mutex_ = PTHREAD_MUTEX_INITIALIZER;
  std::atomic<pthread_t> owner_{pthread_t{}};
  int depth_ = 0;  // written by the owner only
};

std::unique_lock<Hdf5Mutex> hdf5_lock();
// Whether the calling thread holds hdf5_lock() (for checks and tests).
bool hdf5_lock_held();

// Whether the file at `path` (a URL too) starts with HDF5's signature, where
// HDF5 looks for it. Hold hdf5_lock().
bool is_hdf5_signature(const std::string& path);

// The innermost message of HDF5's error stack ("" if empty), for errors.
std::string hdf5_error_detail();

// An HDF5 identifier closed with the right function when it goes out of scope.
class Hid {
 public:
  using Closer = herr_t (*)(hid_t);
  Hid() = default;
  Hid(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  ~Hid() { reset(); }
  Hid(Hid&& other) noexcept : id_(other.id_), closer_(other.closer_) { other.id_ = -1; }
  Hid& operator=(Hid&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = other.id_;
      closer_ = other.closer_;
      other.id_ = -1;
    }
    return *this;
  }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset() {
    if (id_ >= 0 && closer_ != nullptr) closer_(id_);
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

// Opens a file read-only (caller holds hdf5_lock()); throws ReadError naming it.
Hid open_hdf5_file(const std::string& path);
// Whether the object at `path` exists (every component checked).
bool hdf5_path_exists(hid_t file, const std::string& path);
// The type of the object at `path` (H5O_TYPE_UNKNOWN if there is none).
H5O_type_t hdf5_object_type(hid_t file, const std::string& path);
// The file address of the object header of the object at `path` (which exists).
uint64_t hdf5_object_address(hid_t file, const std::string& path, const std::string& where);

}  // namespace torch_shards::io
