// A zarr store's consolidated metadata (zarr v3's consolidated_metadata in
// its root zarr.json, v2's .zmetadata, which anndata writes to every zarr
// store): behind a URL, opening the store then reads its metadata in one
// request instead of one per node, one after another.
#pragma once

#include <string>

namespace torch_shards::io::zarr {

// Behind a URL whose storage options leave `consolidated` on: when the
// store's root holds consolidated metadata, every node's metadata files are
// learnt from it for the opening under way (remote_paths.h,
// learn_consolidated_metadata), as zarr-python opens such a store. A
// store without any is left alone; consolidated metadata that cannot be
// read is a MetadataError naming its file. Local paths: nothing (their
// metadata files are read where they lie).
void learn_consolidated_metadata(const std::string& store);

}  // namespace torch_shards::io::zarr
