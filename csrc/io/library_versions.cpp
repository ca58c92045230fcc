#include "io/library_versions.h"

#include <blosc.h>
#include <dlfcn.h>
#include <lz4.h>
#include <zlib.h>
#include <zstd.h>

#include "core/errors.h"
#include "io/hdf5_library.h"

namespace torch_shards::io {
namespace {

// The shared object a function was loaded from.
std::string loaded_from(const void* function) {
  Dl_info info{};
  if (dladdr(function, &info) == 0 || info.dli_fname == nullptr) return "unknown";
  return info.dli_fname;
}

template <typename Function>
const void* address_of(Function* function) {
  return reinterpret_cast<const void*>(function);
}

std::string szip_detail() {
  unsigned int flags = 0;
  auto lock = hdf5_lock();
  if (H5Zfilter_avail(H5Z_FILTER_SZIP) <= 0 || H5Zget_filter_info(H5Z_FILTER_SZIP, &flags) < 0) {
    H5Eclear2(H5E_DEFAULT);
    return "not available";
  }
  const bool encode = (flags & H5Z_FILTER_CONFIG_ENCODE_ENABLED) != 0;
  const bool decode = (flags & H5Z_FILTER_CONFIG_DECODE_ENABLED) != 0;
  return encode && decode ? "decode, encode" : decode ? "decode" : "not available";
}

}  // namespace

std::vector<LibraryVersion> library_versions() {
  unsigned major = 0, minor = 0, release = 0;
  {
    auto lock = hdf5_lock();
    H5get_libversion(&major, &minor, &release);
  }
  std::vector<LibraryVersion> libraries;
  libraries.push_back({"hdf5", core::concat(major, ".", minor, ".", release),
                       loaded_from(address_of(&H5get_libversion)), "szip filter: " + szip_detail()});
  libraries.push_back({"blosc", blosc_get_version_string(), loaded_from(address_of(&blosc_get_version_string)),
                       core::concat("compressors: ", blosc_list_compressors())});
  libraries.push_back({"lz4", LZ4_versionString(), loaded_from(address_of(&LZ4_versionString)), ""});
  libraries.push_back({"zstd", ZSTD_versionString(), loaded_from(address_of(&ZSTD_versionString)), ""});
  libraries.push_back({"zlib", zlibVersion(), loaded_from(address_of(&zlibVersion)), ""});
  return libraries;
}

}  // namespace torch_shards::io
