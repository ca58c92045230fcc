// The fill value of a numeric zarr array: what elements of chunks never written hold.
#pragma once

#include <cstdint>
#include <vector>

#include "io/zarr/metadata.h"

namespace torch_shards::io::zarr {

// One element of the fill value in stored byte order.
std::vector<uint8_t> numeric_fill_bytes(const ZarrMetadata& meta);

}  // namespace torch_shards::io::zarr
