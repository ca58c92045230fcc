#include "io/decode_plan/nvcomp_library.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "core/errors.h"

namespace torch_shards::io::decode_plan {

using core::concat;

const char* const kNvcompInstallHint =
    "decode_on=\"device\" needs nvCOMP: pip install \"torch_shards[gpu]\" (or the wheel itself: pip install "
    "nvidia-libnvcomp-cu13 for CUDA 13, nvidia-libnvcomp-cu12 for CUDA 12), or set TORCH_SHARDS_NVCOMP_LIBRARY "
    "to a libnvcomp.so; decode_on=\"host\" decodes on the CPU without it";

namespace {

// Folders of the wheels, under a site-packages folder: nvidia-libnvcomp-cu13 / -cu12 first.
constexpr const char* kWheelFolders[] = {
    "nvidia/libnvcomp/lib64", "nvidia/libnvcomp/lib", "nvidia/nvcomp/lib64", "nvidia/nvcomp/lib",
    "nvidia/nvcomp",          "nvidia/cu13/lib",      "nvidia/cu12/lib",
};

// nvcompProperties_t.
struct Properties {
  uint32_t version = 0, cudart_version = 0;
};

// The soname's major version: 6 for libnvcomp.so.6 or libnvcomp.so.6.0.0, 0 for none.
int major_of(const std::string& name) {
  const size_t at = name.rfind(".so.");
  if (at == std::string::npos) return 0;
  return std::atoi(name.c_str() + at + 4);
}

bool resolve(void* handle, const char* format, bool with_options, NvcompDecompressor& out, std::string& missing) {
  const std::string async = concat("nvcompBatched", format, "DecompressAsync");
  const std::string temp =
      concat("nvcompBatched", format, with_options ? "DecompressGetTempSize" : "DecompressGetTempSizeEx");
  out.decompress_async = ::dlsym(handle, async.c_str());
  out.temp_size = ::dlsym(handle, temp.c_str());
  if (out.decompress_async == nullptr) missing = async;
  if (out.temp_size == nullptr) missing = temp;
  return out.decompress_async != nullptr && out.temp_size != nullptr;
}

}  // namespace

std::vector<std::string> nvcomp_candidates(const std::vector<std::string>& search_dirs) {
  namespace fs = std::filesystem;
  std::vector<std::string> candidates;
  if (const char* explicit_path = std::getenv("TORCH_SHARDS_NVCOMP_LIBRARY"); explicit_path && *explicit_path) {
    candidates.emplace_back(explicit_path);
  }
  for (const std::string& dir : search_dirs) {
    for (const char* folder : kWheelFolders) {
      std::error_code error;
      const fs::path path = fs::path(dir) / folder;
      if (!fs::is_directory(path, error)) continue;
      std::vector<std::string> found;
      for (const fs::directory_entry& entry : fs::directory_iterator(path, error)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind("libnvcomp.so", 0) == 0) found.push_back(entry.path().string());
      }
      // Newest major first; among one major, the shortest name (the soname link).
      std::sort(found.begin(), found.end(), [](const std::string& a, const std::string& b) {
        return major_of(a) != major_of(b) ? major_of(a) > major_of(b) : a.size() < b.size();
      });
      for (std::string& file : found) {
        if (std::find(candidates.begin(), candidates.end(), file) == candidates.end()) {
          candidates.push_back(std::move(file));
        }
      }
    }
  }
  for (const char* name : {"libnvcomp.so.6", "libnvcomp.so.5", "libnvcomp.so.4", "libnvcomp.so"}) {
    candidates.emplace_back(name);
  }
  return candidates;
}

NvcompLibrary load_nvcomp(const std::vector<std::string>& search_dirs) {
  std::string tried;
  for (const std::string& candidate : nvcomp_candidates(search_dirs)) {
    void* handle = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* error = ::dlerror();
      tried += concat(tried.empty() ? "" : "; ", error ? error : candidate.c_str());
      continue;
    }
    NvcompLibrary library;
    library.location = candidate;
    library.major = major_of(candidate);
    // The version the library reports (a constant: no GPU involved), else its soname's.
    if (const auto properties =
            reinterpret_cast<NvcompStatus (*)(Properties*)>(::dlsym(handle, "nvcompGetProperties"))) {
      Properties values;
      if (properties(&values) == 0 && values.version >= 1000) {
        library.version = values.version;
        library.major = static_cast<int>(values.version / 1000);
      }
    }
    std::string missing;
    // An unversioned file that does not say: the current API (options) first.
    const bool options = library.major == 0 || library.with_options();
    if (!resolve(handle, "LZ4", options, library.lz4, missing) ||
        !resolve(handle, "Zstd", options, library.zstd, missing) ||
        !resolve(handle, "Deflate", options, library.deflate, missing)) {
      tried += concat(tried.empty() ? "" : "; ", candidate, " has no ", missing);
      ::dlclose(handle);
      continue;
    }
    if (library.major == 0) library.major = 5;
    library.status_string = reinterpret_cast<const char* (*)(NvcompStatus)>(::dlsym(handle, "nvcompGetStatusString"));
    Dl_info where{};
    if (::dladdr(library.lz4.decompress_async, &where) != 0 && where.dli_fname != nullptr) {
      library.location = where.dli_fname;
    }
    return library;
  }
  throw NvcompNotFound(concat("nvCOMP (libnvcomp.so) was not found (tried: ", tried, "). ", kNvcompInstallHint));
}

}  // namespace torch_shards::io::decode_plan
