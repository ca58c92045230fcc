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

void read_remote_paged(const RemoteObject& object, int64_t offset, int64_t bytes, uint8_t* out,
                       const std::function<std::string()>& what) {
  if (bytes <= 0) return;
  if (object.stamp.etag.empty()) {
    // Without an ETag nothing tells this state of the object from a later one of the same size: not kept.
    std::vector<RangeRead> reads = {{offset, bytes, out}};
    read_remote(object, reads, what);
    return;
  }
  const int64_t size = object.stamp.size, end = offset + bytes;
  const std::string key = concat(object.url.text, '\n', size, '\n', object.stamp.etag);
  Pages& pages = per_process<Pages>();
  const int64_t first = offset / kRemotePageBytes, last = (end - 1) / kRemotePageBytes;
  std::vector<Page> held(static_cast<size_t>(last - first + 1));
  {
    std::lock_guard<std::mutex> lock(pages.mutex);
    const auto found = pages.by_object.find(key);
    if (found != pages.by_object.end()) {
      for (int64_t page = first; page <= last; ++page) {
        const auto it = found->second.find(page);
        if (it != found->second.end()) held[static_cast<size_t>(page - first)] = it->second;
      }
    }
  }
  // The pages missing, fetched together (outside the lock: other threads' pages are served meanwhile).
  std::vector<std::shared_ptr<std::vector<uint8_t>>> fetched;
  std::vector<RangeRead> reads;
  std::vector<int64_t> numbers;
  for (int64_t page = first; page <= last; ++page) {
    if (held[static_cast<size_t>(page - first)]) continue;
    const int64_t begin = page * kRemotePageBytes;
    auto data = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(std::min(kRemotePageBytes, size - begin)));
    reads.push_back({begin, static_cast<int64_t>(data->size()), data->data()});
    numbers.push_back(page);
    fetched.push_back(std::move(data));
  }
  if (!reads.empty()) {
    read_remote(object, reads, what);
    std::lock_guard<std::mutex> lock(pages.mutex);
    if (pages.held > kMaxHeldBytes) {
      pages.by_object.clear();
      pages.held = 0;
    }
    std::map<int64_t, Page>& of_object = pages.by_object[key];
    for (size_t i = 0; i < fetched.size(); ++i) {
      held[static_cast<size_t>(numbers[i] - first)] = fetched[i];
      if (of_object.emplace(numbers[i], fetched[i]).second) pages.held += static_cast<int64_t>(fetched[i]->size());
    }
  }
  for (int64_t page = first; page <= last; ++page) {
    const std::vector<uint8_t>& data = *held[static_cast<size_t>(page - first)];
    const int64_t begin = page * kRemotePageBytes;
    const int64_t from = std::max(offset, begin), to = std::min(end, begin + static_cast<int64_t>(data.size()));
    std::memcpy(out + (from - offset), data.data() + (from - begin), static_cast<size_t>(to - from));
  }
}

}  // namespace torch_shards::io::storage
