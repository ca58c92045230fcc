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

#include <mutex>
#include <string>

namespace torch_shards::io {

std::unique_lock<std::recursive_mutex> hdf5_lock();

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

}  // namespace torch_shards::io
