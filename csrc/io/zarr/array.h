// zarr arrays on a local filesystem, format v2 (.zarray) and v3 (zarr.json),
// including v3 shards (the sharding_indexed codec). A store is a directory; an
// array or group inside it is named by a path from the store's root ("/" for
// the root itself, "/X/data" for an array two levels down).
//
// Numeric arrays open as a ChunkedArray (parallel chunk decoding, fill value
// for chunks never written). String arrays, which AnnData writes for
// obs/var names and categories, are read whole with read_zarr_strings.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/array.h"

namespace torch_shards::io {

// A directory holding a zarr array (v2 .zarray, or v3 zarr.json with node_type "array").
bool is_zarr_array(const std::string& dir);
// A directory holding a zarr group (v2 .zgroup, or v3 zarr.json with node_type "group").
bool is_zarr_group(const std::string& dir);

// Whether the array at `path` holds strings (read with read_zarr_strings).
// Throws ReadError for malformed or missing metadata.
bool is_zarr_string_array(const std::string& store, const std::string& path);

// Opens the numeric array at `path` inside the store directory `store`. Throws
// ReadError naming the store and the path for anything missing, malformed or
// unsupported on disk, InvalidArgument for 0-d arrays and malformed paths.
std::shared_ptr<const Array> open_zarr_array(const std::string& store, const std::string& path);

// The 1-D string array at `path` (a 0-d one, as AnnData writes scalar
// strings, gives one string): v2 object arrays with the vlen-utf8 (or
// vlen-bytes) filter, v2 fixed-length "<U n" and "|S n"; v3 "string" with the
// vlen-utf8 codec, fixed_length_utf32 and null_terminated_bytes. Trailing NULs
// of fixed-length strings are dropped; UTF-32 becomes UTF-8. Throws ReadError
// for numeric arrays.
std::vector<std::string> read_zarr_strings(const std::string& store, const std::string& path);
// How many strings read_zarr_strings would return, from the metadata only.
int64_t zarr_string_array_length(const std::string& store, const std::string& path);

// The user attributes of the array or group at `path` (v2 .zattrs, v3
// zarr.json "attributes"); an empty object if there are none.
nlohmann::json read_zarr_attributes(const std::string& store, const std::string& path);

// "/", or "/a/b" for "a/b", "/a/b/" ...; InvalidArgument for "." or ".." parts.
std::string normalize_zarr_path(const std::string& path);

}  // namespace torch_shards::io
