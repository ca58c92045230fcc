// What the GoogleTest suites write chunks with: zlib, gzip, zstd and blosc
// encoders of whole buffers, through the libraries themselves (the readers
// under test decode them); a failed encode fails the test.
#pragma once

#include <blosc.h>
#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace torch_shards::testing_support {

// A valid pointer to the bytes, also for an empty buffer (the libraries refuse a null input).
inline const uint8_t* data_or_dummy(const std::vector<uint8_t>& bytes) {
  static const uint8_t dummy = 0;
  return bytes.empty() ? &dummy : bytes.data();
}

inline std::vector<uint8_t> zlib_compress_at(const std::vector<uint8_t>& in, int level) {
  uLongf size = compressBound(in.size());
  std::vector<uint8_t> out(size);
  EXPECT_EQ(compress2(out.data(), &size, data_or_dummy(in), in.size(), level), Z_OK);
  out.resize(size);
  return out;
}
// At the levels the suites' zarr metadata name (zlib 6, gzip 6, zstd 3).
inline std::vector<uint8_t> zlib_compress(const std::vector<uint8_t>& in) { return zlib_compress_at(in, 6); }

inline std::vector<uint8_t> gzip_compress_at(const std::vector<uint8_t>& in, int level) {
  z_stream stream{};
  EXPECT_EQ(deflateInit2(&stream, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::vector<uint8_t> out(deflateBound(&stream, in.size()) + 32);
  stream.next_in = const_cast<Bytef*>(data_or_dummy(in));
  stream.avail_in = static_cast<uInt>(in.size());
  stream.next_out = out.data();
  stream.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&stream, Z_FINISH), Z_STREAM_END);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

inline std::vector<uint8_t> gzip_compress(const std::vector<uint8_t>& in) { return gzip_compress_at(in, 6); }

inline std::vector<uint8_t> zstd_compress_at(const std::vector<uint8_t>& in, int level) {
  std::vector<uint8_t> out(ZSTD_compressBound(in.size()));
  const size_t size = ZSTD_compress(out.data(), out.size(), data_or_dummy(in), in.size(), level);
  EXPECT_FALSE(ZSTD_isError(size)) << ZSTD_getErrorName(size);
  out.resize(size);
  return out;
}

inline std::vector<uint8_t> zstd_compress(const std::vector<uint8_t>& in) { return zstd_compress_at(in, 3); }

// One blosc1 frame (one thread): `compressor` "lz4", "zstd", "blosclz", ...; shuffle BLOSC_NOSHUFFLE,
// BLOSC_SHUFFLE or BLOSC_BITSHUFFLE.
inline std::vector<uint8_t> blosc_compress(const std::vector<uint8_t>& in, size_t typesize, int shuffle,
                                           const char* compressor, int clevel = 5) {
  std::vector<uint8_t> out(in.size() + BLOSC_MAX_OVERHEAD);
  const int size =
      blosc_compress_ctx(clevel, shuffle, typesize, in.size(), in.data(), out.data(), out.size(), compressor, 0, 1);
  EXPECT_GT(size, 0);
  out.resize(static_cast<size_t>(std::max(size, 0)));
  return out;
}

}  // namespace torch_shards::testing_support
