// Small reads of an object behind a URL served from pages of it kept per
// process: what a format's metadata parser asks for (HDF5's superblock,
// object headers, B-tree nodes and heaps: tens to hundreds of reads of a few
// bytes to a few KB, many of them of the same bytes, as each call opens the
// file anew) costs a round trip per 64 KiB page instead of one per read.
//
// Pages are keyed by the object's URL, size and ETag, the stamp its reads
// carry (If-Match): a page is only ever the bytes of that one state of the
// object, so it is kept for the process' life (all dropped past 256 MiB), and
// an object rewritten is read anew under its new stamp. An object served
// without an ETag is read as asked, without pages.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "io/storage/remote_paths.h"

namespace torch_shards::io::storage {

constexpr int64_t kRemotePageBytes = 64 << 10;

// Copies [offset, offset + bytes) of `object` (inside it) to `out`, fetching the pages not held yet
// together. what() names the bytes in messages.
void read_remote_paged(const RemoteObject& object, int64_t offset, int64_t bytes, uint8_t* out,
                       const std::function<std::string()>& what);

// Fetches together the pages holding each (offset, bytes) range (clipped to the object) not held yet: what
// a parser about to walk a structure (a B-tree's level) asks for ahead, in one round trip.
void hold_remote_pages(const RemoteObject& object, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                       const std::function<std::string()>& what);

}  // namespace torch_shards::io::storage
