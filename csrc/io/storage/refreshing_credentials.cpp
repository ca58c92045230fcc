#include "io/storage/refreshing_credentials.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <utility>

namespace torch_shards::io::storage {

namespace {

constexpr int64_t kMarginSeconds = 300;

}  // namespace

int64_t seconds_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int64_t refresh_due(int64_t expiration, int64_t now) {
  return std::max(expiration - std::min(kMarginSeconds, (expiration - now) / 2), now + 1);
}

RefreshingCredentials::RefreshingCredentials(AwsCredentials first, std::function<AwsCredentials()> refresh,
                                             std::function<int64_t()> now)
    : refresh_(std::move(refresh)), now_(now ? std::move(now) : seconds_now), credentials_(std::move(first)) {
  schedule(now_());
}

void RefreshingCredentials::schedule(int64_t now) {
  if (!credentials_.expiration || !refresh_) {
    due_ = INT64_MAX;
    return;
  }
  due_ = refresh_due(*credentials_.expiration, now);
}

AwsCredentials RefreshingCredentials::current() {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t now = now_();
  if (now >= due_) {
    try {
      credentials_ = refresh_();
      ++refreshes_;
      schedule(now);
    } catch (const std::exception&) {
      if (!credentials_.expiration || now >= *credentials_.expiration) throw;
      due_ = now + 1;  // the old ones still hold: try again later
    }
  }
  return credentials_;
}

int64_t RefreshingCredentials::refreshes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return refreshes_;
}

}  // namespace torch_shards::io::storage
