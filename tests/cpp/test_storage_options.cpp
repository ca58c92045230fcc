// URLs as the sources take them, and the storage options registered per URL.
#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "io/storage/storage_options.h"
#include "io/storage/url.h"

namespace torch_shards::io::storage {
namespace {

TEST(Url, PartsOfEachScheme) {
  const Url s3 = parse_url("s3://bucket/a/b.zarr/");
  EXPECT_EQ(s3.scheme, "s3");
  EXPECT_EQ(s3.host, "bucket");
  EXPECT_EQ(s3.path, "a/b.zarr");
  EXPECT_EQ(s3.text, "s3://bucket/a/b.zarr");
  const Url http = parse_url("http://127.0.0.1:8080/data/x.h5ad");
  EXPECT_EQ(http.host, "127.0.0.1:8080");
  EXPECT_EQ(http.path, "data/x.h5ad");
  EXPECT_EQ(parse_url("s3://bucket").path, "");
  EXPECT_TRUE(is_url("https://h/x"));
  EXPECT_FALSE(is_url("/data/s3://x"));
  EXPECT_FALSE(is_url("relative/path"));
}

TEST(Url, AmbiguousUrlsAreRefusedNamingThem) {
  for (const char* bad : {"s3:///key", "http://", "s3://b/a/../c", "s3://b/a//c", "https://h/x?versionId=1",
                          "https://h/x#part", "ftp://h/x"}) {
    try {
      parse_url(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find(bad), std::string::npos) << error.what();
    }
  }
}

TEST(Url, PercentEncodingKeepsUnreservedBytes) {
  EXPECT_EQ(percent_encode("a b/c+d~e_f.g-h", true), "a%20b/c%2Bd~e_f.g-h");
  EXPECT_EQ(percent_encode("a/b", false), "a%2Fb");
  EXPECT_EQ(percent_encode("\xc3\xa9", true), "%C3%A9");
}

TEST(StorageOptions, TheLongestRegisteredUrlWins) {
  StorageOptions bucket, store;
  bucket.max_requests = 3;
  store.max_requests = 7;
  set_storage_options("s3://options-test-bucket", bucket);
  set_storage_options("s3://options-test-bucket/store.zarr", store);
  EXPECT_EQ(storage_options_for("s3://options-test-bucket/other.zarr/0").max_requests, 3);
  EXPECT_EQ(storage_options_for("s3://options-test-bucket/store.zarr/c/0").max_requests, 7);
  EXPECT_EQ(storage_options_for("s3://options-test-bucket/store.zarr2/c/0").max_requests, 3);  // not below it
  EXPECT_EQ(storage_options_for("s3://unregistered-bucket/x").max_requests, 0);
}

TEST(StorageOptions, UnsetFieldsComeFromTheEnvironment) {
  ::setenv("TORCH_SHARDS_MAX_REQUESTS", "12", 1);
  ::setenv("TORCH_SHARDS_CACHE_DIR", "/tmp/some-cache", 1);
  const StorageOptions resolved = StorageOptions{}.resolved();
  EXPECT_EQ(resolved.max_requests, 12);
  EXPECT_EQ(resolved.cache_dir, "/tmp/some-cache");
  EXPECT_EQ(resolved.retries, 6);
  EXPECT_GT(resolved.cache_bytes, 0);
  ::setenv("TORCH_SHARDS_MAX_REQUESTS", "many", 1);
  EXPECT_THROW(StorageOptions{}.resolved(), std::invalid_argument);
  ::unsetenv("TORCH_SHARDS_MAX_REQUESTS");
  ::unsetenv("TORCH_SHARDS_CACHE_DIR");
}

TEST(StorageOptions, WholeObjectBound) {
  StorageOptions options;
  EXPECT_EQ(options.resolved().cache_whole_bytes, int64_t{1} << 30);  // the default
  options.cache_bytes = int64_t{1} << 30;
  EXPECT_EQ(options.resolved().whole_object_bound(), int64_t{1} << 28);  // at most a quarter of the cache
  options.cache_whole_bytes = 1000;
  EXPECT_EQ(options.resolved().whole_object_bound(), 1000);
  options.cache_whole_bytes = 0;
  EXPECT_EQ(options.resolved().whole_object_bound(), 0);  // off
  options.cache_whole_bytes = -1;
  ::setenv("TORCH_SHARDS_CACHE_WHOLE_BYTES", "4096", 1);
  EXPECT_EQ(options.resolved().cache_whole_bytes, 4096);
  ::setenv("TORCH_SHARDS_CACHE_WHOLE_BYTES", "-5", 1);
  EXPECT_THROW(options.resolved(), std::invalid_argument);
  ::unsetenv("TORCH_SHARDS_CACHE_WHOLE_BYTES");
}

TEST(StorageOptions, BadValuesAreRefusedWhereGiven) {
  StorageOptions options;
  options.max_requests = 5000;
  EXPECT_THROW(set_storage_options("s3://b/x", options), std::invalid_argument);
  options = {};
  options.retries = 1000;
  EXPECT_THROW(set_storage_options("s3://b/x", options), std::invalid_argument);
  options = {};
  options.aws.region = "us-east-1";  // S3 settings for an HTTP URL
  EXPECT_THROW(set_storage_options("https://host/x", options), std::invalid_argument);
  EXPECT_THROW(set_storage_options("not a url", StorageOptions{}), std::invalid_argument);
}

}  // namespace
}  // namespace torch_shards::io::storage
