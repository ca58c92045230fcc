#include "io/hdf5_library.h"

#include <pthread.h>

#include "core/errors.h"
#include "io/file.h"
#include "io/hdf5_format.h"
#include "io/hdf5_remote_driver.h"
#include "io/storage/url.h"

namespace torch_shards::io {
namespace {

Hdf5Mutex& library_mutex() {
  static Hdf5Mutex mutex;
  return mutex;
}

// Before fork: wait until no other thread is inside HDF5, and keep it so.
void before_fork() { library_mutex().lock(); }
void after_fork_in_parent() { library_mutex().unlock(); }
void after_fork_in_child() { library_mutex().reset_in_child(); }

void initialise_once() {
  static const bool done = [] {
    pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
    // Errors are reported through exceptions, not printed by the library.
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

// Walking upward, the first entry is the innermost one: the actual cause.
herr_t keep_innermost_message(unsigned, const H5E_error2_t* error, void* data) {
  auto* message = static_cast<std::string*>(data);
  if (message->empty() && error->desc != nullptr && *error->desc != '\0') *message = error->desc;
  return 0;
}

}  // namespace

void Hdf5Mutex::lock() {
  const pthread_t self = pthread_self();
  // Only this thread ever stores its own id here, so seeing it means we hold the lock.
  if (pthread_equal(owner_.load(std::memory_order_relaxed), self)) {
    ++depth_;
    return;
  }
  pthread_mutex_lock(&mutex_);
  owner_.store(self, std::memory_order_relaxed);
  depth_ = 1;
}

void Hdf5Mutex::unlock() {
  if (--depth_ > 0) return;
  owner_.store(pthread_t{}, std::memory_order_relaxed);
  pthread_mutex_unlock(&mutex_);
}

void Hdf5Mutex::reset_in_child() {
  // The at-fork prepare handler took one level; the forking thread may have
  // held the lock already (a fork from inside a locked section).
  const int held_before_fork = depth_ - 1;
  pthread_mutex_init(&mutex_, nullptr);
  owner_.store(pthread_t{}, std::memory_order_relaxed);
  depth_ = 0;
  if (held_before_fork > 0) {
    lock();
    depth_ = held_before_fork;
  }
}

bool Hdf5Mutex::held_by_this_thread() const {
  return pthread_equal(owner_.load(std::memory_order_relaxed), pthread_self());
}

std::unique_lock<Hdf5Mutex> hdf5_lock() {
  initialise_once();
  return std::unique_lock<Hdf5Mutex>(library_mutex());
}

bool hdf5_lock_held() { return library_mutex().held_by_this_thread(); }

std::string hdf5_error_detail() {
  std::string message;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, keep_innermost_message, &message);
  H5Eclear2(H5E_DEFAULT);
  return message;
}

Hid open_hdf5_file(const std::string& path) {
  if (!file_exists(path)) throw core::FileNotFound(path);
  if (!is_hdf5_signature(path)) throw core::ReadError(path + ": not an HDF5 file");
  const Hid access(hdf5_file_access(path), [](hid_t id) { return id == H5P_DEFAULT ? herr_t{0} : H5Pclose(id); });
  Hid file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, access.get()), H5Fclose);
  if (!file.valid()) throw core::ReadError(path + ": cannot open as HDF5: " + hdf5_error_detail());
  return file;
}

bool is_hdf5_signature(const std::string& path) {
  if (storage::is_url(path)) {
    // HDF5's own check reads through its default driver: the signature is looked for here instead. A
    // request that fails (after its retries) raises, naming the URL: it says nothing of the format.
    return hdf5::find_superblock(File(path, File::Access::kMetadata)).has_value();
  }
  const htri_t result = H5Fis_hdf5(path.c_str());
  H5Eclear2(H5E_DEFAULT);
  return result > 0;
}

bool hdf5_path_exists(hid_t file, const std::string& path) {
  if (path.empty() || path == "/") return true;
  std::string prefix;
  size_t start = path[0] == '/' ? 1 : 0;
  while (start <= path.size()) {
    const size_t slash = path.find('/', start);
    prefix += "/" + path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    const htri_t exists = H5Lexists(file, prefix.c_str(), H5P_DEFAULT);
    if (exists <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return H5Oexists_by_name(file, path.c_str(), H5P_DEFAULT) > 0;
}

H5O_type_t hdf5_object_type(hid_t file, const std::string& path) {
  if (!hdf5_path_exists(file, path)) return H5O_TYPE_UNKNOWN;
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t info;
  const herr_t status = H5Oget_info_by_name3(file, path.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT);
#else
  H5O_info_t info;
  const herr_t status = H5Oget_info_by_name2(file, path.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT);
#endif
  if (status < 0) {
    H5Eclear2(H5E_DEFAULT);
    return H5O_TYPE_UNKNOWN;
  }
  return info.type;
}

uint64_t hdf5_object_address(hid_t file, const std::string& path, const std::string& where) {
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t info;
  if (H5Oget_info_by_name3(file, path.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) >= 0) {
    haddr_t address = HADDR_UNDEF;
    if (H5VLnative_token_to_addr(file, info.token, &address) >= 0) return address;
  }
#else
  H5O_info_t info;
  if (H5Oget_info_by_name2(file, path.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) >= 0) return info.addr;
#endif
  throw core::ReadError(where + ": cannot locate its object header: " + hdf5_error_detail());
}

}  // namespace torch_shards::io
