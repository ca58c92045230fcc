#include "io/storage/remote_pages.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/errors.h"
#include "io/file.h"

namespace torch_shards::io::storage {

using core::concat;

namespace {

constexpr int64_t kMaxHeldBytes = int64_t{256} << 20;

using Page = std::shared_ptr<const std::vector<uint8_t>>;

struct Pages {
  std::mutex mutex;
  std::map<std::string, std::map<int64_t, Page>> by_object;  // URL, size, ETag -> page number -> its bytes
  int64_t held = 0;
};

}  // namespace

namespace {

// The object's pages numbered `wanted`, those not held yet fetched together (outside the lock: other
// threads' pages are served meanwhile).
std::vector<Page> pages_of(const RemoteObject& object, const std::string& key, const std::vector<int64_t>& wanted,
                           const std::function<std::string()>& what) {
  Pages& pages = per_process<Pages>();
  std::vector<Page> held(wanted.size());
  {
    std::lock_guard<std::mutex> lock(pages.mutex);
    const auto found = pages.by_object.find(key);
    if (found != pages.by_object.end()) {
      for (size_t i = 0; i < wanted.size(); ++i) {
        const auto it = found->second.find(wanted[i]);
        if (it != found->second.end()) held[i] = it->second;
      }
    }
  }
  std::vector<std::shared_ptr<std::vector<uint8_t>>> fetched;
  std::vector<RangeRead> reads;
  std::vector<size_t> slots;
  for (size_t i = 0; i < wanted.size(); ++i) {
    if (held[i]) continue;
    const int64_t begin = wanted[i] * kRemotePageBytes;
    auto data = std::make_shared<std::vector<uint8_t>>(
        static_cast<size_t>(std::min(kRemotePageBytes, object.stamp.size - begin)));
    reads.push_back({begin, static_cast<int64_t>(data->size()), data->data()});
    slots.push_back(i);
    fetched.push_back(std::move(data));
  }
  if (reads.empty()) return held;
  // Only adjacent pages share a request: the pages of a B-tree's level lie far apart, between the chunks
  // they index, whose bytes nobody asked for.
  read_remote(object, reads, what, 0);
  std::lock_guard<std::mutex> lock(pages.mutex);
  if (pages.held > kMaxHeldBytes) {
    pages.by_object.clear();
    pages.held = 0;
  }
  std::map<int64_t, Page>& of_object = pages.by_object[key];
  for (size_t j = 0; j < fetched.size(); ++j) {
    held[slots[j]] = fetched[j];
    if (of_object.emplace(wanted[slots[j]], fetched[j]).second) pages.held += static_cast<int64_t>(fetched[j]->size());
  }
  return held;
}

std::string key_of(const RemoteObject& object) {
  return concat(object.url.text, '\n', object.stamp.size, '\n', object.stamp.etag);
}

}  // namespace

void read_remote_paged(const RemoteObject& object, int64_t offset, int64_t bytes, uint8_t* out,
                       const std::function<std::string()>& what) {
  if (bytes <= 0) return;
  if (object.stamp.etag.empty()) {
    // Without an ETag nothing tells this state of the object from a later one of the same size: not kept.
    std::vector<RangeRead> reads = {{offset, bytes, out}};
    read_remote(object, reads, what);
    return;
  }
  const int64_t end = offset + bytes;
  const int64_t first = offset / kRemotePageBytes, last = (end - 1) / kRemotePageBytes;
  std::vector<int64_t> wanted;
  for (int64_t page = first; page <= last; ++page) wanted.push_back(page);
  const std::vector<Page> held = pages_of(object, key_of(object), wanted, what);
  for (int64_t page = first; page <= last; ++page) {
    const std::vector<uint8_t>& data = *held[static_cast<size_t>(page - first)];
    const int64_t begin = page * kRemotePageBytes;
    const int64_t from = std::max(offset, begin), to = std::min(end, begin + static_cast<int64_t>(data.size()));
    std::memcpy(out + (from - offset), data.data() + (from - begin), static_cast<size_t>(to - from));
  }
}

void hold_remote_pages(const RemoteObject& object, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                       const std::function<std::string()>& what) {
  if (object.stamp.etag.empty()) return;
  std::vector<int64_t> wanted;
  for (const auto& [offset, bytes] : ranges) {
    if (bytes <= 0 || offset < 0 || offset >= object.stamp.size) continue;
    const int64_t end = std::min(offset + bytes, object.stamp.size);
    for (int64_t page = offset / kRemotePageBytes; page <= (end - 1) / kRemotePageBytes; ++page) wanted.push_back(page);
  }
  std::sort(wanted.begin(), wanted.end());
  wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
  if (!wanted.empty()) pages_of(object, key_of(object), wanted, what);
}

}  // namespace torch_shards::io::storage
