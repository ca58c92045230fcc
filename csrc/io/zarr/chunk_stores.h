// Where a zarr array's chunks are read from: one file per chunk, or the inner
// chunks of v3 shards located through each shard's index.
#pragma once

#include <memory>

#include "io/chunked_array.h"
#include "io/zarr/metadata.h"

namespace torch_shards::io::zarr {

// The chunks of the array `meta` describes (its inner chunks when sharded).
// Throws ReadError naming the array for impossible shard layouts.
std::shared_ptr<const ChunkStore> make_chunk_store(const ZarrMetadata& meta);

}  // namespace torch_shards::io::zarr
