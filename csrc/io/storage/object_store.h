// Objects behind URLs: one ObjectStore per bucket (s3://) or host (http(s)://)
// and options, with the requests each read needs (HEAD for an object's size
// and ETag, ranged GETs, whole GETs, S3 listings), the errors that name the
// URL, and the node-local cache. The readers above see Files (file.h) and
// never this; this sees bytes and never a format.
//
// Ranged reads of an object opened with a stamp (size + ETag) carry
// If-Match: an object replaced since it was opened fails the read (412)
// instead of mixing its versions, and cache entries are keyed by the ETag,
// so a replaced object's old bytes are never served for its new ETag.
//
// With a cache, an object of at most StorageOptions::whole_object_bound()
// bytes is fetched whole at its first ranged read (ranged GETs of
// kWholePartBytes, together, with If-Match) into one cache entry keyed by
// the URL requested (an s3:// URL's endpoint, bucket and key) + ETag + size
// (DiskCache::map_or_fill: one download per object per
// node at a time), and every range of it is then copied from a read-only
// mapping of that entry, verified once per process: this process keeps the
// last kMappedObjects mappings (per_process: a forked child keeps its own).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/storage/aws_credentials.h"
#include "io/storage/disk_cache.h"
#include "io/storage/http_client.h"
#include "io/storage/storage_options.h"
#include "io/storage/url.h"

namespace torch_shards::io::storage {

struct ObjectStamp {
  int64_t size = 0;
  std::string etag;  // as the server sent it ("" when it sent none)
};

struct RangeRead {
  int64_t offset = 0;
  int64_t size = 0;
  uint8_t* out = nullptr;
};

class ObjectStore {
 public:
  // A whole object is fetched in ranged GETs of this many bytes, all requested together (many
  // connections at once: a server answers each at a fraction of what it answers in all).
  static constexpr int64_t kWholePartBytes = int64_t{8} << 20;
  // Mappings of whole objects each process keeps (least recently used dropped).
  static constexpr size_t kMappedObjects = 64;
  // How long a read waits for another process (or thread) fetching the same whole object before it
  // reads its ranges itself.
  static constexpr double kWholeWaitSeconds = 300;
  // A listing's pages at most (1,000 keys each): a bound on requests, not a limit users meet.
  static constexpr int kMaxListingPages = 100000;

  // The store for `url` with the options registered for it (storage_options.h):
  // one per bucket/host and options in each process.
  static std::shared_ptr<const ObjectStore> of(const Url& url);
  // What tells stores apart: scheme, bucket or host, and the options registered for `url` (the
  // endpoint among them). The same URL under another key is another object.
  static std::string key_of(const Url& url);

  ObjectStore(const Url& url, const StorageOptions& options);

  // The object's size and ETag; nullopt when there is none (404).
  std::optional<ObjectStamp> head(const Url& url) const;
  // The same of many objects, asked for together; nullopt for each answer that is not a stamp (none
  // there, an error: head() asks again and names why).
  std::vector<std::optional<ObjectStamp>> heads(const std::vector<Url>& urls) const;
  // Whole objects (zarr metadata, unsharded chunks), fetched together;
  // nullopt for those that do not exist. etags (if given) receives each
  // object's ETag. Served from the cache when the server says the cached
  // copy is current (If-None-Match).
  std::vector<std::optional<std::vector<uint8_t>>> get(const std::vector<Url>& urls,
                                                       std::vector<std::string>* etags = nullptr) const;
  // Reads every range of the object stamped `stamp`, all requested
  // together, from the cache where it holds them. Ranges are coalesced into
  // one request across a gap of up to 64 KiB, or up to the bytes the request
  // reads for its ranges, never more than coalesce_gap (-1: 1 MiB). what()
  // names the bytes in messages.
  void read(const Url& url, const ObjectStamp& stamp, std::vector<RangeRead>& ranges,
            const std::function<std::string()>& what, int64_t coalesce_gap = -1) const;
  // The object's whole cache entry, mapped (fetched first when missing), or null (not cacheable whole,
  // the cache cannot store it, or another's fetch took too long).
  std::shared_ptr<const MappedEntry> whole(const Url& url, const ObjectStamp& stamp,
                                           const std::function<std::string()>& what) const;
  // The entries directly below `dir` (name, is a "directory"), sorted: S3
  // listings; over HTTP there are none to ask for (Unsupported).
  std::vector<std::pair<std::string, bool>> list(const Url& dir) const;
  // Every object below `dir` (S3; keys relative to it, in the listing's order, with the size and
  // ETag the listing gives, which a HEAD would), or nullopt when the listing has more than max_pages
  // pages (1,000 keys each). Unsupported over HTTP.
  struct Listed {
    std::string path;
    std::optional<ObjectStamp> stamp;  // none when the listing leaves out a size or an ETag
  };
  std::optional<std::vector<Listed>> list_all(const Url& dir, int max_pages) const;
  // Whether some object lies below `dir` (S3); false over HTTP.
  bool has_objects_below(const Url& dir) const;

  const StorageOptions& options() const { return options_; }
  const AwsSettings& aws() const { return aws_; }
  const DiskCache* cache() const { return cache_.get(); }

 private:
  std::string request_url(const Url& url) const;  // where requests for `url` go
  std::string bucket_url() const;                 // s3: the bucket's URL, for listings
  // Hands each page of the listing of `dir` (with delimiter '/' unless recursive) to `page`, at most
  // max_pages of them; false when more were left. Unsupported over HTTP.
  bool list_pages(const Url& dir, bool recursive, int max_pages,
                  const std::function<void(const std::string& xml)>& page) const;
  // Throws the error of a ranged GET's answer unless it holds the range asked for of the version stamped.
  void check_ranged(const Url& url, const ObjectStamp& stamp, const HttpRequest& request, const HttpResponse& response,
                    const std::function<std::string()>& what) const;
  [[noreturn]] void fail(const std::string& url, const HttpResponse& response, const std::string& what) const;

  std::string scheme_, host_;
  StorageOptions options_;
  AwsSettings aws_;
  std::unique_ptr<HttpClient> client_;
  std::unique_ptr<DiskCache> cache_;
};

}  // namespace torch_shards::io::storage
