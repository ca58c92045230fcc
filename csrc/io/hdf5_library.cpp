#include "hdf5_library.h"

#include <pthread.h>

#include "../core/errors.h"
#include "file.h"

namespace torch_shards::io {
namespace {

std::recursive_mutex& library_mutex() {
  static std::recursive_mutex mutex;
  return mutex;
}

void before_fork() { library_mutex().lock(); }
void after_fork() { library_mutex().unlock(); }

void initialise_once() {
  static const bool done = [] {
    pthread_atfork(before_fork, after_fork, after_fork);
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

std::unique_lock<std::recursive_mutex> hdf5_lock() {
  initialise_once();
  return std::unique_lock<std::recursive_mutex>(library_mutex());
}

std::string hdf5_error_detail() {
  std::string message;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, keep_innermost_message, &message);
  H5Eclear2(H5E_DEFAULT);
  return message;
}

Hid open_hdf5_file(const std::string& path) {
  if (!file_exists(path)) throw core::FileNotFound(path);
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    throw core::ReadError(path + ": not an HDF5 file");
  }
  Hid file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) throw core::ReadError(path + ": cannot open as HDF5: " + hdf5_error_detail());
  return file;
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

}  // namespace torch_shards::io
