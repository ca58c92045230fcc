#include "io/storage/remote_paths.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <set>

#include "core/errors.h"
#include "io/file.h"

namespace torch_shards::io::storage {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kKeep = std::chrono::seconds(10);  // how long stats and small objects are reused
constexpr size_t kSmallObject = 1 << 20;
// A store listed at once as it opens: at most this many pages of 1,000 keys (an annbatch collection of
// ~130 sharded datasets); a larger one is opened asking for each thing as before.
constexpr int kMaxListedPages = 4;

// s3: every object below a directory, from one complete listing (paths relative to it).
struct Listing {
  std::set<std::string> objects;
  std::set<std::string> directories;  // every directory below it that holds objects ("a", "a/b")
};

// A store's consolidated metadata (zarr v3's consolidated_metadata, v2's .zmetadata): the metadata
// files of every node below it, by path relative to it, and those nodes' directories (and theirs).
struct Consolidated {
  std::map<std::string, std::vector<uint8_t>> files;
  std::set<std::string> directories;
};

template <typename T>
struct Known {
  Clock::time_point when;
  uint64_t opening;  // the opening current when it was learnt
  T value;
};

// This process's recent stats and small objects (per_process: a forked
// child starts its own), by recent_key: the same s3:// URL behind another
// endpoint (or other options) is another object.
struct Recent {
  std::mutex mutex;
  uint64_t opening = 1;  // bumped as an opening begins (OpeningScope)
  int64_t scopes = 0;    // OpeningScopes alive
  std::map<std::string, Known<std::optional<ObjectStamp>>> stats;
  std::map<std::string, Known<std::optional<std::vector<uint8_t>>>> objects;
  std::map<std::string, Known<bool>> below;                             // s3: whether objects lie below a prefix
  std::map<std::string, Known<std::shared_ptr<const Listing>>> listed;  // s3: directories listed whole
  std::map<std::string, Known<std::shared_ptr<const Consolidated>>> consolidated;  // stores' roots

  // What `map` knows of `key` that may be used now, or null. While a dataset opens: only what this
  // opening learnt (an object rewritten since an earlier opening is seen as it is now). Otherwise (a
  // reader opening shards, checking a store's metadata): what was learnt in the last kKeep.
  template <typename T>
  const T* fresh(const std::map<std::string, Known<T>>& map, const std::string& key) const {
    const auto it = map.find(key);
    if (it == map.end()) return nullptr;
    const bool usable = scopes > 0 ? it->second.opening == opening : Clock::now() - it->second.when <= kKeep;
    return usable ? &it->second.value : nullptr;
  }
  template <typename T>
  void learn(std::map<std::string, Known<T>>& map, const std::string& key, T value) {
    map[key] = Known<T>{Clock::now(), opening, std::move(value)};
  }
};

Recent& recent() { return per_process<Recent>(); }

std::string recent_key(const Url& url) { return ObjectStore::key_of(url) + '\n' + url.text; }

// A fresh listing of a directory above `url` (of the same store), and url's path relative to it; null
// when none covers it. With the table locked.
std::pair<const Listing*, std::string> covering_listing(const Recent& table, const Url& url) {
  if (table.scopes == 0) return {nullptr, ""};  // listings answer within openings only
  const std::string key = recent_key(url);
  for (const auto& [dir_key, known] : table.listed) {
    if (key.size() > dir_key.size() + 1 && key.compare(0, dir_key.size(), dir_key) == 0 && key[dir_key.size()] == '/') {
      if (const auto* listing = table.fresh(table.listed, dir_key))
        return {listing->get(), key.substr(dir_key.size() + 1)};
    }
  }
  return {nullptr, ""};
}

// Whether `path`'s last part names zarr metadata, which opening a store reads.
bool is_zarr_metadata(const std::string& path) {
  const std::string name = path.substr(path.rfind('/') + 1);
  return name == "zarr.json" || name == ".zarray" || name == ".zgroup" || name == ".zattrs" || name == ".zmetadata";
}

// The consolidated metadata of a store at or above `url` that may be used now (as stats: learnt in this
// opening, or outside openings in the last seconds), and url's path relative to its root ("" for the
// root itself); null when none covers it. With the table locked.
std::pair<const Consolidated*, std::string> covering_consolidated(const Recent& table, const Url& url) {
  if (table.consolidated.empty()) return {nullptr, ""};
  const std::string key = recent_key(url);
  for (const auto& [root_key, known] : table.consolidated) {
    const bool root = key == root_key;
    if (root || (key.size() > root_key.size() + 1 && key.compare(0, root_key.size(), root_key) == 0 &&
                 key[root_key.size()] == '/')) {
      if (const auto* consolidated = table.fresh(table.consolidated, root_key))
        return {consolidated->get(), root ? "" : key.substr(root_key.size() + 1)};
    }
  }
  return {nullptr, ""};
}

// A metadata file below a consolidated store's root, which its consolidated metadata answers for (the
// root's own zarr.json and .zmetadata hold it: they are read).
bool consolidated_answers(const std::string& path) {
  return is_zarr_metadata(path) && path != "zarr.json" && path != ".zmetadata";
}

// What the server's listing of `path` with delimiter '/' would hold, of a store whose `objects` and
// `directories` are known: the entries directly below it (directories flagged), sorted.
std::vector<std::pair<std::string, bool>> entries_below(const std::set<std::string>& objects,
                                                        const std::set<std::string>& directories,
                                                        const std::string& path) {
  const std::string prefix = path.empty() ? "" : path + "/";
  std::vector<std::pair<std::string, bool>> entries;
  for (const auto* names : {&objects, &directories}) {
    for (auto it = names->lower_bound(prefix); it != names->end() && it->compare(0, prefix.size(), prefix) == 0; ++it) {
      const std::string name = it->substr(prefix.size());
      if (!name.empty() && name.find('/') == std::string::npos) entries.emplace_back(name, names != &objects);
    }
  }
  std::sort(entries.begin(), entries.end());
  return entries;
}

// What a consolidated store's metadata says `url` is: a node's directory (the root's included), a
// metadata file, or a metadata file that does not exist; nullopt when it says nothing (not below a
// consolidated store, or a chunk).
enum class Answer { kNode, kFile, kNone };
std::optional<Answer> known_to_consolidated(const Url& url) {
  Recent& table = recent();
  std::lock_guard<std::mutex> lock(table.mutex);
  const auto [consolidated, path] = covering_consolidated(table, url);
  if (consolidated == nullptr) return std::nullopt;
  if (path.empty() || consolidated->directories.count(path) > 0) return Answer::kNode;
  if (consolidated->files.count(path) > 0) return Answer::kFile;
  if (consolidated_answers(path)) return Answer::kNone;
  return std::nullopt;
}

// URLs (each with the index of its text in `texts`) grouped by the store that serves them (a bucket or
// host, with its options): what one store's requests may ask for together.
struct StoreUrls {
  std::shared_ptr<const ObjectStore> store;
  std::vector<Url> urls;
  std::vector<size_t> indices;
};
std::vector<StoreUrls> by_store(const std::vector<std::string>& texts, const std::vector<size_t>& which) {
  std::map<const ObjectStore*, StoreUrls> grouped;
  for (size_t i : which) {
    Url url = parse_url(texts[i]);
    std::shared_ptr<const ObjectStore> store = ObjectStore::of(url);
    StoreUrls& entry = grouped[store.get()];
    entry.store = std::move(store);
    entry.urls.push_back(std::move(url));
    entry.indices.push_back(i);
  }
  std::vector<StoreUrls> out;
  for (auto& [raw, entry] : grouped) out.push_back(std::move(entry));
  return out;
}

// What a HEAD would answer now of an object just fetched whole (a stamp asked for next: a zarr.json's,
// as its store opens). With the table locked.
void learn_stat(Recent& table, const std::string& key, const std::optional<std::vector<uint8_t>>& got,
                const std::string& etag) {
  table.learn(table.stats, key,
              got ? std::optional<ObjectStamp>(ObjectStamp{static_cast<int64_t>(got->size()), etag}) : std::nullopt);
}

// An object just fetched whole (nullopt: there is none), kept when small, and its stat. With the table
// locked.
void learn_object(Recent& table, const std::string& key, const std::optional<std::vector<uint8_t>>& got,
                  const std::string& etag) {
  if (!got || got->size() <= kSmallObject) table.learn(table.objects, key, got);
  learn_stat(table, key, got, etag);
}

}  // namespace

void begin_opening() {
  Recent& table = recent();
  std::lock_guard<std::mutex> lock(table.mutex);
  if (table.scopes++ == 0) ++table.opening;
}

void end_opening() {
  Recent& table = recent();
  std::lock_guard<std::mutex> lock(table.mutex);
  if (table.scopes > 0) --table.scopes;  // none in a child forked inside a scope: its table is its own
}

std::optional<RemoteObject> open_remote(const std::string& text) {
  const Url url = parse_url(text);
  std::optional<ObjectStamp> stamp = stat_remote(url.text);
  if (!stamp) return std::nullopt;
  return RemoteObject{url, *stamp};
}

void read_remote(const RemoteObject& object, std::vector<RangeRead>& ranges, const std::function<std::string()>& what,
                 int64_t coalesce_gap) {
  ObjectStore::of(object.url)->read(object.url, object.stamp, ranges, what, coalesce_gap);
}

std::shared_ptr<const MappedEntry> map_remote(const RemoteObject& object, const std::function<std::string()>& what) {
  return ObjectStore::of(object.url)->whole(object.url, object.stamp, what);
}

std::optional<ObjectStamp> stat_remote(const std::string& text) {
  const Url url = parse_url(text);
  Recent& table = recent();
  const std::string key = recent_key(url);
  {
    std::lock_guard<std::mutex> lock(table.mutex);
    if (const auto* known = table.fresh(table.stats, key)) return *known;
    const auto [listing, path] = covering_listing(table, url);
    if (listing != nullptr && listing->objects.count(path) == 0) return std::nullopt;  // listed: not there
  }
  std::optional<ObjectStamp> stamp = ObjectStore::of(url)->head(url);
  std::lock_guard<std::mutex> lock(table.mutex);
  table.learn(table.stats, key, stamp);
  return stamp;
}

void stat_remote_together(const std::vector<std::string>& texts) {
  Recent& table = recent();
  std::vector<size_t> unknown;
  {
    std::lock_guard<std::mutex> lock(table.mutex);
    for (size_t i = 0; i < texts.size(); ++i) {
      if (table.fresh(table.stats, recent_key(parse_url(texts[i]))) == nullptr) unknown.push_back(i);
    }
  }
  for (const StoreUrls& entry : by_store(texts, unknown)) {
    std::vector<std::optional<ObjectStamp>> stamps;
    try {
      stamps = entry.store->heads(entry.urls);
    } catch (const std::exception&) {
      continue;  // asked for again one by one, which says why it cannot be
    }
    std::lock_guard<std::mutex> lock(table.mutex);
    for (size_t k = 0; k < stamps.size(); ++k) {
      if (stamps[k]) table.learn(table.stats, recent_key(entry.urls[k]), stamps[k]);
    }
  }
}

bool consolidated_metadata_learnt(const std::string& text) {
  Recent& table = recent();
  std::lock_guard<std::mutex> lock(table.mutex);
  return table.scopes > 0 && table.fresh(table.consolidated, recent_key(parse_url(text))) != nullptr;
}

bool remote_exists(const std::string& text) {
  if (const std::optional<Answer> known = known_to_consolidated(parse_url(text))) return *known != Answer::kNone;
  return stat_remote(text).has_value() || remote_is_directory(text);
}

bool remote_is_directory(const std::string& text) {
  const Url url = parse_url(text);
  if (const std::optional<Answer> known = known_to_consolidated(url)) return *known == Answer::kNode;
  if (stat_remote(url.text)) return false;
  if (url.scheme == "s3") {
    Recent& table = recent();
    const std::string key = recent_key(url);
    {
      std::lock_guard<std::mutex> lock(table.mutex);
      if (const bool* known = table.fresh(table.below, key)) return *known;
      const auto [listing, path] = covering_listing(table, url);
      if (listing != nullptr) return listing->directories.count(path) > 0;
      if (table.scopes > 0 && table.fresh(table.listed, key) != nullptr) return true;  // listed: objects below
    }
    const bool below = ObjectStore::of(url)->has_objects_below(url);
    std::lock_guard<std::mutex> lock(table.mutex);
    table.learn(table.below, key, below);
    return below;
  }
  for (const char* name : {"/zarr.json", "/.zgroup", "/.zarray"}) {
    if (stat_remote(url.text + name)) return true;
  }
  return false;
}

std::vector<std::pair<std::string, bool>> list_remote(const std::string& text) {
  const Url url = parse_url(text);
  {
    Recent& table = recent();
    std::lock_guard<std::mutex> lock(table.mutex);
    const std::string key = recent_key(url);
    auto [listing, path] = covering_listing(table, url);
    const auto* whole = table.scopes > 0 ? table.fresh(table.listed, key) : nullptr;
    if (whole != nullptr) listing = whole->get(), path.clear();  // url itself
    if (listing != nullptr) return entries_below(listing->objects, listing->directories, path);
    // A consolidated store's nodes and metadata files (its chunks are not in it: what a listing of it
    // is asked for is its nodes, as over HTTP, where nothing else could be listed).
    const auto [consolidated, below] = covering_consolidated(table, url);
    if (consolidated != nullptr && (below.empty() || consolidated->directories.count(below) > 0)) {
      std::set<std::string> files;
      for (const auto& [name, bytes] : consolidated->files) files.insert(name);
      return entries_below(files, consolidated->directories, below);
    }
  }
  return ObjectStore::of(url)->list(url);
}

void list_remote_store(const std::string& text) {
  const Url url = parse_url(text);
  if (url.scheme != "s3") return;
  Recent& table = recent();
  const std::string key = recent_key(url);
  {
    std::lock_guard<std::mutex> lock(table.mutex);
    if (table.scopes == 0) return;  // what it learns would be used within openings only
    if (table.fresh(table.listed, key) != nullptr || covering_listing(table, url).first != nullptr) return;
  }
  if (stat_remote(url.text)) return;  // an object (an .h5ad), not a store
  // The store of `url`'s options for all of it: options registered earlier for places below it (an
  // earlier opening's datasets) must not redirect what is learnt for this opening.
  const std::shared_ptr<const ObjectStore> store = ObjectStore::of(url);
  const std::string store_key = ObjectStore::key_of(url);
  std::optional<std::vector<ObjectStore::Listed>> listed;
  try {
    listed = store->list_all(url, kMaxListedPages);
  } catch (const std::exception&) {
    return;  // not allowed to list (public buckets often are not), or no such bucket: asked for one by one
  }
  if (!listed || listed->empty()) return;
  auto listing = std::make_shared<Listing>();
  std::vector<Url> metadata;
  for (const ObjectStore::Listed& object : *listed) {
    const std::string& path = object.path;
    listing->objects.insert(path);
    for (size_t slash = path.find('/'); slash != std::string::npos; slash = path.find('/', slash + 1)) {
      listing->directories.insert(path.substr(0, slash));
    }
    if (is_zarr_metadata(path)) metadata.push_back(parse_url(url.text + "/" + path));
  }
  {
    std::lock_guard<std::mutex> lock(table.mutex);
    for (auto it = table.listed.begin(); it != table.listed.end();) {  // stale listings dropped
      it = table.fresh(table.listed, it->first) == nullptr ? table.listed.erase(it) : std::next(it);
    }
    table.learn(table.listed, key, std::shared_ptr<const Listing>(std::move(listing)));
    // Each object's stamp as listed, what a HEAD would answer now: the shards a read opens soon after
    // (within the reuse rules of stats) are not asked for again. A later GET still says If-Match.
    for (const ObjectStore::Listed& object : *listed) {
      if (object.stamp) table.learn(table.stats, recent_key(parse_url(url.text + "/" + object.path)), object.stamp);
    }
  }
  // Together; learnt for the opening that follows. One it cannot read (refused to this caller) is
  // left for the opening to ask for, and fail on, if it needs it.
  std::vector<std::string> etags;
  std::vector<std::optional<std::vector<uint8_t>>> got;
  try {
    got = store->get(metadata, &etags);
  } catch (const std::exception&) {
    return;
  }
  std::lock_guard<std::mutex> lock(table.mutex);
  for (size_t i = 0; i < metadata.size(); ++i)
    learn_object(table, store_key + '\n' + metadata[i].text, got[i], etags[i]);
}

void learn_consolidated_metadata(const std::string& text, std::map<std::string, std::vector<uint8_t>> files) {
  const Url url = parse_url(text);
  auto consolidated = std::make_shared<Consolidated>();
  for (const auto& [path, bytes] : files) {
    for (size_t slash = path.find('/'); slash != std::string::npos; slash = path.find('/', slash + 1)) {
      consolidated->directories.insert(path.substr(0, slash));
    }
  }
  consolidated->files = std::move(files);
  Recent& table = recent();
  std::lock_guard<std::mutex> lock(table.mutex);
  if (table.scopes == 0) return;                                                 // used within openings only
  for (auto it = table.consolidated.begin(); it != table.consolidated.end();) {  // stale ones dropped
    it = table.fresh(table.consolidated, it->first) == nullptr ? table.consolidated.erase(it) : std::next(it);
  }
  table.learn(table.consolidated, recent_key(url), std::shared_ptr<const Consolidated>(std::move(consolidated)));
}

std::vector<std::optional<std::vector<uint8_t>>> read_remote_objects(const std::vector<std::string>& texts,
                                                                     std::vector<std::string>* etags) {
  std::vector<std::optional<std::vector<uint8_t>>> out(texts.size());
  if (etags != nullptr) etags->assign(texts.size(), "");
  Recent& table = recent();
  // Small objects read in the last seconds are reused (metadata asked for many times while opening).
  std::vector<std::string> keys;
  for (const std::string& text : texts) keys.push_back(recent_key(parse_url(text)));
  std::vector<size_t> wanted;
  {
    std::lock_guard<std::mutex> lock(table.mutex);
    for (size_t i = 0; i < texts.size(); ++i) {
      const auto* known = etags == nullptr ? table.fresh(table.objects, keys[i]) : nullptr;
      if (known != nullptr) {
        out[i] = *known;
        continue;
      }
      const Url url = parse_url(texts[i]);
      if (etags == nullptr) {  // (a stamp is asked for with objects read as they are stored)
        const auto [consolidated, below] = covering_consolidated(table, url);
        if (consolidated != nullptr && consolidated_answers(below)) {
          const auto file = consolidated->files.find(below);
          if (file != consolidated->files.end()) out[i] = file->second;  // else: none
          continue;
        }
      }
      const auto [listing, path] = covering_listing(table, url);
      if (listing == nullptr || listing->objects.count(path) > 0) wanted.push_back(i);  // else: listed, not there
    }
  }
  // Fetched together, per store.
  for (const StoreUrls& entry : by_store(texts, wanted)) {
    std::vector<std::string> got_etags;
    std::vector<std::optional<std::vector<uint8_t>>> got = entry.store->get(entry.urls, &got_etags);
    std::lock_guard<std::mutex> lock(table.mutex);
    for (size_t k = 0; k < entry.indices.size(); ++k) {
      const size_t i = entry.indices[k];
      if (etags == nullptr) {
        learn_object(table, keys[i], got[k], got_etags[k]);
      } else {
        learn_stat(table, keys[i], got[k], got_etags[k]);
        (*etags)[i] = got_etags[k];
      }
      out[i] = std::move(got[k]);
    }
  }
  return out;
}

}  // namespace torch_shards::io::storage
