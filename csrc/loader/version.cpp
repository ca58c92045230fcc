#include <torch_shards/version.h>

#include <torch/version.h>

#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "io/library_versions.h"
#include "io/storage/curl_library.h"

namespace torch_shards {
namespace {

nlohmann::json cpu_description() {
  nlohmann::json features = nlohmann::json::array();
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("sse2")) features.push_back("sse2");
  if (__builtin_cpu_supports("ssse3")) features.push_back("ssse3");
  if (__builtin_cpu_supports("sse4.2")) features.push_back("sse4.2");
  if (__builtin_cpu_supports("avx")) features.push_back("avx");
  if (__builtin_cpu_supports("avx2")) features.push_back("avx2");
  if (__builtin_cpu_supports("bmi2")) features.push_back("bmi2");
  if (__builtin_cpu_supports("avx512f")) features.push_back("avx512f");
  if (__builtin_cpu_supports("avx512bw")) features.push_back("avx512bw");
  return {{"architecture", "x86_64"}, {"features", features}};
#elif defined(__aarch64__)
  return {{"architecture", "aarch64"}, {"features", features}};
#else
  return {{"architecture", "unknown"}, {"features", features}};
#endif
}

}  // namespace

const char* version() { return TORCH_SHARDS_VERSION; }

std::string build_info() {
  nlohmann::json libraries = nlohmann::json::array();
  for (const io::LibraryVersion& library : io::library_versions()) {
    libraries.push_back({{"name", library.name},
                         {"version", library.version},
                         {"location", library.location},
                         {"detail", library.detail}});
  }
#if defined(TORCH_SHARDS_BUNDLED_DEPENDENCIES)
  const bool bundled = true;
#else
  const bool bundled = false;
#endif
#if defined(__clang__)
  const std::string compiler = core::concat("clang ", __clang_version__);
#elif defined(__GNUC__)
  const std::string compiler = core::concat("gcc ", __VERSION__);
#else
  const std::string compiler = "unknown";
#endif
  const nlohmann::json info = {
      {"version", TORCH_SHARDS_VERSION},
      {"torch", core::concat(TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, ".", TORCH_VERSION_PATCH)},
      {"bundled_dependencies", bundled},
      {"libraries", libraries},
      // URLs are read through the system's libcurl, loaded when first needed (io/storage/curl_library.h).
      {"url_reader", io::storage::curl_description()},
      {"compiler", compiler},
      {"cpu", cpu_description()},
  };
  return info.dump();
}

}  // namespace torch_shards
