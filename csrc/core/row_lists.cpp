#include "core/row_lists.h"

#include <algorithm>
#include <utility>

namespace torch_shards::core {
namespace {

struct Kept {
  std::vector<std::vector<int64_t>> lists;
  size_t bytes = 0;
  ~Kept();
};

// Set once this thread's Kept is destroyed (the thread ends): a list let go of after that is freed. A
// trivial thread_local, valid until the thread is gone.
thread_local bool kept_gone = false;
thread_local Kept kept;

Kept::~Kept() { kept_gone = true; }

size_t bytes_of(const std::vector<int64_t>& list) { return list.capacity() * sizeof(int64_t); }

}  // namespace

std::vector<int64_t> take_row_list() {
  if (kept_gone || kept.lists.empty()) return {};
  // The largest: a small one (an epoch's tail unit) handed out for a large unit grows into new pages.
  auto largest = std::max_element(kept.lists.begin(), kept.lists.end(),
                                  [](const auto& a, const auto& b) { return a.capacity() < b.capacity(); });
  std::vector<int64_t> list = std::move(*largest);
  kept.lists.erase(largest);
  kept.bytes -= bytes_of(list);
  return list;
}

void keep_row_list(std::vector<int64_t>&& list) {
  std::vector<int64_t> owned = std::move(list);
  const size_t bytes = bytes_of(owned);
  if (kept_gone || bytes == 0 || kept.lists.size() >= kKeptRowLists || kept.bytes + bytes > kKeptRowListBytes) {
    return;  // freed
  }
  owned.clear();
  kept.bytes += bytes;
  kept.lists.push_back(std::move(owned));
}

std::shared_ptr<std::vector<int64_t>> share_row_list() {
  return std::shared_ptr<std::vector<int64_t>>(new std::vector<int64_t>(take_row_list()),
                                               [](std::vector<int64_t>* list) {
                                                 keep_row_list(std::move(*list));
                                                 delete list;
                                               });
}

size_t kept_row_lists() { return kept_gone ? 0 : kept.lists.size(); }

size_t kept_row_list_bytes() { return kept_gone ? 0 : kept.bytes; }

}  // namespace torch_shards::core
