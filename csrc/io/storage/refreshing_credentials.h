// Credentials that expire (a credential_process's, with an Expiration),
// fetched again before they do, for the requests of a long job: SSO and vault
// credentials last an hour or so, a training run days. The refresh happens
// when a request asks for them after expiration - margin, the margin being
// five minutes or half of their lifetime when they were fetched, whichever is
// shorter; a source that keeps handing out credentials within their margin is
// run at most once a second. A refresh that fails while the old credentials are
// still valid keeps them (and tries again a second later); one that fails after
// they expired is the caller's error.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>

#include "io/storage/aws_credentials.h"

namespace torch_shards::io::storage {

// When credentials fetched at `now` that expire at `expiration` are due to be fetched again: five minutes
// or half their lifetime before, whichever is shorter, and not before now + 1.
int64_t refresh_due(int64_t expiration, int64_t now);

// Seconds since the epoch, by the system's clock.
int64_t seconds_now();

class RefreshingCredentials {
 public:
  // now: seconds since the epoch (the tests' clock; the system's by default).
  RefreshingCredentials(AwsCredentials first, std::function<AwsCredentials()> refresh,
                        std::function<int64_t()> now = nullptr);

  // The credentials to sign with now: fetched again when they are due.
  AwsCredentials current();
  // How many times they were fetched again.
  int64_t refreshes() const;

 private:
  void schedule(int64_t now);

  std::function<AwsCredentials()> refresh_;
  std::function<int64_t()> now_;
  mutable std::mutex mutex_;
  AwsCredentials credentials_;
  int64_t due_ = INT64_MAX;  // when to fetch again
  int64_t refreshes_ = 0;
};

}  // namespace torch_shards::io::storage
