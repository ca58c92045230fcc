#include "io/storage/curl_library.h"

#include <dlfcn.h>
#include <sys/resource.h>

#include <mutex>

#include "core/errors.h"

namespace torch_shards::io::storage {

namespace {

// What the library needs: CURLOPT_AWS_SIGV4 came with 7.75.
constexpr unsigned kMinimumVersion = (7u << 16) | (75u << 8);
// The soft limit of open files tried where the hard one is "unlimited" and cannot be set as it is.
constexpr rlim_t kUnboundedOpenFiles = rlim_t{1} << 20;

template <typename Function>
void load(void* handle, const char* name, Function& out) {
  out = reinterpret_cast<Function>(::dlsym(handle, name));
  if (out == nullptr) {
    throw core::ReadError(
        core::concat("libcurl has no ", name, " (", ::dlerror(), "): reading URLs needs libcurl 7.75 or later"));
  }
}

// Connections are file descriptors: the 32 threads of a reader of URLs keep up to max_requests (64) each,
// more than the soft limit many systems start processes with (1024), and libcurl then says only "Couldn't
// connect to server". As Go's runtime does at start-up, the soft limit is raised to the hard one (the
// administrator's bound, kept), once, when URLs are first read. Nothing is said if it cannot be.
void raise_open_files_limit() {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  struct rlimit raised = limit;
  raised.rlim_cur = limit.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) return;
  // A hard limit of "unlimited", which the kernel's nr_open refuses as a soft one: a large finite one.
  if (limit.rlim_max != RLIM_INFINITY || limit.rlim_cur >= kUnboundedOpenFiles) return;
  raised.rlim_cur = kUnboundedOpenFiles;
  (void)::setrlimit(RLIMIT_NOFILE, &raised);
}

CurlLibrary load_library() {
  const char* names[] = {"libcurl.so.4", "libcurl-gnutls.so.4", "libcurl.so"};
  void* handle = nullptr;
  std::string errors, location;
  for (const char* name : names) {
    handle = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      location = name;
      break;
    }
    errors += core::concat(errors.empty() ? "" : "; ", ::dlerror());
  }
  if (handle == nullptr) {
    throw core::ReadError(core::concat(
        "reading URLs (s3://, http://, https://) needs the system's libcurl, which is not installed (", errors,
        "): install it (Debian/Ubuntu: apt-get install libcurl4; RHEL/Fedora: dnf install libcurl)"));
  }
  CurlLibrary library;
  load(handle, "curl_global_init", library.global_init);
  load(handle, "curl_easy_init", library.easy_init);
  load(handle, "curl_easy_cleanup", library.easy_cleanup);
  load(handle, "curl_easy_reset", library.easy_reset);
  load(handle, "curl_easy_setopt", library.easy_setopt);
  load(handle, "curl_easy_getinfo", library.easy_getinfo);
  load(handle, "curl_easy_strerror", library.easy_strerror);
  load(handle, "curl_slist_append", library.slist_append);
  load(handle, "curl_slist_free_all", library.slist_free_all);
  load(handle, "curl_multi_init", library.multi_init);
  load(handle, "curl_multi_cleanup", library.multi_cleanup);
  load(handle, "curl_multi_add_handle", library.multi_add_handle);
  load(handle, "curl_multi_remove_handle", library.multi_remove_handle);
  load(handle, "curl_multi_perform", library.multi_perform);
  load(handle, "curl_multi_poll", library.multi_poll);
  load(handle, "curl_multi_info_read", library.multi_info_read);
  load(handle, "curl_multi_setopt", library.multi_setopt);
  load(handle, "curl_version_info", library.version_info);
  const curl_version_info_data* info = library.version_info(CURLVERSION_NOW);
  if (info == nullptr || info->version_num < kMinimumVersion) {
    throw core::ReadError(core::concat("the system's libcurl is ", info ? info->version : "of an unknown version",
                                       ": reading URLs needs libcurl 7.75 or later (AWS Signature V4)"));
  }
  if (library.global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
    throw core::ReadError("libcurl failed to initialise (curl_global_init)");
  }
  raise_open_files_limit();
  Dl_info where{};
  if (::dladdr(reinterpret_cast<void*>(library.easy_init), &where) != 0 && where.dli_fname != nullptr) {
    location = where.dli_fname;
  }
  library.location = location;
  return library;
}

}  // namespace

const CurlLibrary& curl() {
  // Loaded once; a failure is remembered and raised again (the same message) at every use. Never destroyed:
  // a kept reader thread that ends while the process exits cleans its curl handles up through these
  // (http_client.cpp's thread_local Handles), maybe after static destruction began.
  static std::once_flag once;
  static CurlLibrary& library = *new CurlLibrary();
  static std::string& failure = *new std::string();
  std::call_once(once, [] {
    try {
      library = load_library();
    } catch (const std::exception& error) {
      failure = error.what();
    }
  });
  if (!failure.empty()) throw core::ReadError(failure);
  return library;
}

std::string curl_description() {
  try {
    const curl_version_info_data* info = curl().version_info(CURLVERSION_NOW);
    return core::concat("libcurl ", info->version, info->ssl_version ? core::concat(" (", info->ssl_version, ")") : "",
                        " at ", curl().location);
  } catch (const std::exception& error) {
    return error.what();
  }
}

}  // namespace torch_shards::io::storage
