// What a process learned that the processes forked from it start with: credentials fetched (until they
// are due), a metadata service found silent. A DataLoader worker started by fork then neither asks the
// service again nor waits for it again, as its parent would not.
//
// The state a process works with is per process (io::per_process: a child forked while a thread of its
// parent held a lock would otherwise find it locked for ever), so it cannot be read across the fork.
// This table is: each version is immutable once published (an atomic pointer to the newest), so a child
// reads the version its parent published last without any lock. Versions replaced stay reachable and
// are never freed, as another thread may still be reading one: for what is written rarely (once per
// credentials' lifetime, once per silence).
//   static InheritedTable<std::string, int64_t> silences;
//   silences.put(endpoint, until);                      // published
//   for (auto& [key, value] : silences.snapshot()) ...  // in a fresh per-process table
#pragma once

#include <atomic>
#include <map>

namespace torch_shards::io::storage {

template <typename Key, typename Value>
class InheritedTable {
 public:
  // The newest version's entries (none before the first put).
  std::map<Key, Value> snapshot() const {
    const Version* newest = newest_.load(std::memory_order_acquire);
    return newest != nullptr ? newest->entries : std::map<Key, Value>{};
  }

  // Publishes a version with `key` set to `value` (safe from any thread, with no lock).
  void put(const Key& key, const Value& value) {
    const Version* seen = newest_.load(std::memory_order_acquire);
    auto* next = new Version();
    do {
      next->entries = seen != nullptr ? seen->entries : std::map<Key, Value>{};
      next->entries.insert_or_assign(key, value);
      next->replaced = seen;
    } while (!newest_.compare_exchange_weak(seen, next, std::memory_order_acq_rel, std::memory_order_acquire));
  }

 private:
  struct Version {
    std::map<Key, Value> entries;
    const Version* replaced = nullptr;  // kept reachable, never freed
  };
  std::atomic<const Version*> newest_{nullptr};
};

}  // namespace torch_shards::io::storage
