#include "io/storage/remote_paths.h"

#include <chrono>
#include <map>
#include <mutex>

#include "core/errors.h"
#include "io/file.h"

namespace torch_shards::io::storage {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kKeep = std::chrono::seconds(10);  // how long stats and small objects are reused
constexpr size_t kSmallObject = 1 << 20;

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
  std::map<std::string, Known<bool>> below;  // s3: whether objects lie below a prefix

  // What `map` knows of `key` that may be used now, or null. While a dataset opens: only what this
  // opening learnt (an object rewritten since an earlier opening is seen as it is now). Otherwise (a
  // reader opening shards, checking a store's metadata): what was learnt in the last kKeep.
  template <typename T>
  const T* fresh(std::map<std::string, Known<T>>& map, const std::string& key) const {
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

void read_remote(const RemoteObject& object, std::vector<RangeRead>& ranges, const std::function<std::string()>& what) {
  ObjectStore::of(object.url)->read(object.url, object.stamp, ranges, what);
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
  }
  std::optional<ObjectStamp> stamp = ObjectStore::of(url)->head(url);
  std::lock_guard<std::mutex> lock(table.mutex);
  table.learn(table.stats, key, stamp);
  return stamp;
}

bool remote_exists(const std::string& url) { return stat_remote(url).has_value() || remote_is_directory(url); }

bool remote_is_directory(const std::string& text) {
  const Url url = parse_url(text);
  if (stat_remote(url.text)) return false;
  if (url.scheme == "s3") {
    Recent& table = recent();
    const std::string key = recent_key(url);
    {
      std::lock_guard<std::mutex> lock(table.mutex);
      if (const bool* known = table.fresh(table.below, key)) return *known;
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
  return ObjectStore::of(url)->list(url);
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
      } else {
        wanted.push_back(i);
      }
    }
  }
  // Fetched together, per store (a bucket or host).
  std::map<const ObjectStore*, std::pair<std::shared_ptr<const ObjectStore>, std::vector<size_t>>> by_store;
  for (size_t i : wanted) {
    const Url url = parse_url(texts[i]);
    std::shared_ptr<const ObjectStore> store = ObjectStore::of(url);
    auto& entry = by_store[store.get()];
    entry.first = std::move(store);
    entry.second.push_back(i);
  }
  for (auto& [raw, entry] : by_store) {
    std::vector<Url> urls;
    for (size_t i : entry.second) urls.push_back(parse_url(texts[i]));
    std::vector<std::string> got_etags;
    std::vector<std::optional<std::vector<uint8_t>>> got = entry.first->get(urls, &got_etags);
    std::lock_guard<std::mutex> lock(table.mutex);
    for (size_t k = 0; k < entry.second.size(); ++k) {
      const size_t i = entry.second[k];
      if (etags == nullptr && (!got[k] || got[k]->size() <= kSmallObject)) table.learn(table.objects, keys[i], got[k]);
      // What a HEAD would answer now (a stamp asked for next: a zarr.json's, as its store opens).
      table.learn(table.stats, keys[i],
                  got[k] ? std::optional<ObjectStamp>(ObjectStamp{static_cast<int64_t>(got[k]->size()), got_etags[k]})
                         : std::nullopt);
      if (etags != nullptr) (*etags)[i] = got_etags[k];
      out[i] = std::move(got[k]);
    }
  }
  return out;
}

}  // namespace torch_shards::io::storage
