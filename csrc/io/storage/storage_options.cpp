#include "io/storage/storage_options.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

#include "core/errors.h"
#include "io/storage/url.h"

namespace torch_shards::io::storage {

using core::concat;

namespace {

constexpr int kDefaultMaxRequests = 64;
constexpr double kDefaultTimeout = 60;
constexpr int kDefaultRetries = 6;
constexpr int64_t kDefaultCacheBytes = int64_t{64} << 30;
constexpr int64_t kDefaultCacheWholeBytes = int64_t{1} << 30;

std::mutex registry_mutex;
std::map<std::string, StorageOptions>& registry() {
  static auto* options = new std::map<std::string, StorageOptions>();  // never destroyed: read at exit
  return *options;
}

int64_t integer_from_environment(const char* name, int64_t minimum) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  core::check_argument(*end == '\0' && value >= minimum, name, "=", text, ": expected an integer >= ", minimum);
  return value;
}

}  // namespace

StorageOptions StorageOptions::resolved() const {
  StorageOptions out = *this;
  if (out.max_requests == 0)
    out.max_requests = static_cast<int>(integer_from_environment("TORCH_SHARDS_MAX_REQUESTS", 1));
  if (out.max_requests == 0) out.max_requests = kDefaultMaxRequests;
  core::check_argument(out.max_requests >= 1 && out.max_requests <= 1024, "max_requests must be in [1, 1024], got ",
                       out.max_requests);
  if (out.timeout_s == 0) out.timeout_s = kDefaultTimeout;
  core::check_argument(out.timeout_s > 0, "timeout must be positive (seconds), got ", out.timeout_s);
  if (out.retries < 0) out.retries = kDefaultRetries;
  core::check_argument(out.retries <= 100, "retries must be in [0, 100], got ", out.retries);
  if (out.cache_dir.empty()) {
    const char* dir = std::getenv("TORCH_SHARDS_CACHE_DIR");
    if (dir != nullptr) out.cache_dir = dir;
  }
  if (out.cache_bytes == 0) out.cache_bytes = integer_from_environment("TORCH_SHARDS_CACHE_BYTES", 1);
  if (out.cache_bytes == 0) out.cache_bytes = kDefaultCacheBytes;
  core::check_argument(out.cache_bytes > 0, "cache_bytes must be positive, got ", out.cache_bytes);
  if (out.cache_whole_bytes < 0) {
    const char* text = std::getenv("TORCH_SHARDS_CACHE_WHOLE_BYTES");
    out.cache_whole_bytes = text != nullptr && *text != '\0'
                                ? integer_from_environment("TORCH_SHARDS_CACHE_WHOLE_BYTES", 0)
                                : kDefaultCacheWholeBytes;
  }
  return out;
}

std::string StorageOptions::identity() const {
  return concat(aws.profile, '\n', aws.region, '\n', aws.endpoint_url, '\n',
                aws.anonymous ? (*aws.anonymous ? "1" : "0") : "-", '\n', max_requests, '\n', timeout_s, '\n', retries,
                '\n', cache_dir, '\n', cache_bytes, '\n', cache_whole_bytes);
}

int64_t StorageOptions::whole_object_bound() const { return std::min(cache_whole_bytes, cache_bytes / 4); }

void set_storage_options(const std::string& url, const StorageOptions& options) {
  (void)options.resolved();  // a bad value is refused where it is given
  if (parse_url(url).scheme == "s3") {
    (void)resolve_aws_settings(options.aws);
  } else {
    core::check_argument(options.aws.endpoint_url.empty() && options.aws.region.empty() &&
                             options.aws.profile.empty() && !options.aws.anonymous,
                         url, ": endpoint_url, region, profile and anonymous apply to s3:// URLs only");
  }
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry()[url] = options;
}

StorageOptions storage_options_for(const std::string& url) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  const StorageOptions* best = nullptr;
  size_t best_length = 0;
  for (const auto& [prefix, options] : registry()) {
    const bool below = url.compare(0, prefix.size(), prefix) == 0 &&
                       (url.size() == prefix.size() || url[prefix.size()] == '/' || prefix.back() == '/');
    if (below && (best == nullptr || prefix.size() >= best_length)) {
      best = &options;
      best_length = prefix.size();
    }
  }
  return best != nullptr ? *best : StorageOptions{};
}

}  // namespace torch_shards::io::storage
