// How URLs are read: the S3 settings, request limits and the node-local
// cache. Sources register the options they were given for their URL
// (set_storage_options); every read of a URL below it uses them. Unset
// fields come from the environment:
//   TORCH_SHARDS_CACHE_DIR      cache_dir (off when unset)
//   TORCH_SHARDS_CACHE_BYTES    cache_bytes (default 64 GiB)
//   TORCH_SHARDS_CACHE_WHOLE_BYTES  cache_whole_bytes (default 1 GiB)
//   TORCH_SHARDS_MAX_REQUESTS   max_requests (default 64)
// and the AWS variables and files (aws_credentials.h).
#pragma once

#include <cstdint>
#include <string>

#include "io/storage/aws_credentials.h"

namespace torch_shards::io::storage {

struct StorageOptions {
  AwsOptions aws;
  int max_requests = 0;     // 0: TORCH_SHARDS_MAX_REQUESTS or 64
  double timeout_s = 0;     // 0: 60 s per request attempt
  int retries = -1;         // -1: 6
  std::string cache_dir;    // "": TORCH_SHARDS_CACHE_DIR, or no cache
  int64_t cache_bytes = 0;  // 0: TORCH_SHARDS_CACHE_BYTES or 64 GiB
  // Objects of at most this many bytes (and at most cache_bytes / 4) are cached whole, as one mapped
  // entry, at their first ranged read; larger ones range by range. 0: never whole. -1:
  // TORCH_SHARDS_CACHE_WHOLE_BYTES or 1 GiB.
  int64_t cache_whole_bytes = -1;
  // A zarr store's consolidated metadata (zarr/consolidated.h) read in place of its nodes' own files.
  bool consolidated = true;

  // The options with every unset field taken from the environment or its
  // default; InvalidArgument naming a bad value (and the variable it came from).
  StorageOptions resolved() const;
  // Equal options read the same way (one client and cache for them).
  std::string identity() const;
  // The largest object cached whole (resolved options): cache_whole_bytes, at most cache_bytes / 4.
  int64_t whole_object_bound() const;
};

// Reads of URLs starting with `url` (a store, a file) use `options` from now
// on in this process (the longest registered prefix wins).
void set_storage_options(const std::string& url, const StorageOptions& options);
StorageOptions storage_options_for(const std::string& url);

}  // namespace torch_shards::io::storage
