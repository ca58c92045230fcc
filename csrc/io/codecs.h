// Decompressors and byte transforms for chunked arrays (HDF5 filters, zarr
// codecs). Every decoder writes exactly out_size bytes or throws
// std::runtime_error saying what is wrong with the input (callers add the
// file and the path inside it). None reads outside [in, in + in_size) or
// writes outside [out, out + out_size), whatever the input bytes: corrupt or
// truncated data is an exception, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>

namespace torch_shards::io::codecs {

// RFC 1950 zlib stream (HDF5 deflate filter, numcodecs Zlib).
void inflate_zlib(const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size);
// RFC 1952 gzip stream (numcodecs GZip, zarr v3 gzip codec).
void inflate_gzip(const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size);
// One or more zstd frames (numcodecs Zstd, zarr v3 zstd codec, HDF5 filter 32015).
void decompress_zstd(const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size);
// A blosc1 frame, any inner codec c-blosc supports (blosclz, lz4, lz4hc,
// zlib, zstd) and byte or bit shuffle (numcodecs Blosc, zarr v3 blosc codec,
// HDF5 filter 32001).
void decompress_blosc(const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size);
// Inverse of HDF5's shuffle filter: byte k of every element was stored in
// plane k. A size that is not a multiple of element_size keeps its trailing
// bytes in place, as HDF5 does.
void unshuffle(const uint8_t* in, size_t size, size_t element_size, uint8_t* out);
// CRC-32C (Castagnoli), as zarr v3's crc32c codec and shard indexes use.
uint32_t crc32c(const uint8_t* data, size_t size);
// Reverses the byte order of `count` elements of `unit` bytes, in place.
void byteswap(uint8_t* data, size_t count, size_t unit);

}  // namespace torch_shards::io::codecs
