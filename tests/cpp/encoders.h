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

inline std::vector<uint8_t> zlib_compress(const std::vector<uint8_t>& in) {
  uLongf size = compressBound(in.size());
  std::vector<uint8_t> out(size);
  EXPECT_EQ(compress2(out.data(), &size, in.data(), in.size(), 6), Z_OK);
  out.resize(size);
  return out;
}

inline std::vector<uint8_t> gzip_compress(const std::vector<uint8_t>& in) {
  z_stream stream{};
  EXPECT_EQ(deflateInit2(&stream, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::vector<uint8_t> out(deflateBound(&stream, in.size()) + 32);
  stream.next_in = const_cast<Bytef*>(in.data());
  stream.avail_in = static_cast<uInt>(in.size());
  stream.next_out = out.data();
  stream.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&stream, Z_FINISH), Z_STREAM_END);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

inline std::vector<uint8_t> zstd_compress(const std::vector<uint8_t>& in) {
  std::vector<uint8_t> out(ZSTD_compressBound(in.size()));
  const size_t size = ZSTD_compress(out.data(), out.size(), in.data(), in.size(), 3);
  EXPECT_FALSE(ZSTD_isError(size));
  out.resize(size);
  return out;
}

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
