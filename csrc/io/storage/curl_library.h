// libcurl, loaded when the first URL is read (dlopen of the system's
// libcurl.so.4) rather than linked: reading local files needs no libcurl,
// and the binary wheel carries no TLS stack of its own (the system's libcurl
// brings the system's certificates and crypto, kept up to date by it).
// Only curl's headers are needed to build.
#pragma once

#include <curl/curl.h>

#include <string>

namespace torch_shards::io::storage {

struct CurlLibrary {
  decltype(&curl_global_init) global_init;
  decltype(&curl_easy_init) easy_init;
  decltype(&curl_easy_cleanup) easy_cleanup;
  decltype(&curl_easy_reset) easy_reset;
  decltype(&curl_easy_setopt) easy_setopt;
  decltype(&curl_easy_getinfo) easy_getinfo;
  decltype(&curl_easy_strerror) easy_strerror;
  decltype(&curl_slist_append) slist_append;
  decltype(&curl_slist_free_all) slist_free_all;
  decltype(&curl_multi_init) multi_init;
  decltype(&curl_multi_cleanup) multi_cleanup;
  decltype(&curl_multi_add_handle) multi_add_handle;
  decltype(&curl_multi_remove_handle) multi_remove_handle;
  decltype(&curl_multi_perform) multi_perform;
  decltype(&curl_multi_poll) multi_poll;
  decltype(&curl_multi_info_read) multi_info_read;
  decltype(&curl_multi_setopt) multi_setopt;
  decltype(&curl_version_info) version_info;
  std::string location;  // the file loaded
};

// The loaded library, initialised once; throws ReadError saying what to
// install when there is no usable libcurl (4, 7.75 or later: AWS signing).
const CurlLibrary& curl();

// "libcurl 7.88.1 (OpenSSL/3.0.x)", or why it cannot be loaded; loads it.
std::string curl_description();

}  // namespace torch_shards::io::storage
