// Decompressors and byte transforms for chunked arrays (HDF5 filters, zarr
// codecs). Every decoder writes exactly out_size bytes or throws
// std::runtime_error saying what is wrong with the input (callers add the
// file and the path inside it). None reads outside [in, in + in_size) or
// writes outside [out, out + out_size), whatever the input bytes: corrupt or
// truncated data is an exception, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace torch_shards::io::codecs {

enum class Codec { kZlib, kGzip, kZstd, kBlosc, kLzf };

// RFC 1950 zlib stream (HDF5 deflate filter, numcodecs Zlib).
void inflate_zlib(const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size);
// RFC 1952 gzip stream (numcodecs GZip, zarr v3 gzip codec).
void inflate_gzip(const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size);
// A whole zlib or gzip stream (codec kZlib or kGzip) whose decoded size
// nothing records (a chunk of variable-length strings): decoded into a
// buffer grown as the stream needs; more than max_size bytes is an error.
std::vector<uint8_t> inflate_unsized(Codec codec, const uint8_t* in, size_t in_size, size_t max_size);
// An LZF stream (h5py's HDF5 filter 32000, which anndata's write_h5ad offers
// as compression="lzf"): literal runs and back-references, no header.
void decompress_lzf(const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size);
// One or more zstd frames (numcodecs Zstd, zarr v3 zstd codec, HDF5 filter 32015).
void decompress_zstd(const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size);
// A blosc1 frame, any inner codec c-blosc supports (blosclz, lz4, lz4hc,
// zlib, zstd) and byte or bit shuffle (numcodecs Blosc, zarr v3 blosc codec,
// HDF5 filter 32001).
void decompress_blosc(const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size);
// Throws unless `in` starts a blosc1 frame whose header c-blosc accepts, that
// lies within in_size bytes and decodes to out_size bytes.
void check_blosc_frame(const uint8_t* in, size_t in_size, size_t out_size);
// "blosc frame (lz4, byte shuffle, typesize 4)", from its 16-byte header, for messages.
std::string describe_blosc(const uint8_t* header);
// Inverse of HDF5's shuffle filter: byte k of every element was stored in
// plane k. A size that is not a multiple of element_size keeps its trailing
// bytes in place, as HDF5 does.
void unshuffle(const uint8_t* in, size_t size, size_t element_size, uint8_t* out);
// The little-endian 32-bit word at p (blosc headers, scale-offset headers).
inline uint32_t read_le32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
// CRC-32C (Castagnoli), as zarr v3's crc32c codec and shard indexes use
// (and the node-local cache's entries): SSE4.2's instruction where the CPU
// has it (about 5x zlib's crc32), else crc32c_portable.
uint32_t crc32c(const uint8_t* data, size_t size);
// The CRC-32C of bytes that follow those whose CRC-32C is `crc`: a CRC taken in pieces as they come
// (crc32c(data, size) == crc32c_extend(0, data, size)).
uint32_t crc32c_extend(uint32_t crc, const uint8_t* data, size_t size);
// The CRC-32C of a followed by b, from theirs and b's length: pieces taken apart (in parallel, or
// each part of a download as it arrives) joined in order.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t size_b);
// crc32c and crc32c_extend by tables (slicing by 8), on any CPU.
uint32_t crc32c_portable(const uint8_t* data, size_t size);
uint32_t crc32c_portable(uint32_t crc, const uint8_t* data, size_t size);
// Reverses the byte order of `count` elements of `unit` bytes, in place.
void byteswap(uint8_t* data, size_t count, size_t unit);

// HDF5's scale-offset filter (H5Z_FILTER_SCALEOFFSET) on integers: each
// chunk stores minbits (4 bytes LE), the size of minval (1 byte), minval (LE,
// in a 16-byte field), then every element's value minus minval in minbits
// bits, most significant bit first; all bits set stands for the fill value
// when one is defined. Writes `count` elements of `size` bytes in the given
// byte order. Unlike HDF5 1.10, checks minbits and the stored length before
// reading a bit.
struct ScaleOffsetParameters {
  size_t count = 0;  // elements per chunk
  size_t size = 0;   // bytes per element: 1, 2, 4 or 8
  bool big_endian = false;
  bool fill_defined = false;
  uint64_t fill = 0;  // the fill value's bits
};
void decode_scaleoffset(const uint8_t* in, size_t in_size, uint8_t* out, const ScaleOffsetParameters& parameters);

const char* codec_name(Codec codec);
// What the encoded bytes say about their decoded size, checked against the
// bytes themselves, so that no size read from a file is trusted before
// memory is allocated for it:
// - exact: the size the data records (a blosc header, zstd frames with
//   their content size), which the decoder will then require;
// - otherwise the most it can decode to: deflate expands at most 1032:1;
//   zstd frames without a content size, at most 65536:1; lzf, 88:1.
// Throws std::runtime_error for a header that cannot be right.
struct DecodedSize {
  uint64_t size = 0;
  bool exact = false;
};
DecodedSize decoded_size(Codec codec, const uint8_t* in, size_t in_size);
// Throws unless `in` can decode to exactly `out_size` bytes by decoded_size.
void check_decoded_size(Codec codec, const uint8_t* in, size_t in_size, size_t out_size);

}  // namespace torch_shards::io::codecs
