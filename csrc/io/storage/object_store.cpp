#include "io/storage/object_store.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <mutex>

#include "core/errors.h"
#include "io/codecs.h"
#include "io/file.h"
#include "io/storage/refreshing_credentials.h"
#include "io/storage/xml_text.h"

namespace torch_shards::io::storage {

using core::concat;
using core::ReadError;

namespace {

// Ranges this close are read with one request (the gap is read and dropped), up to kCoalesceLimit: a
// request costs a round trip (and, on S3, a fee), a MB of gap may cost less (Rust's object_store coalesces
// at 1 MiB). But a gap costs bandwidth (and, across regions or clouds, egress fees): a gap of up to
// kCoalesceFreeGap is always taken (less than a request costs), a larger one only up to the bytes the
// group reads for its ranges (such gaps at most double what it fetches). Sparse reads of small chunks
// (blocks of 64 rows of an annbatch shard) fetched 14-17 times their bytes, and twice the memory, with
// 1 MiB gaps taken alone.
constexpr int64_t kCoalesceGap = int64_t{1} << 20;
constexpr int64_t kCoalesceFreeGap = int64_t{64} << 10;
constexpr int64_t kCoalesceLimit = int64_t{32} << 20;

// This process's stores, by bucket/host and options (per_process: a forked
// child starts its own).
struct Stores {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<const ObjectStore>> by_key;
};

// Cache entries are keyed by the URL the bytes are requested from (an s3:// URL's endpoint, bucket and
// key: the same s3:// URL on two S3-compatible servers is two objects, whatever their ETags), the
// object's ETag and size, and the range.
std::string cache_key(const std::string& source, const ObjectStamp& stamp, int64_t offset, int64_t size) {
  return concat(source, '\n', stamp.etag, '\n', stamp.size, '\n', offset, '+', size);
}

std::string whole_key(const std::string& source, const ObjectStamp& stamp) {
  return concat("object\n", source, '\n', stamp.etag, '\n', stamp.size);
}

// This process's mappings of whole objects (most recently used first) and the fetches under way
// (one per object: the others wait on its mutex). per_process: a forked child starts afresh (the
// parent's mappings stay mapped in it, read-only, never unmapped).
struct WholeObjects {
  std::mutex mutex;
  std::list<std::pair<std::string, std::shared_ptr<const MappedEntry>>> recent;
  std::map<std::string, std::shared_ptr<std::timed_mutex>> fetching;

  std::shared_ptr<const MappedEntry> find(const std::string& key) {  // under mutex
    for (auto it = recent.begin(); it != recent.end(); ++it) {
      if (it->first != key) continue;
      recent.splice(recent.begin(), recent, it);
      return it->second;
    }
    return nullptr;
  }
  void forget(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex);
    recent.remove_if([&](const auto& item) { return item.first == key; });
  }
};

// What tells stores apart (ObjectStore::key_of).
std::string store_key(const Url& url, const StorageOptions& options) {
  return concat(url.scheme, "://", url.host, '\n', options.identity());
}

}  // namespace

std::string ObjectStore::key_of(const Url& url) { return store_key(url, storage_options_for(url.text).resolved()); }

std::shared_ptr<const ObjectStore> ObjectStore::of(const Url& url) {
  const StorageOptions options = storage_options_for(url.text).resolved();
  const std::string key = store_key(url, options);
  Stores& table = per_process<Stores>();
  std::lock_guard<std::mutex> lock(table.mutex);
  std::shared_ptr<const ObjectStore>& store = table.by_key[key];
  if (!store) store = std::make_shared<const ObjectStore>(url, options);
  return store;
}

ObjectStore::ObjectStore(const Url& url, const StorageOptions& options)
    : scheme_(url.scheme), host_(url.host), options_(options) {
  SigningSource signing = [] { return Signing{}; };  // unsigned
  if (scheme_ == "s3") {
    aws_ = resolve_aws_settings(options_.aws);
    if (!aws_.anonymous) {
      const auto sign_with = [sigv4 = concat("aws:amz:", aws_.region, ":s3")](const AwsCredentials& credentials) {
        return Signing{sigv4, credentials.access_key_id + ":" + credentials.secret_access_key,
                       credentials.session_token};
      };
      if (aws_.credentials.expiration && aws_.refresh) {
        auto credentials = std::make_shared<RefreshingCredentials>(aws_.credentials, aws_.refresh);
        signing = [credentials, sign_with] { return sign_with(credentials->current()); };
      } else {
        signing = [fixed = sign_with(aws_.credentials)] { return fixed; };
      }
    }
  }
  ClientSettings settings;
  settings.max_requests = options_.max_requests;
  settings.timeout_s = options_.timeout_s;
  settings.retries = options_.retries;
  client_ = std::make_unique<HttpClient>(settings, std::move(signing));
  if (!options_.cache_dir.empty()) cache_ = std::make_unique<DiskCache>(options_.cache_dir, options_.cache_bytes);
}

std::string ObjectStore::bucket_url() const {
  if (!aws_.endpoint_url.empty()) return concat(aws_.endpoint_url, "/", host_);
  if (host_.find('.') != std::string::npos) return concat("https://s3.", aws_.region, ".amazonaws.com/", host_);
  return concat("https://", host_, ".s3.", aws_.region, ".amazonaws.com");
}

std::string ObjectStore::request_url(const Url& url) const {
  if (scheme_ != "s3") return url.text;
  return concat(bucket_url(), "/", percent_encode(url.path, true));
}

void ObjectStore::fail(const std::string& url, const HttpResponse& response, const std::string& what) const {
  const std::string detail = describe_error_body(response.body);
  const std::string because = detail.empty() ? "" : concat(" (", detail, ")");
  if (response.status == 0) {
    throw ReadError(concat(url, ": ", what, ": no answer after ", response.attempts, " attempt",
                           response.attempts == 1 ? "" : "s", ": ", response.error));
  }
  if (response.status == 401 || response.status == 403) {
    std::string credentials;
    if (scheme_ == "s3") {
      credentials = aws_.anonymous ? concat("; the request was unsigned: no credentials were found (", aws_.searched,
                                            "); set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile")
                                   : concat("; signed with the credentials from ", aws_.credentials.source);
    }
    throw ReadError(concat(url, ": ", what, ": access denied (HTTP ", response.status, ")", because, credentials));
  }
  if (response.status == 404) throw ReadError(concat(url, ": ", what, ": no such object (HTTP 404)", because));
  if (response.status == 412) {
    throw ReadError(concat(url,
                           ": the object changed since the dataset opened it (its ETag is no longer the one "
                           "stamped at open): rows read from it may mix its old and new contents, so they are not "
                           "delivered; open the dataset again once the object is written"));
  }
  if (response.status == 416) {
    throw ReadError(concat(url, ": ", what, ": the range lies beyond the object's end (HTTP 416; truncated?)"));
  }
  throw ReadError(concat(url, ": ", what, ": HTTP ", response.status, because,
                         response.attempts > 1 ? concat(" after ", response.attempts, " attempts") : ""));
}

std::optional<ObjectStamp> ObjectStore::head(const Url& url) const {
  HttpRequest request;
  request.url = request_url(url);
  request.head = true;
  const HttpResponse response = client_->perform(request);
  if (response.status == 404) return std::nullopt;
  if (response.status == 401 || response.status == 403) {
    // An answer to HEAD has no body: a one-byte GET asks again, for the server's reason (S3's error code:
    // SignatureDoesNotMatch, InvalidAccessKeyId, AccessDenied).
    HttpRequest again;
    again.url = request.url;
    again.offset = 0;
    again.size = 1;
    const HttpResponse reason = client_->perform(again);
    fail(url.text, reason.status == response.status ? reason : response, "cannot stat the object");
  }
  if (response.status < 200 || response.status >= 300) fail(url.text, response, "cannot stat the object");
  if (response.total_size < 0) throw ReadError(concat(url.text, ": the server sent no Content-Length for the object"));
  return ObjectStamp{response.total_size, response.etag};
}

std::vector<std::optional<ObjectStamp>> ObjectStore::heads(const std::vector<Url>& urls) const {
  std::vector<HttpRequest> requests(urls.size());
  for (size_t i = 0; i < urls.size(); ++i) {
    requests[i].url = request_url(urls[i]);
    requests[i].head = true;
  }
  std::vector<HttpResponse> responses;
  client_->perform(requests, responses);
  std::vector<std::optional<ObjectStamp>> out(urls.size());
  for (size_t i = 0; i < urls.size(); ++i) {
    const HttpResponse& response = responses[i];
    if (response.status >= 200 && response.status < 300 && response.total_size >= 0) {
      out[i] = ObjectStamp{response.total_size, response.etag};
    }
  }
  return out;
}

std::vector<std::optional<std::vector<uint8_t>>> ObjectStore::get(const std::vector<Url>& urls,
                                                                  std::vector<std::string>* etags) const {
  std::vector<HttpRequest> requests(urls.size());
  std::vector<std::optional<std::vector<uint8_t>>> cached(urls.size());
  std::vector<std::string> cached_etags(urls.size());
  for (size_t i = 0; i < urls.size(); ++i) {
    requests[i].url = request_url(urls[i]);
    if (!cache_) continue;
    // A cached object: its ETag's length (8 bytes), its ETag, its bytes.
    std::optional<std::vector<uint8_t>> entry = cache_->read("whole\n" + requests[i].url);
    if (!entry || entry->size() < 8) continue;
    uint64_t length = 0;
    std::memcpy(&length, entry->data(), 8);
    if (length == 0 || length > entry->size() - 8) continue;
    cached_etags[i].assign(reinterpret_cast<const char*>(entry->data()) + 8, length);
    entry->erase(entry->begin(), entry->begin() + 8 + static_cast<std::ptrdiff_t>(length));
    cached[i] = std::move(entry);
    requests[i].headers.push_back("If-None-Match: " + cached_etags[i]);
  }
  std::vector<HttpResponse> responses;
  client_->perform(requests, responses);
  std::vector<std::optional<std::vector<uint8_t>>> out(urls.size());
  if (etags != nullptr) etags->assign(urls.size(), "");
  for (size_t i = 0; i < urls.size(); ++i) {
    HttpResponse& response = responses[i];
    if (response.status == 404) continue;
    if (response.status == 304 && cached[i]) {
      out[i] = std::move(cached[i]);
      if (etags != nullptr) (*etags)[i] = cached_etags[i];
      continue;
    }
    if (response.status < 200 || response.status >= 300) fail(urls[i].text, response, "cannot read the object");
    if (response.total_size >= 0 && response.received != response.total_size) {
      throw ReadError(
          concat(urls[i].text, ": the answer ended after ", response.received, " of ", response.total_size, " bytes"));
    }
    if (cache_ && !response.etag.empty()) {
      std::vector<uint8_t> entry(8 + response.etag.size());
      const uint64_t length = response.etag.size();
      std::memcpy(entry.data(), &length, 8);
      std::memcpy(entry.data() + 8, response.etag.data(), response.etag.size());
      entry.insert(entry.end(), response.body.begin(), response.body.end());
      cache_->write("whole\n" + requests[i].url, entry.data(), entry.size());
    }
    if (etags != nullptr) (*etags)[i] = response.etag;
    out[i] = std::move(response.body);
  }
  return out;
}

void ObjectStore::check_ranged(const Url& url, const ObjectStamp& stamp, const HttpRequest& request,
                               const HttpResponse& response, const std::function<std::string()>& what) const {
  if (response.status != 206 && !(response.status == 200 && request.offset == 0 && response.received == request.size)) {
    if (response.status >= 200 && response.status < 300 && response.error.empty()) {
      throw ReadError(concat(url.text, ": ", what(), ": the server answered a range request with HTTP ",
                             response.status, " (it does not serve ranges)"));
    }
    fail(url.text, response, what());
  }
  if (!stamp.etag.empty() && !response.etag.empty() && response.etag != stamp.etag) {
    HttpResponse changed = response;
    changed.status = 412;
    fail(url.text, changed, what());
  }
  if (response.total_size >= 0 && response.total_size != stamp.size) {
    throw ReadError(concat(url.text, ": the object changed since the dataset opened it (size ", stamp.size, " -> ",
                           response.total_size, " bytes); open the dataset again once the object is written"));
  }
}

std::shared_ptr<const MappedEntry> ObjectStore::whole(const Url& url, const ObjectStamp& stamp,
                                                      const std::function<std::string()>& what) const {
  if (!cache_ || stamp.etag.empty() || stamp.size <= 0 || stamp.size > options_.whole_object_bound()) return nullptr;
  const std::string key = whole_key(request_url(url), stamp);
  const std::string mapped_key = cache_->dir() + '\n' + key;  // this process's mappings: of this cache
  WholeObjects& table = per_process<WholeObjects>();
  std::shared_ptr<std::timed_mutex> fetching;
  {
    std::lock_guard<std::mutex> lock(table.mutex);
    if (std::shared_ptr<const MappedEntry> entry = table.find(mapped_key)) return entry;
    std::shared_ptr<std::timed_mutex>& slot = table.fetching[mapped_key];
    if (!slot) slot = std::make_shared<std::timed_mutex>();
    fetching = slot;
  }
  // One fetch per object in this process; the others wait for it, then find its mapping.
  std::unique_lock<std::timed_mutex> mine(*fetching, std::defer_lock);
  const bool held = mine.try_lock_for(std::chrono::duration<double>(kWholeWaitSeconds));
  const auto done = [&] {
    std::lock_guard<std::mutex> lock(table.mutex);
    auto it = table.fetching.find(mapped_key);
    if (it != table.fetching.end() && it->second.use_count() <= 2) table.fetching.erase(it);  // the table's and ours
  };
  if (!held) {
    done();
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(table.mutex);
    if (std::shared_ptr<const MappedEntry> entry = table.find(mapped_key)) {
      mine.unlock();
      done();
      return entry;
    }
  }
  const std::string target = request_url(url);
  const auto fill = [&](int fd, int64_t at) -> std::optional<uint32_t> {
    std::vector<HttpRequest> requests;
    // Each part's CRC-32C, taken as its bytes arrive (a retried part starts again from 0).
    std::vector<uint32_t> crcs(static_cast<size_t>((stamp.size + kWholePartBytes - 1) / kWholePartBytes));
    for (int64_t offset = 0; offset < stamp.size; offset += kWholePartBytes) {
      HttpRequest& request = requests.emplace_back();
      request.url = target;
      request.offset = offset;
      request.size = std::min(kWholePartBytes, stamp.size - offset);
      uint32_t& crc = crcs[requests.size() - 1];
      request.sink = [fd, start = at + offset, &crc](int64_t position, const uint8_t* data, size_t size) {
        crc = codecs::crc32c_extend(position == 0 ? 0 : crc, data, size);
        return write_all_at(fd, data, size, start + position);
      };
      request.headers.push_back("If-Match: " + stamp.etag);
    }
    std::vector<HttpResponse> responses;
    client_->perform(requests, responses);
    for (size_t i = 0; i < requests.size(); ++i) check_ranged(url, stamp, requests[i], responses[i], what);
    uint32_t whole = crcs[0];
    for (size_t i = 1; i < requests.size(); ++i) {
      whole = codecs::crc32c_combine(whole, crcs[i], static_cast<uint64_t>(requests[i].size));
    }
    return whole;
  };
  std::shared_ptr<const MappedEntry> entry;
  try {
    entry = cache_->map_or_fill(key, static_cast<size_t>(stamp.size), fill, kWholeWaitSeconds);
  } catch (...) {
    mine.unlock();
    done();
    throw;
  }
  if (entry) {
    std::lock_guard<std::mutex> lock(table.mutex);
    table.recent.emplace_front(mapped_key, entry);
    if (table.recent.size() > kMappedObjects) table.recent.pop_back();
  }
  mine.unlock();
  done();
  return entry;
}

void ObjectStore::read(const Url& url, const ObjectStamp& stamp, std::vector<RangeRead>& ranges,
                       const std::function<std::string()>& what, int64_t coalesce_gap) const {
  if (coalesce_gap < 0) coalesce_gap = kCoalesceGap;
  for (const RangeRead& range : ranges) {
    if (range.size > 0 && (range.offset < 0 || range.offset + range.size > stamp.size)) {
      throw ReadError(concat(url.text, ": ", what(), ": bytes [", range.offset, ", ", range.offset + range.size,
                             ") lie beyond the object's ", stamp.size, " bytes (truncated?)"));
    }
  }
  if (std::shared_ptr<const MappedEntry> entry = whole(url, stamp, what)) {
    const bool copied = run_guarded([&] {
      for (const RangeRead& range : ranges) {
        if (range.size > 0) std::memcpy(range.out, entry->data() + range.offset, static_cast<size_t>(range.size));
      }
    });
    if (copied) return;
    // The entry's file was cut short behind the cache's back: forget the mapping, read the ranges.
    per_process<WholeObjects>().forget(cache_->dir() + '\n' + whole_key(request_url(url), stamp));
  }
  const std::string source = cache_ ? request_url(url) : std::string();  // what cache entries are keyed by
  // What the cache lacks, by offset.
  std::vector<const RangeRead*> missing;
  for (const RangeRead& range : ranges) {
    if (range.size <= 0) continue;
    if (cache_ && !stamp.etag.empty() &&
        cache_->read(cache_key(source, stamp, range.offset, range.size), range.out, static_cast<size_t>(range.size))) {
      continue;
    }
    missing.push_back(&range);
  }
  if (missing.empty()) return;
  std::sort(missing.begin(), missing.end(),
            [](const RangeRead* a, const RangeRead* b) { return a->offset < b->offset; });
  // Requests: each covers one or more ranges [first, last] of `missing`.
  struct Group {
    size_t first, last;
    int64_t offset, end;
    int64_t wanted;               // the bytes of its ranges (overlaps counted twice)
    std::vector<uint8_t> buffer;  // when it covers more than one range
  };
  std::vector<Group> groups;
  for (size_t i = 0; i < missing.size(); ++i) {
    const RangeRead& range = *missing[i];
    if (!groups.empty()) {
      Group& group = groups.back();
      const int64_t end = std::max(group.end, range.offset + range.size);
      const int64_t gap = std::min(coalesce_gap, std::max(kCoalesceFreeGap, group.wanted + range.size));
      if (range.offset <= group.end + gap && end - group.offset <= kCoalesceLimit) {
        group.last = i;
        group.end = end;
        group.wanted += range.size;
        continue;
      }
    }
    groups.push_back(Group{i, i, range.offset, range.offset + range.size, range.size, {}});
  }
  const std::string target = request_url(url);
  std::vector<HttpRequest> requests(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    Group& group = groups[g];
    HttpRequest& request = requests[g];
    request.url = target;
    request.offset = group.offset;
    request.size = group.end - group.offset;
    if (group.first == group.last) {
      request.out = missing[group.first]->out;
    } else {
      group.buffer.resize(static_cast<size_t>(request.size));
      request.out = group.buffer.data();
    }
    if (!stamp.etag.empty()) request.headers.push_back("If-Match: " + stamp.etag);
  }
  std::vector<HttpResponse> responses;
  client_->perform(requests, responses);
  for (size_t g = 0; g < groups.size(); ++g) {
    check_ranged(url, stamp, requests[g], responses[g], what);
    const Group& group = groups[g];
    for (size_t i = group.first; i <= group.last; ++i) {
      const RangeRead& range = *missing[i];
      if (group.first != group.last) {
        std::memcpy(range.out, group.buffer.data() + (range.offset - group.offset), static_cast<size_t>(range.size));
      }
      if (cache_ && !stamp.etag.empty()) {
        cache_->write(cache_key(source, stamp, range.offset, range.size), range.out, static_cast<size_t>(range.size));
      }
    }
  }
}

namespace {

// The key prefix of the objects below `dir` in a listing of its bucket.
std::string listing_prefix(const Url& dir) { return dir.path.empty() ? "" : dir.path + "/"; }

// The keys of a listing page below `prefix`, relative to it.
std::vector<std::string> keys_below(const std::string& xml, const std::string& prefix) {
  std::vector<std::string> keys;
  for (const std::string& key : xml_values(xml, "Key")) {
    if (key.size() > prefix.size() && key.compare(0, prefix.size(), prefix) == 0)
      keys.push_back(key.substr(prefix.size()));
  }
  return keys;
}

}  // namespace

bool ObjectStore::list_pages(const Url& dir, bool recursive, int max_pages,
                             const std::function<void(const std::string& xml)>& page) const {
  if (scheme_ != "s3") {
    throw core::Unsupported(concat(dir.text,
                                   ": listing is not possible over HTTP (no directory listings): open a "
                                   "store with consolidated metadata, or the objects by their URLs"));
  }
  const std::string prefix = listing_prefix(dir);
  std::string token;
  for (int pages = 0; pages < max_pages; ++pages) {
    // Query parameters in the order SigV4 signs them (sorted by name).
    std::string query = token.empty() ? "" : "continuation-token=" + percent_encode(token, false) + "&";
    query += std::string(recursive ? "" : "delimiter=%2F&") + "list-type=2&prefix=" + percent_encode(prefix, false);
    HttpRequest request;
    request.url = concat(bucket_url(), "/?", query);
    const HttpResponse response = client_->perform(request);
    if (response.status < 200 || response.status >= 300) fail(dir.text, response, "cannot list the objects below it");
    const std::string xml(response.body.begin(), response.body.end());
    page(xml);
    const std::vector<std::string> truncated = xml_values(xml, "IsTruncated");
    const std::vector<std::string> next = xml_values(xml, "NextContinuationToken");
    if (truncated.empty() || truncated[0] != "true" || next.empty()) return true;
    token = next[0];
  }
  return false;
}

std::vector<std::pair<std::string, bool>> ObjectStore::list(const Url& dir) const {
  const std::string prefix = listing_prefix(dir);
  std::vector<std::pair<std::string, bool>> entries;
  list_pages(dir, false, kMaxListingPages, [&](const std::string& xml) {
    for (std::string& key : keys_below(xml, prefix)) entries.emplace_back(std::move(key), false);
    for (const std::string& below : xml_values(xml, "Prefix")) {
      if (below.size() > prefix.size() + 1 && below.compare(0, prefix.size(), prefix) == 0 && below.back() == '/') {
        entries.emplace_back(below.substr(prefix.size(), below.size() - prefix.size() - 1), true);
      }
    }
  });
  std::sort(entries.begin(), entries.end());
  entries.erase(std::unique(entries.begin(), entries.end()), entries.end());
  return entries;
}

std::optional<std::vector<ObjectStore::Listed>> ObjectStore::list_all(const Url& dir, int max_pages) const {
  const std::string prefix = listing_prefix(dir);
  std::vector<Listed> objects;
  const bool complete = list_pages(dir, true, max_pages, [&](const std::string& xml) {
    // Each <Contents> as written (its values decoded once, by xml_values).
    const std::string open = "<Contents>", close = "</Contents>";
    for (size_t at = xml.find(open); at != std::string::npos; at = xml.find(open, at)) {
      const size_t end = xml.find(close, at);
      if (end == std::string::npos) break;
      const std::string contents = xml.substr(at + open.size(), end - at - open.size());
      at = end + close.size();
      const std::vector<std::string> keys = xml_values(contents, "Key");
      if (keys.size() != 1 || keys[0].size() <= prefix.size() || keys[0].compare(0, prefix.size(), prefix) != 0) {
        continue;
      }
      Listed listed{keys[0].substr(prefix.size()), std::nullopt};
      const std::vector<std::string> etags = xml_values(contents, "ETag"), sizes = xml_values(contents, "Size");
      if (etags.size() == 1 && !etags[0].empty() && sizes.size() == 1) {
        char* last = nullptr;
        const long long size = std::strtoll(sizes[0].c_str(), &last, 10);
        if (last != sizes[0].c_str() && *last == '\0' && size >= 0) listed.stamp = ObjectStamp{size, etags[0]};
      }
      objects.push_back(std::move(listed));
    }
  });
  if (!complete) return std::nullopt;
  return objects;
}

bool ObjectStore::has_objects_below(const Url& dir) const {
  if (scheme_ != "s3") return false;
  const std::string prefix = listing_prefix(dir);
  HttpRequest request;
  request.url = concat(bucket_url(), "/?list-type=2&max-keys=1&prefix=", percent_encode(prefix, false));
  const HttpResponse response = client_->perform(request);
  if (response.status == 404) return false;  // no such bucket
  if (response.status < 200 || response.status >= 300) fail(dir.text, response, "cannot list the objects below it");
  const std::string xml(response.body.begin(), response.body.end());
  return !xml_values(xml, "Key").empty();
}

}  // namespace torch_shards::io::storage
