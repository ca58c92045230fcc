// Lists of rows (std::vector<int64_t>) kept by the thread that let go of
// them, and handed out again by it: the lists made for every unit a reader
// claims (its rows, their order in ascending row order) and for every epoch
// (the fetch a unit cursor holds), on threads the process keeps from one
// epoch to the next (reader threads: core/thread_cache.h; the training loop's).
//
// Made and freed each time, the lists of a large fetch (65,536 rows: 512 KB
// each) took pages new to the process every unit: malloc gives memory that
// large back to the system when it is freed (or trims the arena it came
// from), and each 4 KB is then a page fault, and a page zeroed, when written
// again (TensorSource at batch 4096 on 2 CPUs: ~1,000 page faults an epoch;
// kept, none, and epochs of 14.1 ms take 12.3). Each thread keeps up to
// kKeptRowLists lists of kKeptRowListBytes in all; a list let go of beyond
// that (or holding no memory) is freed. Kept per thread, they need no lock
// (and so no care at a fork: the child has the forking thread's, consistent).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace torch_shards::core {

constexpr size_t kKeptRowLists = 8;
constexpr size_t kKeptRowListBytes = size_t{16} << 20;

// An empty list: the largest of those this thread keeps (its memory kept), else a new one.
std::vector<int64_t> take_row_list();
// Keeps `list` for this thread's next take_row_list() (its contents dropped), or frees it.
void keep_row_list(std::vector<int64_t>&& list);
// take_row_list() shared: the thread that lets go of it last keeps it.
std::shared_ptr<std::vector<int64_t>> share_row_list();

// A list of this thread's, kept again when it goes (a list a function fills and drops).
struct KeptRowList {
  KeptRowList() : list(take_row_list()) {}
  ~KeptRowList() { keep_row_list(std::move(list)); }
  KeptRowList(const KeptRowList&) = delete;
  KeptRowList& operator=(const KeptRowList&) = delete;
  std::vector<int64_t> list;
};

// Lists this thread keeps now, and their memory in bytes (tests).
size_t kept_row_lists();
size_t kept_row_list_bytes();

}  // namespace torch_shards::core
