// Codecs: each decoder against data compressed here by the real libraries
// (zlib, zstd, c-blosc with every compressor it was built with), the byte
// transforms against reference loops, and deterministic fuzzing: corrupt,
// truncated or garbage input must throw std::exception or decode to exactly
// out_size bytes, never crash. Build once with -fsanitize=address,undefined.
#include <blosc.h>
#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "encoders.h"
#include "io/blosc_ranges.h"
#include "io/codecs.h"

namespace torch_shards::io::codecs {
namespace {

using Bytes = std::vector<uint8_t>;
using Decoder = void (*)(const uint8_t*, size_t, uint8_t*, size_t);

// SplitMix64: deterministic test data and corruptions.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  size_t below(size_t bound) { return static_cast<size_t>(next() % bound); }
  uint8_t byte() { return static_cast<uint8_t>(next()); }

 private:
  uint64_t state_;
};

// Compressible but varied, like array chunks: runs, noise, small-range noise
// and little-endian counters.
Bytes sample_data(size_t size, uint64_t seed) {
  Rng rng(seed);
  Bytes data(size);
  for (size_t i = 0; i < size;) {
    const size_t end = std::min(size, i + 1 + rng.below(96));
    const size_t kind = rng.below(4);
    const uint8_t value = rng.byte();
    for (; i < end; ++i) {
      switch (kind) {
        case 0:
          data[i] = value;
          break;
        case 1:
          data[i] = rng.byte();
          break;
        case 2:
          data[i] = static_cast<uint8_t>(value + rng.below(4));
          break;
        default:
          data[i] = static_cast<uint8_t>((i / 4) >> (8 * (i % 4)));
      }
    }
  }
  return data;
}

Bytes concat_bytes(const Bytes& a, const Bytes& b) {
  Bytes out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

// ------------------------------------------------------------ compressors

using testing_support::data_or_dummy;
using testing_support::gzip_compress_at;
using testing_support::zlib_compress_at;
using testing_support::zstd_compress_at;

// Streaming compression that never learns the total size: the frame header
// has no content size (as `zstd` writing from a pipe produces).
Bytes zstd_compress_streaming(const Bytes& data, int level, bool checksum) {
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, checksum ? 1 : 0);
  Bytes out(ZSTD_compressBound(data.size()) + 1024);
  ZSTD_outBuffer output{out.data(), out.size(), 0};
  // Everything goes in with ZSTD_e_continue, so zstd never learns the size.
  const size_t piece = 1000;
  ZSTD_inBuffer nothing{data_or_dummy({}), 0, 0};
  ZSTD_compressStream2(cctx, &output, &nothing, ZSTD_e_continue);  // even for empty data
  for (size_t pos = 0;; pos += piece) {
    const bool last = pos >= data.size();
    ZSTD_inBuffer input{data_or_dummy(data) + std::min(pos, data.size()), last ? 0 : std::min(piece, data.size() - pos),
                        0};
    for (;;) {
      const size_t left = ZSTD_compressStream2(cctx, &output, &input, last ? ZSTD_e_end : ZSTD_e_continue);
      EXPECT_FALSE(ZSTD_isError(left)) << ZSTD_getErrorName(left);
      if (ZSTD_isError(left) || (last ? left == 0 : input.pos == input.size)) break;
    }
    if (last) break;
  }
  ZSTD_freeCCtx(cctx);
  out.resize(output.pos);
  return out;
}

std::vector<std::string> blosc_compressors() {
  std::vector<std::string> names;
  const std::string list = blosc_list_compressors();
  for (size_t begin = 0; begin <= list.size();) {
    const size_t end = std::min(list.find(',', begin), list.size());
    if (end > begin) names.push_back(list.substr(begin, end - begin));
    begin = end + 1;
  }
  return names;
}

Bytes blosc_compress_bytes(const Bytes& data, int clevel, int shuffle, size_t typesize, const std::string& compressor,
                           size_t blocksize = 0) {
  Bytes out(data.size() + BLOSC_MAX_OVERHEAD);
  const int size = blosc_compress_ctx(clevel, shuffle, typesize, data.size(), data_or_dummy(data), out.data(),
                                      out.size(), compressor.c_str(), blocksize, /*numinternalthreads=*/1);
  EXPECT_GT(size, 0) << compressor;
  out.resize(static_cast<size_t>(std::max(size, 0)));
  return out;
}

// LZF as h5py's filter writes it (greedy matches of 3 bytes or more, at most
// 8192 bytes back, 264 long; literal runs of at most 32), for round trips:
// the format, not liblzf's exact choices.
Bytes lzf_compress(const Bytes& data) {
  Bytes out;
  std::vector<int64_t> last(1 << 16, -1);  // a 3-byte prefix's latest position
  const auto prefix = [&](size_t i) { return (data[i] << 8 ^ data[i + 1] << 4 ^ data[i + 2]) & 0xffff; };
  size_t literals = 0;  // pending, ending at i
  const auto flush = [&](size_t end) {
    for (size_t begin = end - literals; begin < end;) {
      const size_t run = std::min<size_t>(32, end - begin);
      out.push_back(static_cast<uint8_t>(run - 1));
      out.insert(out.end(), data.begin() + static_cast<std::ptrdiff_t>(begin),
                 data.begin() + static_cast<std::ptrdiff_t>(begin + run));
      begin += run;
    }
    literals = 0;
  };
  for (size_t i = 0; i < data.size();) {
    size_t length = 0, distance = 0;
    if (i + 3 <= data.size()) {
      const int64_t candidate = last[prefix(i)];
      last[prefix(i)] = static_cast<int64_t>(i);
      if (candidate >= 0 && i - static_cast<size_t>(candidate) <= 8192) {
        distance = i - static_cast<size_t>(candidate);
        while (length < 264 && i + length < data.size() && data[i + length] == data[i + length - distance]) ++length;
      }
    }
    if (length < 3) {
      ++literals;
      ++i;
      continue;
    }
    flush(i);
    const size_t coded = length - 2, back = distance - 1;
    if (coded < 7) {
      out.push_back(static_cast<uint8_t>(coded << 5 | back >> 8));
    } else {
      out.push_back(static_cast<uint8_t>(7 << 5 | back >> 8));
      out.push_back(static_cast<uint8_t>(coded - 7));
    }
    out.push_back(static_cast<uint8_t>(back & 0xff));
    i += length;
  }
  flush(data.size());
  return out;
}

// ------------------------------------------------------------------ helpers

Bytes decode(Decoder decoder, const Bytes& in, size_t out_size) {
  Bytes out(out_size);
  decoder(in.data(), in.size(), out.data(), out.size());
  return out;
}

// Whether decoding throws std::runtime_error whose message contains `needle`.
testing::AssertionResult fails_with(Decoder decoder, const Bytes& in, size_t out_size, const std::string& needle) {
  try {
    decode(decoder, in, out_size);
  } catch (const std::runtime_error& error) {
    if (std::string(error.what()).find(needle) != std::string::npos) return testing::AssertionSuccess();
    return testing::AssertionFailure() << "message \"" << error.what() << "\" lacks \"" << needle << "\"";
  }
  return testing::AssertionFailure() << "no exception (wanted \"" << needle << "\")";
}

const size_t kSizes[] = {0, 1, 7, 255, 4096, 65536 + 13, 300001};

// --------------------------------------------------------------- zlib, gzip

TEST(Codecs, InflateZlibRoundTripsCompress2AtEveryLevel) {
  for (size_t size : kSizes) {
    const Bytes data = sample_data(size, size);
    for (int level : {0, 1, 6, 9}) {
      EXPECT_EQ(decode(inflate_zlib, zlib_compress_at(data, level), size), data) << size << " " << level;
    }
  }
}

TEST(Codecs, InflateGzipRoundTripsDeflateInit2Output) {
  for (size_t size : kSizes) {
    const Bytes data = sample_data(size, size + 1);
    for (int level : {0, 1, 6, 9}) {
      EXPECT_EQ(decode(inflate_gzip, gzip_compress_at(data, level), size), data) << size << " " << level;
    }
  }
}

TEST(Codecs, InflateGzipReadsConcatenatedMembersAndZeroPadding) {
  const Bytes a = sample_data(5000, 1), b = sample_data(3000, 2), empty;
  const Bytes both = concat_bytes(a, b);
  const Bytes members =
      concat_bytes(concat_bytes(gzip_compress_at(a, 6), gzip_compress_at(empty, 6)), gzip_compress_at(b, 1));
  EXPECT_EQ(decode(inflate_gzip, members, both.size()), both);
  EXPECT_EQ(decode(inflate_gzip, concat_bytes(members, Bytes(100, 0)), both.size()), both);
  EXPECT_TRUE(fails_with(inflate_gzip, concat_bytes(members, Bytes{1, 2, 3}), both.size(), "3 unexpected bytes"));
}

TEST(Codecs, InflateZlibIgnoresBytesAfterTheStream) {
  const Bytes data = sample_data(4096, 3);
  EXPECT_EQ(decode(inflate_zlib, concat_bytes(zlib_compress_at(data, 6), Bytes{1, 2, 3}), data.size()), data);
}

TEST(Codecs, InflateThrowsWhenOutSizeIsWrong) {
  const Bytes data = sample_data(4096, 4);
  for (Decoder decoder : {inflate_zlib, inflate_gzip}) {
    const Bytes packed = decoder == inflate_zlib ? zlib_compress_at(data, 6) : gzip_compress_at(data, 6);
    const char* name = decoder == inflate_zlib ? "zlib" : "gzip";
    EXPECT_TRUE(
        fails_with(decoder, packed, 4097, std::string(name) + " stream decompressed to 4096 bytes, expected 4097"));
    EXPECT_TRUE(fails_with(decoder, packed, 8192, "decompressed to 4096 bytes, expected 8192"));
    EXPECT_TRUE(fails_with(decoder, packed, 4095, "decompresses to more than 4095 bytes"));
    EXPECT_TRUE(fails_with(decoder, packed, 0, "decompresses to more than 0 bytes"));
  }
}

TEST(Codecs, InflateThrowsOnTruncatedOrCorruptStreams) {
  const Bytes data = sample_data(4096, 5);
  const Bytes packed = zlib_compress_at(data, 6);
  EXPECT_TRUE(fails_with(inflate_zlib, Bytes(packed.begin(), packed.end() - 1), data.size(), "truncated"));
  EXPECT_TRUE(fails_with(inflate_zlib, Bytes(packed.begin(), packed.begin() + packed.size() / 2), data.size(),
                         "zlib stream is truncated"));
  EXPECT_TRUE(fails_with(inflate_zlib, Bytes{}, 10, "truncated"));
  EXPECT_TRUE(fails_with(inflate_zlib, Bytes{0x12, 0x34, 0x56}, 10, "corrupt zlib stream: incorrect header check"));
  Bytes bad_checksum = packed;
  ASSERT_FALSE(bad_checksum.empty());
  bad_checksum[bad_checksum.size() - 1] ^= 1;
  EXPECT_TRUE(fails_with(inflate_zlib, bad_checksum, data.size(), "corrupt zlib stream: incorrect data check"));
  Bytes gzip_bad_length = gzip_compress_at(data, 6);
  gzip_bad_length[gzip_bad_length.size() - 4] ^= 1;  // ISIZE
  EXPECT_TRUE(fails_with(inflate_gzip, gzip_bad_length, data.size(), "corrupt gzip stream: incorrect length check"));
  EXPECT_TRUE(fails_with(inflate_gzip, packed, data.size(), "corrupt gzip stream"));  // zlib header is not gzip
}

TEST(Codecs, InflateUnsizedDecodesWholeStreamsIntoAGrowingBuffer) {
  for (size_t size : kSizes) {
    const Bytes data = sample_data(size, 6);
    const Bytes zlib = zlib_compress_at(data, 6), gzip = gzip_compress_at(data, 6);
    EXPECT_EQ(inflate_unsized(Codec::kZlib, zlib.data(), zlib.size(), size_t{1} << 30), data) << size;
    EXPECT_EQ(inflate_unsized(Codec::kGzip, gzip.data(), gzip.size(), size_t{1} << 30), data) << size;
  }
  // A megabyte of zeros from ~1 KB: grown many times over the first guess.
  const Bytes zeros(1 << 20, 0), packed = zlib_compress_at(zeros, 9);
  EXPECT_EQ(inflate_unsized(Codec::kZlib, packed.data(), packed.size(), zeros.size()), zeros);
  try {
    inflate_unsized(Codec::kZlib, packed.data(), packed.size(), zeros.size() - 1);
    ADD_FAILURE() << "no exception beyond max_size";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("decompresses to more than 1048575 bytes"), std::string::npos)
        << error.what();
  }
  const Bytes data = sample_data(4096, 7), zlib = zlib_compress_at(data, 6);
  try {
    inflate_unsized(Codec::kZlib, zlib.data(), zlib.size() / 2, size_t{1} << 30);
    ADD_FAILURE() << "no exception for a truncated stream";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("zlib stream is truncated: it ends after"), std::string::npos)
        << error.what();
  }
  EXPECT_THROW(inflate_unsized(Codec::kZstd, zlib.data(), zlib.size(), 1 << 20), std::logic_error);
}

// ----------------------------------------------------------------------- lzf

TEST(Codecs, DecompressLzfRoundTrips) {
  for (size_t size : kSizes) {
    for (uint64_t seed : {8, 9}) {
      const Bytes data = sample_data(size, seed), packed = lzf_compress(data);
      EXPECT_EQ(decode(decompress_lzf, packed, size), data) << size;
      if (size > 4096) {
        EXPECT_LT(packed.size(), size * 9 / 10) << "back-references were made";
      }
    }
  }
  const Bytes zeros(100000, 0);
  EXPECT_EQ(decode(decompress_lzf, lzf_compress(zeros), zeros.size()), zeros);
}

TEST(Codecs, DecompressLzfReadsHandMadeStreams) {
  // "abc" as a literal run, then 9 bytes 3 back (overlapping): the long form, 7 + 0 + 2.
  const Bytes long_form = {2, 'a', 'b', 'c', 0xe0, 0x00, 0x02};
  EXPECT_EQ(decode(decompress_lzf, long_form, 12), (Bytes{'a', 'b', 'c', 'a', 'b', 'c', 'a', 'b', 'c', 'a', 'b', 'c'}));
  // The short form: 1 + 2 bytes, 1 back.
  EXPECT_EQ(decode(decompress_lzf, Bytes({0, 'x', 0x20, 0x00}), 4), (Bytes{'x', 'x', 'x', 'x'}));
  EXPECT_EQ(decode(decompress_lzf, Bytes{}, 0), Bytes{});
}

TEST(Codecs, DecompressLzfThrowsOnTruncatedOrCorruptStreams) {
  EXPECT_TRUE(fails_with(decompress_lzf, Bytes({5, 'a', 'b'}), 6, "lzf stream is truncated: a literal run of 6"));
  EXPECT_TRUE(fails_with(decompress_lzf, Bytes({0, 'a', 0x20}), 4, "lzf stream is truncated: a back-reference"));
  EXPECT_TRUE(fails_with(decompress_lzf, Bytes({0, 'a', 0xe0, 0x00}), 12, "lzf stream is truncated"));
  EXPECT_TRUE(fails_with(decompress_lzf, Bytes({0, 'a', 0x20, 0x05}), 4, "corrupt lzf stream: a back-reference 6"));
  EXPECT_TRUE(fails_with(decompress_lzf, Bytes({0x20, 0x00}), 3, "corrupt lzf stream"));  // nothing to refer to
  EXPECT_TRUE(fails_with(decompress_lzf, Bytes({0, 'x', 0x20, 0x00}), 3, "decompresses to more than 3 bytes"));
  EXPECT_TRUE(fails_with(decompress_lzf, Bytes({1, 'x', 'y'}), 1, "decompresses to more than 1 bytes"));
  EXPECT_TRUE(fails_with(decompress_lzf, Bytes({0, 'x', 0x20, 0x00}), 5, "decompressed to 4 bytes, expected 5"));
}

// ---------------------------------------------------------------------- zstd

TEST(Codecs, DecompressZstdRoundTripsOneShotFrames) {
  for (size_t size : kSizes) {
    const Bytes data = sample_data(size, size + 2);
    for (int level : {-5, 1, 3, 19}) {
      EXPECT_EQ(decode(decompress_zstd, zstd_compress_at(data, level), size), data) << size << " " << level;
    }
  }
}

TEST(Codecs, DecompressZstdReadsConcatenatedAndSkippableFrames) {
  const Bytes a = sample_data(70000, 6), b = sample_data(1234, 7);
  const Bytes both = concat_bytes(a, b);
  EXPECT_EQ(decode(decompress_zstd, concat_bytes(zstd_compress_at(a, 3), zstd_compress_at(b, 9)), both.size()), both);
  // A skippable frame (magic 0x184D2A5?, little-endian size) between the two.
  const Bytes skippable = {0x53, 0x2a, 0x4d, 0x18, 3, 0, 0, 0, 9, 9, 9};
  const Bytes framed =
      concat_bytes(concat_bytes(zstd_compress_at(a, 3), skippable), zstd_compress_streaming(b, 3, true));
  EXPECT_EQ(decode(decompress_zstd, framed, both.size()), both);
}

TEST(Codecs, DecompressZstdReadsFramesWithoutContentSize) {
  for (size_t size : kSizes) {
    const Bytes data = sample_data(size, size + 3);
    for (bool checksum : {false, true}) {
      const Bytes packed = zstd_compress_streaming(data, 3, checksum);
      ASSERT_EQ(ZSTD_getFrameContentSize(packed.data(), packed.size()), ZSTD_CONTENTSIZE_UNKNOWN);
      EXPECT_EQ(decode(decompress_zstd, packed, size), data) << size;
    }
  }
}

TEST(Codecs, DecompressZstdAcceptsWindowsAboveTheStreamingDefault) {
  // zstd --long writes windows above the 128 MiB the streaming decoder allows
  // by default; patch a frame's window descriptor to 2 GiB (exponent 31 - 10).
  const Bytes data = sample_data(100000, 8);
  Bytes packed = zstd_compress_streaming(data, 3, true);
  ASSERT_EQ(packed[4] & 0x20, 0);  // no single-segment flag: a window descriptor follows
  packed[5] = 21 << 3;
  EXPECT_EQ(decode(decompress_zstd, packed, data.size()), data);
}

TEST(Codecs, DecompressZstdThrowsWhenOutSizeIsWrongOrDataIsBad) {
  const Bytes data = sample_data(4096, 9);
  for (const Bytes& packed : {zstd_compress_at(data, 3), zstd_compress_streaming(data, 3, false)}) {
    EXPECT_TRUE(fails_with(decompress_zstd, packed, 4097, "zstd data decompressed to 4096 bytes, expected 4097"));
    EXPECT_TRUE(fails_with(decompress_zstd, packed, 4095, "zstd data decompresses to more than 4095 bytes"));
    EXPECT_TRUE(fails_with(decompress_zstd, packed, 0, "decompresses to more than 0 bytes"));
    EXPECT_TRUE(fails_with(decompress_zstd, Bytes(packed.begin(), packed.end() - 1), 4096, "truncated"));
    EXPECT_TRUE(fails_with(decompress_zstd, concat_bytes(packed, Bytes{1, 2, 3}), 4096, "corrupt zstd data"));
  }
  EXPECT_TRUE(fails_with(decompress_zstd, Bytes{}, 0, "zstd data is empty"));
  EXPECT_TRUE(fails_with(decompress_zstd, Bytes(20, 0x42), 20, "corrupt zstd data: Unknown frame descriptor"));
  Bytes bad_checksum = zstd_compress_streaming(data, 3, true);
  bad_checksum.back() ^= 1;
  EXPECT_TRUE(fails_with(decompress_zstd, bad_checksum, 4096, "corrupt zstd data"));
}

TEST(Codecs, DecompressZstdWorksFromManyThreads) {
  // Thread-local contexts: concurrent decodes must not interfere, including
  // after a failed one left a context mid-frame.
  const Bytes data = sample_data(200000, 10);
  const Bytes packed = zstd_compress_streaming(data, 3, true);
  std::vector<std::thread> threads;
  std::vector<int> good(8, 0);
  for (size_t t = 0; t < good.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        try {
          decode(decompress_zstd, Bytes(packed.begin(), packed.begin() + packed.size() / 2), data.size());
        } catch (const std::runtime_error&) {
        }
        good[t] += decode(decompress_zstd, packed, data.size()) == data;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int count : good) EXPECT_EQ(count, 20);
}

// --------------------------------------------------------------------- blosc

const int kShuffles[] = {BLOSC_NOSHUFFLE, BLOSC_SHUFFLE, BLOSC_BITSHUFFLE};

TEST(Codecs, BloscOffersTheCompressorsNumcodecsWrites) {
  const std::vector<std::string> names = blosc_compressors();
  for (const char* name : {"blosclz", "lz4", "lz4hc", "zlib", "zstd"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end())
        << name << " missing from " << blosc_list_compressors();
  }
}

TEST(Codecs, DecompressBloscRoundTripsEveryCompressorShuffleAndTypesize) {
  for (const std::string& compressor : blosc_compressors()) {
    for (int shuffle : kShuffles) {
      for (size_t typesize : {1, 2, 4, 8}) {
        for (size_t size : {size_t{0}, size_t{1}, size_t{100}, size_t{4096 * 8 + 3}, size_t{300001}}) {
          const Bytes data = sample_data(size, size + typesize);
          for (int clevel : {0, 5}) {
            const Bytes packed = blosc_compress_bytes(data, clevel, shuffle, typesize, compressor);
            EXPECT_EQ(decode(decompress_blosc, packed, size), data)
                << compressor << " shuffle " << shuffle << " typesize " << typesize << " size " << size;
          }
        }
      }
    }
  }
}

TEST(Codecs, DecompressBloscRoundTripsManySmallBlocksWithALeftover) {
  const Bytes data = sample_data(50003, 11);
  for (const std::string& compressor : blosc_compressors()) {
    for (int shuffle : kShuffles) {
      for (size_t typesize : {1, 4, 8, 3, 17}) {
        const Bytes packed = blosc_compress_bytes(data, 9, shuffle, typesize, compressor, /*blocksize=*/1024);
        EXPECT_EQ(decode(decompress_blosc, packed, data.size()), data) << compressor << " " << shuffle;
      }
    }
  }
}

TEST(Codecs, DecompressBloscThrowsOnSizeMismatchAndNamesTheCompressor) {
  const Bytes data = sample_data(4096, 12);
  const Bytes packed = blosc_compress_bytes(data, 5, BLOSC_SHUFFLE, 4, "lz4");
  EXPECT_TRUE(fails_with(decompress_blosc, packed, 4097,
                         "blosc frame (lz4, byte shuffle, typesize 4) decompresses to 4096 bytes, expected 4097"));
  EXPECT_TRUE(fails_with(decompress_blosc, packed, 0, "decompresses to 4096 bytes, expected 0"));
  EXPECT_TRUE(fails_with(decompress_blosc, Bytes(packed.begin(), packed.end() - 1), 4096,
                         "is truncated: its header says " + std::to_string(packed.size()) + " bytes but only " +
                             std::to_string(packed.size() - 1) + " are present"));
  EXPECT_TRUE(fails_with(decompress_blosc, Bytes(packed.begin(), packed.begin() + 15), 4096,
                         "blosc frame is 15 bytes, shorter than its 16-byte header"));
  Bytes version = packed;
  version[0] = 3;
  EXPECT_TRUE(fails_with(decompress_blosc, version, 4096, "unsupported blosc format version 3"));
  const Bytes zstd = blosc_compress_bytes(data, 5, BLOSC_BITSHUFFLE, 8, "zstd");
  EXPECT_TRUE(fails_with(decompress_blosc, zstd, 1, "blosc frame (zstd, bit shuffle, typesize 8)"));
  Bytes corrupt = zstd;
  for (size_t i = 16 + 4; i < corrupt.size(); ++i) corrupt[i] ^= 0x5a;
  EXPECT_TRUE(fails_with(decompress_blosc, corrupt, 4096, "corrupt blosc frame (zstd, bit shuffle, typesize 8)"));
}

TEST(Codecs, DecompressBloscAcceptsBytesAfterTheFrame) {
  const Bytes data = sample_data(4096, 13);
  const Bytes packed = blosc_compress_bytes(data, 5, BLOSC_SHUFFLE, 4, "blosclz");
  EXPECT_EQ(decode(decompress_blosc, concat_bytes(packed, Bytes(7, 0xee)), data.size()), data);
}

// ------------------------------------------------------------ blosc ranges

// Float32 values between 1 and 2 (annbatch's counts look alike to lz4): three
// byte planes of noise, stored raw in split frames, and one that compresses.
Bytes float_data(size_t count, uint64_t seed) {
  Rng rng(seed);
  Bytes data(count * 4);
  for (size_t i = 0; i < count; ++i) {
    const float value = 1.0f + static_cast<float>(rng.below(1 << 20)) / (1 << 20);
    std::memcpy(data.data() + 4 * i, &value, 4);
  }
  return data;
}

// Random ranges of [0, size): single bytes, block edges, overlaps, empties.
std::vector<std::pair<size_t, size_t>> sample_ranges(size_t size, size_t blocksize, Rng& rng) {
  std::vector<std::pair<size_t, size_t>> ranges;
  if (size == 0) return ranges;
  const size_t count = 1 + rng.below(8);
  for (size_t r = 0; r < count; ++r) {
    size_t begin = rng.below(size), end = begin + rng.below(size - begin + 1);
    if (r == 0 && blocksize > 0 && blocksize < size) {  // across a block boundary
      begin = blocksize - std::min(blocksize, size_t{5});
      end = std::min(size, blocksize + 3);
    }
    if (r == 1) end = begin;  // empty
    if (r == 2) end = std::min(size, begin + 1);
    ranges.emplace_back(begin, end);
  }
  return ranges;
}

void expect_ranges_match(const Bytes& packed, const Bytes& data, Rng& rng, size_t blocksize, const std::string& what) {
  for (int trial = 0; trial < 6; ++trial) {
    auto spans = sample_ranges(data.size(), blocksize, rng);
    if (trial == 0 && !data.empty()) spans = {{0, data.size() - 1}};
    if (trial == 1 && !data.empty()) spans = {{1, data.size()}, {0, 0}};
    if (trial >= 3) {  // a small part of the frame: decoded in part, not whole
      for (auto& [begin, end] : spans) end = std::min(end, begin + data.size() / 32);
    }
    if (trial == 5 && !data.empty()) {  // a shuffled fetch's rows: a span cut into pieces, in any order
      spans.clear();
      size_t begin = rng.below(data.size());
      const size_t end = begin + rng.below(data.size() - begin + 1);
      while (begin < end) {
        const size_t piece = std::min(end - begin, 1 + rng.below(400));
        spans.emplace_back(begin, begin + piece);
        begin += piece;
      }
      for (size_t i = spans.size(); i > 1; --i) std::swap(spans[i - 1], spans[rng.below(i)]);
    }
    for (const bool trusted : {false, true}) {  // every lz4 stream decoded whole, or only the prefixes needed
      std::vector<Bytes> outs;
      for (const auto& [begin, end] : spans) outs.emplace_back(end - begin + 1, 0xcd);  // one guard byte
      std::vector<ByteRange> ranges;
      for (size_t r = 0; r < spans.size(); ++r)
        ranges.push_back(ByteRange{spans[r].first, spans[r].second, outs[r].data()});
      decompress_blosc_ranges(packed.data(), packed.size(), data.size(), ranges, trusted);
      for (size_t r = 0; r < spans.size(); ++r) {
        const auto [begin, end] = spans[r];
        ASSERT_TRUE(std::equal(data.begin() + begin, data.begin() + end, outs[r].begin()))
            << what << (trusted ? " (trusted)" : "") << ": bytes [" << begin << ", " << end << ") of " << data.size();
        ASSERT_EQ(outs[r].back(), 0xcd) << what << ": wrote past bytes [" << begin << ", " << end << ")";
      }
    }
  }
}

// Every frame c-blosc writes (every compressor, shuffle, typesize, split
// mode, block size, stored frames): any ranges equal the whole decode's bytes.
TEST(Codecs, DecompressBloscRangesEqualTheWholeDecode) {
  Rng rng(21);
  for (const int splitmode : {BLOSC_FORWARD_COMPAT_SPLIT, BLOSC_ALWAYS_SPLIT, BLOSC_NEVER_SPLIT}) {
    blosc_set_splitmode(splitmode);
    for (const std::string& compressor : blosc_compressors()) {
      for (const int shuffle : {BLOSC_NOSHUFFLE, BLOSC_SHUFFLE, BLOSC_BITSHUFFLE}) {
        for (const size_t typesize : {1, 2, 3, 4, 8, 12, 16, 24}) {
          // ALWAYS_SPLIT past 16-byte elements writes frames c-blosc itself misreads.
          if (splitmode == BLOSC_ALWAYS_SPLIT && typesize > 16) continue;
          for (const size_t size :
               {size_t{0}, size_t{1}, size_t{100}, size_t{4096}, size_t{25596}, size_t{65536 + 13}}) {
            for (const size_t blocksize : {size_t{0}, size_t{1024}, size_t{3000}}) {
              for (const int clevel : {0, 5}) {
                const Bytes data =
                    typesize == 4 && size % 4 == 0 ? float_data(size / 4, size) : sample_data(size, size);
                const Bytes packed = blosc_compress_bytes(data, clevel, shuffle, typesize, compressor, blocksize);
                const std::string what = compressor + " shuffle " + std::to_string(shuffle) + " typesize " +
                                         std::to_string(typesize) + " size " + std::to_string(size) + " blocksize " +
                                         std::to_string(blocksize) + " clevel " + std::to_string(clevel) +
                                         " splitmode " + std::to_string(splitmode);
                ASSERT_EQ(decode(decompress_blosc, packed, size), data) << what;
                expect_ranges_match(packed, data, rng, blocksize, what);
              }
            }
          }
        }
      }
    }
  }
  blosc_set_splitmode(BLOSC_FORWARD_COMPAT_SPLIT);
}

// annbatch's frames: one block, split streams, three stored raw and one lz4.
TEST(Codecs, DecompressBloscRangesReadsStoredStreamsWhereTheyLie) {
  blosc_set_splitmode(BLOSC_ALWAYS_SPLIT);
  const Bytes data = float_data(6399, 5);
  const Bytes packed = blosc_compress_bytes(data, 3, BLOSC_SHUFFLE, 4, "lz4");
  blosc_set_splitmode(BLOSC_FORWARD_COMPAT_SPLIT);
  ASSERT_EQ(packed[2] & 0x10, 0) << "not split";
  // Stream sizes after the header and the one block offset.
  size_t offset = 20, stored = 0;
  for (int j = 0; j < 4; ++j) {
    uint32_t bytes = 0;
    std::memcpy(&bytes, packed.data() + offset, 4);
    stored += bytes == 6399;
    offset += 4 + bytes;
  }
  EXPECT_EQ(stored, 3u);
  Rng rng(8);
  expect_ranges_match(packed, data, rng, 0, "annbatch-like");
  // The head of the chunk and its tail, as a block of rows straddling two chunks reads them.
  Bytes head(400), tail(400);
  decompress_blosc_ranges(packed.data(), packed.size(), data.size(),
                          {ByteRange{0, 400, head.data()}, ByteRange{data.size() - 400, data.size(), tail.data()}});
  EXPECT_TRUE(std::equal(head.begin(), head.end(), data.begin()));
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), data.end() - 400));
}

// Damaged frames (bytes flipped, cut short, stream sizes and block offsets
// that point anywhere) throw std::runtime_error naming the frame or decode:
// never a read outside the frame (the sanitizer build checks that).
TEST(Codecs, DecompressBloscRangesThrowsOnDamagedFrames) {
  blosc_set_splitmode(BLOSC_ALWAYS_SPLIT);
  const Bytes data = float_data(4096, 9);
  const Bytes split = blosc_compress_bytes(data, 5, BLOSC_SHUFFLE, 4, "lz4", 4096);
  blosc_set_splitmode(BLOSC_NEVER_SPLIT);
  const Bytes whole = blosc_compress_bytes(data, 5, BLOSC_SHUFFLE, 4, "lz4", 4096);
  blosc_set_splitmode(BLOSC_FORWARD_COMPAT_SPLIT);
  Rng rng(3);
  Bytes out(data.size());
  size_t thrown = 0, trials = 0;
  for (const Bytes* frame : {&split, &whole}) {
    for (int trial = 0; trial < 3000; ++trial, ++trials) {
      Bytes damaged = *frame;
      const size_t kind = rng.below(3);
      if (kind == 0) {  // flipped bytes after the header
        for (int k = 0; k < 3; ++k)
          damaged[16 + rng.below(damaged.size() - 16)] ^= static_cast<uint8_t>(1 + rng.below(255));
      } else if (kind == 1) {  // a stream size or block offset pointing anywhere
        const size_t at = 16 + 4 * rng.below(8);
        const uint32_t value = static_cast<uint32_t>(rng.below(2) ? rng.below(damaged.size() + 64) : ~rng.below(64));
        if (at + 4 <= damaged.size()) std::memcpy(damaged.data() + at, &value, 4);
      } else {  // cut short, the header's size kept
        damaged.resize(16 + rng.below(damaged.size() - 16));
      }
      const size_t begin = rng.below(data.size()), end = begin + rng.below(data.size() - begin + 1);
      try {
        decompress_blosc_ranges(damaged.data(), damaged.size(), data.size(), {ByteRange{begin, end, out.data()}});
      } catch (const std::runtime_error& error) {
        ++thrown;
        const std::string message = error.what();
        EXPECT_TRUE(message.find("blosc") != std::string::npos) << message;
      }
    }
  }
  EXPECT_GT(thrown, trials / 4);  // cut frames and most bad offsets; flips in stored streams decode
}

// The result says whether the call checked the whole frame as c-blosc does
// (every lz4 stream decoded to its exact length): the caller then trusts the
// frame, and later calls decode only the prefixes of streams they need.
TEST(Codecs, DecompressBloscRangesSaysWhenItCheckedTheWholeFrame) {
  blosc_set_splitmode(BLOSC_ALWAYS_SPLIT);
  const Bytes data = float_data(6399, 5), large = float_data(40000, 6);
  const Bytes one_block = blosc_compress_bytes(data, 3, BLOSC_SHUFFLE, 4, "lz4");       // annbatch's frames
  const Bytes blocks = blosc_compress_bytes(large, 3, BLOSC_SHUFFLE, 4, "lz4", 16384);  // x typesize: 64 KiB
  blosc_set_splitmode(BLOSC_FORWARD_COMPAT_SPLIT);
  ASSERT_EQ(read_le32(one_block.data() + 8), data.size());
  ASSERT_EQ(read_le32(blocks.data() + 8), 65536u);  // 3 blocks
  Bytes out(large.size());
  const auto call = [&](const Bytes& frame, size_t size, size_t begin, size_t end, bool trusted) {
    return decompress_blosc_ranges(frame.data(), frame.size(), size, {ByteRange{begin, end, out.data()}}, trusted);
  };
  EXPECT_TRUE(call(one_block, data.size(), 0, 400, false));             // every plane of its block decoded whole
  EXPECT_FALSE(call(one_block, data.size(), 0, 400, true));             // trusted: each plane's first 100 bytes
  EXPECT_TRUE(call(one_block, data.size(), 24000, data.size(), true));  // a tail needs every plane whole
  EXPECT_FALSE(call(one_block, data.size(), 10, 10, false));            // nothing wanted: the header checked
  EXPECT_FALSE(call(blocks, large.size(), 0, 400, false));              // two blocks left unchecked
  EXPECT_TRUE(call(blocks, large.size(), 65000, 140000, false));        // a range in each block
  EXPECT_TRUE(call(blocks, large.size(), 0, 135000, false));            // untrusted: every plane of the 3 blocks
  EXPECT_TRUE(std::equal(out.begin(), out.begin() + 135000, large.begin()));
  EXPECT_FALSE(call(blocks, large.size(), 0, 135000, true));  // trusted: the last block's planes as far as needed
  EXPECT_TRUE(call(blocks, large.size(), 0, 150000, true));   // 7/8 or more: c-blosc's whole decode
  EXPECT_TRUE(std::equal(out.begin(), out.begin() + 150000, large.begin()));
  const Bytes stored = blosc_compress_bytes(data, 0, BLOSC_SHUFFLE, 4, "lz4");
  EXPECT_TRUE(call(stored, data.size(), 0, 400, false));  // no lz4 stream to check
  EXPECT_TRUE(std::equal(out.begin(), out.begin() + 400, data.begin()));
}

// A frame whose lz4 stream is damaged past the rows a read needs: c-blosc
// refuses it, so must an untrusted call (however few bytes it wants); only a
// caller that trusts the frame (it checked these bytes before) skips the check.
TEST(Codecs, DecompressBloscRangesRefusesDamageBeyondTheRangesUntilTrusted) {
  // Values in [1, 2) (exponent byte 0x3f: one lz4 match) then in [1, 4) at
  // random (0x3f or 0x40: many short sequences, where the damage goes).
  Bytes data = float_data(6399, 7);
  Rng rng(7);
  for (size_t i = 3200; i < 6399; ++i) data[4 * i + 3] = rng.below(2) ? 0x3f : 0x40;
  blosc_set_splitmode(BLOSC_ALWAYS_SPLIT);
  const Bytes packed = blosc_compress_bytes(data, 3, BLOSC_SHUFFLE, 4, "lz4");
  blosc_set_splitmode(BLOSC_FORWARD_COMPAT_SPLIT);
  Bytes head(256);
  const auto read_head = [&](const Bytes& frame, bool trusted) {
    decompress_blosc_ranges(frame.data(), frame.size(), data.size(), {ByteRange{0, head.size(), head.data()}}, trusted);
    return std::equal(head.begin(), head.end(), data.begin());
  };
  size_t found = 0;
  for (size_t at = packed.size() - 1; at > packed.size() - 64; --at) {  // the last stream's tail
    Bytes damaged = packed;
    damaged[at] ^= 0x40;
    Bytes whole(data.size());
    try {
      decompress_blosc(damaged.data(), damaged.size(), whole.data(), whole.size());
      continue;  // still decodes (a flipped literal): nothing to refuse
    } catch (const std::runtime_error&) {
    }
    ++found;
    EXPECT_THROW(read_head(damaged, false), std::runtime_error) << "byte " << at;
    bool head_intact = false;
    EXPECT_NO_THROW(head_intact = read_head(damaged, true)) << "byte " << at;  // damage past the prefix
    EXPECT_TRUE(head_intact) << "byte " << at;
  }
  EXPECT_GT(found, 0u);
}

TEST(Codecs, DecompressBloscRangesChecksTheFrameFirst) {
  const Bytes data = float_data(1024, 2);
  const Bytes packed = blosc_compress_bytes(data, 5, BLOSC_SHUFFLE, 4, "lz4");
  Bytes out(4096);
  const std::vector<ByteRange> ranges = {ByteRange{0, 16, out.data()}};
  EXPECT_THROW(decompress_blosc_ranges(packed.data(), packed.size(), 4097, ranges), std::runtime_error);
  EXPECT_THROW(decompress_blosc_ranges(packed.data(), packed.size() - 1, 4096, ranges), std::runtime_error);
  Bytes zero_typesize = packed;
  zero_typesize[3] = 0;
  EXPECT_THROW(decompress_blosc_ranges(zero_typesize.data(), zero_typesize.size(), 4096, ranges), std::runtime_error);
  EXPECT_THROW(decompress_blosc(zero_typesize.data(), zero_typesize.size(), out.data(), 4096), std::runtime_error);
  EXPECT_THROW(decompress_blosc_ranges(packed.data(), packed.size(), 4096, {ByteRange{10, 4097, out.data()}}),
               std::logic_error);
}

// -------------------------------------------------------- byte transforms

// HDF5's shuffle: byte k of element i goes to k * n + i; a partial element at
// the end stays put.
Bytes reference_shuffle(const Bytes& data, size_t element_size) {
  Bytes out = data;
  const size_t n = data.size() / element_size;
  for (size_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < element_size; ++k) out[k * n + i] = data[i * element_size + k];
  }
  return out;
}

TEST(Codecs, UnshuffleInvertsHdf5ShuffleForEveryElementSizeAndOddLength) {
  for (size_t element_size = 1; element_size <= 20; ++element_size) {
    for (size_t size : {size_t{0}, size_t{1}, element_size - 1, element_size, element_size + 1, 3 * element_size + 2,
                        size_t{1000}, size_t{4099}, 64 * element_size}) {
      const Bytes data = sample_data(size, size * 31 + element_size);
      const Bytes shuffled = reference_shuffle(data, element_size);
      Bytes out(size, 0xcd);
      unshuffle(shuffled.data(), size, element_size, out.data());
      EXPECT_EQ(out, data) << "element size " << element_size << " size " << size;
    }
  }
}

TEST(Codecs, UnshuffleWithElementSizeZeroOrOneCopies) {
  const Bytes data = sample_data(333, 15);
  for (size_t element_size : {0, 1}) {
    Bytes out(data.size());
    unshuffle(data.data(), data.size(), element_size, out.data());
    EXPECT_EQ(out, data);
  }
  unshuffle(nullptr, 0, 4, nullptr);  // nothing to do, nothing touched
}

uint32_t reference_crc32c(const uint8_t* data, size_t size) {
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < size; ++i) {
    crc ^= data[i];
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

TEST(Codecs, Crc32cMatchesTheCheckValueAndRfc3720Vectors) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32c(reinterpret_cast<const uint8_t*>(check.data()), check.size()), 0xE3069283u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
  Bytes zeros(32, 0), ones(32, 0xff), up(32), down(32);
  for (size_t i = 0; i < 32; ++i) {
    up[i] = static_cast<uint8_t>(i);
    down[i] = static_cast<uint8_t>(31 - i);
  }
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(up.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down.data(), 32), 0x113FDB5Cu);
}

TEST(Codecs, Crc32cMatchesABitwiseReferenceAtEveryLengthAndAlignment) {
  const Bytes data = sample_data(4096, 16);
  for (size_t offset = 0; offset < 9; ++offset) {
    for (size_t size = 0; size + offset <= 300; ++size) {
      const uint32_t expected = reference_crc32c(data.data() + offset, size);
      ASSERT_EQ(crc32c(data.data() + offset, size), expected) << offset << " " << size;
      ASSERT_EQ(crc32c_portable(data.data() + offset, size), expected) << offset << " " << size;
    }
  }
  EXPECT_EQ(crc32c(data.data() + 1, 4095), reference_crc32c(data.data() + 1, 4095));
  EXPECT_EQ(crc32c_portable(data.data() + 1, 4095), reference_crc32c(data.data() + 1, 4095));
}

TEST(Codecs, Crc32cOfLargeInputsInThreeStreamsMatchesTheReference) {
  // 3 x 32 KiB and more go three streams at once: rounds, a remainder, every alignment.
  const Bytes data = sample_data((3 << 16) + 4099, 16);
  for (size_t offset : {0, 1, 5}) {
    for (size_t size :
         {size_t{3} << 15, (size_t{3} << 15) - 1, (size_t{3} << 15) + 13, size_t{3} << 16, data.size() - offset}) {
      const uint32_t expected = reference_crc32c(data.data() + offset, size);
      ASSERT_EQ(crc32c(data.data() + offset, size), expected) << offset << " " << size;
      ASSERT_EQ(crc32c_portable(data.data() + offset, size), expected) << offset << " " << size;
    }
  }
}

TEST(Codecs, Crc32cTakenInPiecesOrJoinedIsTheWholesCrc) {
  const Bytes data = sample_data((3 << 16) + 777, 16);
  const uint32_t whole = reference_crc32c(data.data(), data.size());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{100000}, data.size() - 1, data.size()}) {
    const uint8_t* tail = data.data() + cut;
    const size_t tail_size = data.size() - cut;
    EXPECT_EQ(crc32c_extend(crc32c(data.data(), cut), tail, tail_size), whole) << cut;
    EXPECT_EQ(crc32c_portable(crc32c_portable(data.data(), cut), tail, tail_size), whole) << cut;
    EXPECT_EQ(crc32c_combine(crc32c(data.data(), cut), crc32c(tail, tail_size), tail_size), whole) << cut;
  }
  // Many pieces, as a download's parts arrive in pieces each.
  uint32_t joined = 0;
  for (size_t at = 0; at < data.size(); at += 10007) {
    const size_t size = std::min<size_t>(10007, data.size() - at);
    uint32_t part = 0;
    for (size_t piece = 0; piece < size; piece += 999) {
      part = crc32c_extend(part, data.data() + at + piece, std::min<size_t>(999, size - piece));
    }
    joined = at == 0 ? part : crc32c_combine(joined, part, size);
  }
  EXPECT_EQ(joined, whole);
}

TEST(Codecs, ByteswapReversesEachElement) {
  for (size_t unit : {1, 2, 3, 4, 8, 16}) {
    const size_t count = 37;
    const Bytes data = sample_data(unit * count + 1, unit);
    Bytes swapped = data;
    byteswap(swapped.data() + 1, count, unit);  // unaligned on purpose
    for (size_t i = 0; i < count; ++i) {
      for (size_t k = 0; k < unit; ++k) {
        ASSERT_EQ(swapped[1 + i * unit + k], data[1 + i * unit + unit - 1 - k]) << unit << " " << i << " " << k;
      }
    }
    EXPECT_EQ(swapped[0], data[0]);
    byteswap(swapped.data() + 1, count, unit);
    EXPECT_EQ(swapped, data) << unit;
  }
  const uint32_t word = 0x11223344;
  uint8_t bytes[4];
  std::memcpy(bytes, &word, 4);
  byteswap(bytes, 1, 4);
  uint32_t swapped;
  std::memcpy(&swapped, bytes, 4);
  EXPECT_EQ(swapped, 0x44332211u);
  byteswap(nullptr, 0, 8);
}

// ---------------------------------------------------------------- fuzzing

// Decodes a heap copy of exactly in_size bytes into a buffer of exactly
// out_size bytes (so ASan flags any access outside either). A normal return
// must have written every output byte: decoding again over different fill
// must give the same bytes. Returns whether it decoded.
bool decode_or_throw(Decoder decoder, const uint8_t* in, size_t in_size, size_t out_size, bool null_if_empty = false) {
  std::unique_ptr<uint8_t[]> input(in_size || !null_if_empty ? new uint8_t[in_size] : nullptr);
  if (in_size) std::memcpy(input.get(), in, in_size);
  std::unique_ptr<uint8_t[]> first(new uint8_t[out_size]);
  std::memset(first.get(), 0x00, out_size);
  try {
    decoder(input.get(), in_size, first.get(), out_size);
  } catch (const std::exception&) {
    return false;
  }
  std::unique_ptr<uint8_t[]> second(new uint8_t[out_size]);
  std::memset(second.get(), 0xff, out_size);
  decoder(input.get(), in_size, second.get(), out_size);
  EXPECT_EQ(std::memcmp(first.get(), second.get(), out_size), 0) << "output bytes left unwritten";
  return true;
}

struct FuzzStats {
  size_t runs = 0;
  size_t decoded = 0;
};

// Feeds every corruption of `valid` to the decoder: truncations (every
// prefix of small inputs), random byte flips (half of them in the first 32
// bytes, where headers are), every bit of the header, huge, negative and zero
// 32/64-bit values over header and trailer fields and at random offsets,
// junk appended, garbage behind the real header, and pure garbage. Mostly
// with the right out_size, sometimes a wrong one.
void fuzz(Decoder decoder, const Bytes& valid, size_t out_size, uint64_t seed, FuzzStats& stats) {
  Rng rng(seed);
  auto run = [&](const Bytes& input) {
    ++stats.runs;
    stats.decoded += decode_or_throw(decoder, input.data(), input.size(), out_size);
    if (rng.below(8) == 0) {
      const size_t sizes[] = {0, out_size + 1, out_size ? out_size - 1 : 3, 2 * out_size + 16};
      decode_or_throw(decoder, input.data(), input.size(), sizes[rng.below(4)]);
    }
  };
  const size_t n = valid.size();
  if (n <= 3000) {
    for (size_t length = 0; length < n; ++length) run(Bytes(valid.begin(), valid.begin() + length));
  } else {
    for (int i = 0; i < 1000; ++i) {
      const size_t length = rng.below(n);
      run(Bytes(valid.begin(), valid.begin() + length));
    }
  }
  for (int i = 0; i < 1500; ++i) {
    Bytes input = valid;
    const size_t flips = 1 + rng.below(4);
    for (size_t f = 0; f < flips && n > 0; ++f) {
      const size_t at = rng.below(2) ? rng.below(std::min<size_t>(n, 32)) : rng.below(n);
      input[at] ^= static_cast<uint8_t>(1 + rng.below(255));
    }
    run(input);
  }
  for (size_t bit = 0; bit < 8 * std::min<size_t>(n, 32); ++bit) {
    Bytes input = valid;
    input[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    run(input);
  }
  const uint64_t kValues[] = {0, ~uint64_t{0}, 0x7fffffff, 0x80000000, 0xffffffff, 0x7fffffffffffffff, 0x10000};
  auto write_value = [&](size_t at, uint64_t value, size_t width) {
    Bytes input = valid;
    for (size_t b = 0; b < width && at + b < n; ++b) input[at + b] = static_cast<uint8_t>(value >> (8 * b));
    run(input);
  };
  for (size_t at = 0; at < n; ++at) {
    if (at >= 24 && at + 8 < n) at = n - 8;  // header fields, then the trailer
    for (uint64_t value : kValues) write_value(at, value, 4);
    if (at % 4 == 0) write_value(at, kValues[rng.below(7)], 8);
  }
  for (int i = 0; i < 200 && n > 0; ++i) write_value(rng.below(n), kValues[rng.below(7)], 4);
  for (int i = 0; i < 20; ++i) {
    Bytes input = valid;
    for (size_t extra = 1 + rng.below(40); extra > 0; --extra) input.push_back(rng.byte());
    run(input);
  }
  for (int i = 0; i < 200; ++i) {
    Bytes input(std::min<size_t>(n, 16));
    std::copy(valid.begin(), valid.begin() + static_cast<std::ptrdiff_t>(input.size()), input.begin());
    for (size_t extra = rng.below(600); extra > 0; --extra) input.push_back(rng.byte());
    run(input);
    Bytes garbage(rng.below(600));
    for (uint8_t& byte : garbage) byte = rng.byte();
    run(garbage);
  }
  // Empty input, as a null and as a valid pointer.
  for (size_t size : {size_t{0}, size_t{1}, out_size}) {
    EXPECT_FALSE(decode_or_throw(decoder, nullptr, 0, size, /*null_if_empty=*/true) && size != 0);
    decode_or_throw(decoder, data_or_dummy({}), 0, size);
  }
}

TEST(Codecs, FuzzInflateZlibThrowsOrDecodesExactly) {
  FuzzStats stats;
  uint64_t seed = 100;
  for (size_t size : {0, 1, 600, 3000, 40000}) {
    const Bytes data = sample_data(size, seed);
    fuzz(inflate_zlib, zlib_compress_at(data, 6), size, ++seed, stats);
    fuzz(inflate_zlib, zlib_compress_at(data, 0), size, ++seed, stats);
  }
  EXPECT_GT(stats.runs, 20000u);
  EXPECT_GT(stats.decoded, 0u);
}

TEST(Codecs, FuzzInflateGzipThrowsOrDecodesExactly) {
  FuzzStats stats;
  uint64_t seed = 200;
  for (size_t size : {0, 1, 600, 3000, 40000}) {
    const Bytes data = sample_data(size, seed);
    fuzz(inflate_gzip, gzip_compress_at(data, 6), size, ++seed, stats);
  }
  const Bytes a = sample_data(700, 1), b = sample_data(500, 2);
  fuzz(inflate_gzip, concat_bytes(gzip_compress_at(a, 6), gzip_compress_at(b, 6)), a.size() + b.size(), ++seed, stats);
  EXPECT_GT(stats.runs, 15000u);
  EXPECT_GT(stats.decoded, 0u);
}

TEST(Codecs, FuzzDecompressZstdThrowsOrDecodesExactly) {
  FuzzStats stats;
  uint64_t seed = 300;
  for (size_t size : {0, 1, 600, 3000, 40000}) {
    const Bytes data = sample_data(size, seed);
    fuzz(decompress_zstd, zstd_compress_at(data, 3), size, ++seed, stats);
    fuzz(decompress_zstd, zstd_compress_streaming(data, 1, true), size, ++seed, stats);
  }
  const Bytes a = sample_data(900, 3), b = sample_data(400, 4);
  fuzz(decompress_zstd, concat_bytes(zstd_compress_at(a, 19), zstd_compress_streaming(b, 3, false)),
       a.size() + b.size(), ++seed, stats);
  EXPECT_GT(stats.runs, 20000u);
  EXPECT_GT(stats.decoded, 0u);
}

TEST(Codecs, FuzzDecompressBloscThrowsOrDecodesExactly) {
  FuzzStats stats;
  uint64_t seed = 400;
  const Bytes data = sample_data(3001, seed);
  for (const std::string& compressor : blosc_compressors()) {
    for (int shuffle : kShuffles) {
      // Small blocks: a table of block starts, split streams and a leftover block to corrupt.
      const size_t typesize = shuffle == BLOSC_NOSHUFFLE ? 2 : 4;
      fuzz(decompress_blosc, blosc_compress_bytes(data, 5, shuffle, typesize, compressor, 512), data.size(), ++seed,
           stats);
    }
  }
  fuzz(decompress_blosc, blosc_compress_bytes(data, 0, BLOSC_SHUFFLE, 8, "lz4"), data.size(), ++seed, stats);
  fuzz(decompress_blosc, blosc_compress_bytes(Bytes{}, 5, BLOSC_SHUFFLE, 8, "lz4"), 0, ++seed, stats);
  EXPECT_GT(stats.runs, 50000u);
  EXPECT_GT(stats.decoded, 0u);
}

TEST(Codecs, FuzzDecompressLzfThrowsOrDecodesExactly) {
  FuzzStats stats;
  uint64_t seed = 450;
  for (size_t size : {0, 1, 600, 3000, 40000}) {
    const Bytes data = sample_data(size, seed);
    fuzz(decompress_lzf, lzf_compress(data), size, ++seed, stats);
  }
  EXPECT_GT(stats.runs, 15000u);
  EXPECT_GT(stats.decoded, 0u);
}

TEST(Codecs, FuzzDecodersOnHandMadeHeadersWithHugeSizes) {
  // zstd: a frame header claiming 2^63 bytes of content (8-byte FCS field).
  const Bytes zstd_huge = {0x28, 0xb5, 0x2f, 0xfd, 0xe0, 0, 0, 0, 0, 0, 0, 0, 0x80, 1, 0, 0};
  EXPECT_FALSE(decode_or_throw(decompress_zstd, zstd_huge.data(), zstd_huge.size(), 4096));
  // blosc: a frame that says 2^31 - 17 bytes in, or a block size of 2 GiB.
  Bytes blosc = blosc_compress_bytes(sample_data(4096, 17), 5, BLOSC_SHUFFLE, 4, "lz4");
  for (size_t field : {4, 8, 12}) {
    for (uint32_t value : {0x7fffffefu, 0x7fffffffu, 0x80000000u, 0xffffffffu, 0u}) {
      Bytes input = blosc;
      std::memcpy(input.data() + field, &value, 4);  // little-endian host
      EXPECT_FALSE(decode_or_throw(decompress_blosc, input.data(), input.size(), 4096)) << field << " " << value;
    }
  }
  // gzip: ISIZE and a header with FEXTRA claiming 65535 bytes of extra field.
  const Bytes gzip_extra = {0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 3, 0xff, 0xff, 1, 2, 3};
  EXPECT_FALSE(decode_or_throw(inflate_gzip, gzip_extra.data(), gzip_extra.size(), 10));
}

// ---------------------------------------------------- sizes before allocating

TEST(Codecs, DecodedSizeIsWhatTheFrameRecordsOrWhatItCanReach) {
  const Bytes data = sample_data(10000, 21);
  const Bytes zstd = zstd_compress_at(data, 3);
  EXPECT_EQ(decoded_size(Codec::kZstd, zstd.data(), zstd.size()).size, 10000u);
  EXPECT_TRUE(decoded_size(Codec::kZstd, zstd.data(), zstd.size()).exact);
  EXPECT_NO_THROW(check_decoded_size(Codec::kZstd, zstd.data(), zstd.size(), 10000));
  EXPECT_THROW(check_decoded_size(Codec::kZstd, zstd.data(), zstd.size(), 10001), std::runtime_error);
  const Bytes blosc = blosc_compress_bytes(data, 5, BLOSC_SHUFFLE, 4, "lz4");
  EXPECT_EQ(decoded_size(Codec::kBlosc, blosc.data(), blosc.size()).size, 10000u);
  EXPECT_THROW(check_decoded_size(Codec::kBlosc, blosc.data(), blosc.size(), size_t{1} << 40), std::runtime_error);
  // A blosc header claiming more compressed bytes than there are.
  EXPECT_THROW(decoded_size(Codec::kBlosc, blosc.data(), blosc.size() - 1), std::runtime_error);
  EXPECT_THROW(decoded_size(Codec::kBlosc, blosc.data(), 15), std::runtime_error);
  // Deflate records nothing: at most 1032:1.
  const Bytes zeros(1 << 20, 0);
  const Bytes deflated = zlib_compress_at(zeros, 9);
  EXPECT_NO_THROW(check_decoded_size(Codec::kZlib, deflated.data(), deflated.size(), zeros.size()));
  EXPECT_THROW(check_decoded_size(Codec::kZlib, deflated.data(), deflated.size(), size_t{1} << 40), std::runtime_error);
  EXPECT_GE(decoded_size(Codec::kGzip, deflated.data(), deflated.size()).size, zeros.size());
  // LZF records nothing: at most 88:1 (a 264-byte match in 3 bytes).
  const Bytes lzf = lzf_compress(zeros);
  EXPECT_NO_THROW(check_decoded_size(Codec::kLzf, lzf.data(), lzf.size(), zeros.size()));
  EXPECT_THROW(check_decoded_size(Codec::kLzf, lzf.data(), lzf.size(), 88 * lzf.size() + 1), std::runtime_error);
  // zstd frames that do not record their size: at most 65536:1.
  ZSTD_CCtx* context = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(context, ZSTD_c_contentSizeFlag, 0);
  Bytes unsized(ZSTD_compressBound(zeros.size()));
  unsized.resize(ZSTD_compress2(context, unsized.data(), unsized.size(), zeros.data(), zeros.size()));
  ZSTD_freeCCtx(context);
  EXPECT_FALSE(decoded_size(Codec::kZstd, unsized.data(), unsized.size()).exact);
  EXPECT_NO_THROW(check_decoded_size(Codec::kZstd, unsized.data(), unsized.size(), zeros.size()));
  EXPECT_THROW(check_decoded_size(Codec::kZstd, unsized.data(), unsized.size(), size_t{1} << 50), std::runtime_error);
}

// Packs values MSB first in `bits` bits each after HDF5's 21-byte scale-offset header.
Bytes scaleoffset_chunk(uint32_t bits, uint64_t minval, const std::vector<uint64_t>& packed) {
  Bytes out(21, 0);
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(bits >> (8 * i));
  out[4] = 8;
  for (int i = 0; i < 8; ++i) out[5 + i] = static_cast<uint8_t>(minval >> (8 * i));
  size_t bit = 0;
  for (uint64_t value : packed) {
    for (uint32_t k = bits; k-- > 0; ++bit) {
      if (out.size() <= 21 + bit / 8) out.push_back(0);
      out[21 + bit / 8] |= static_cast<uint8_t>(((value >> k) & 1) << (7 - bit % 8));
    }
  }
  return out;
}

TEST(Codecs, ScaleOffsetAddsMinvalAndRestoresTheFillValue) {
  ScaleOffsetParameters parameters;
  parameters.count = 5;
  parameters.size = 2;
  parameters.fill_defined = true;
  parameters.fill = 0xfff9;                                        // -7 as int16
  const Bytes chunk = scaleoffset_chunk(3, 100, {0, 5, 7, 1, 6});  // 7 = all three bits: the fill value
  Bytes out(10);
  decode_scaleoffset(chunk.data(), chunk.size(), out.data(), parameters);
  std::vector<int16_t> values(5);
  std::memcpy(values.data(), out.data(), 10);
  EXPECT_EQ(values, (std::vector<int16_t>{100, 105, -7, 101, 106}));
  parameters.big_endian = true;
  decode_scaleoffset(chunk.data(), chunk.size(), out.data(), parameters);
  EXPECT_EQ(out[0], 0);
  EXPECT_EQ(out[1], 100);
}

TEST(Codecs, ScaleOffsetRefusesMoreBitsThanAnElementOrTheChunkHolds) {
  ScaleOffsetParameters parameters;
  parameters.count = 64;
  parameters.size = 4;
  Bytes out(256);
  const Bytes too_wide = scaleoffset_chunk(33, 0, {1});
  EXPECT_THROW(decode_scaleoffset(too_wide.data(), too_wide.size(), out.data(), parameters), std::runtime_error);
  const Bytes short_chunk = scaleoffset_chunk(9, 0, std::vector<uint64_t>(10, 3));  // 10 of 64 values
  EXPECT_THROW(decode_scaleoffset(short_chunk.data(), short_chunk.size(), out.data(), parameters), std::runtime_error);
  const Bytes raw = scaleoffset_chunk(32, 0, {});  // "stored as is" with no values after the header
  EXPECT_THROW(decode_scaleoffset(raw.data(), raw.size(), out.data(), parameters), std::runtime_error);
  EXPECT_THROW(decode_scaleoffset(raw.data(), 20, out.data(), parameters), std::runtime_error);
}

// Manual (about 8.5 GiB of memory and up to a minute): --gtest_also_run_disabled_tests.
// A stored deflate stream above 4 GiB, in and out, to exercise feeding zlib's
// 32-bit counters in pieces.
TEST(Codecs, DISABLED_InflateZlibHandlesBuffersAboveFourGiB) {
  const size_t size = (size_t{1} << 32) + 100000;
  const Bytes block = sample_data(65535, 18);
  const size_t blocks = (size + 65534) / 65535;
  std::unique_ptr<uint8_t[]> in(new uint8_t[2 + blocks * 5 + size + 4]);
  size_t at = 0;
  in[at++] = 0x78;
  in[at++] = 0x01;
  uLong adler = adler32(0, nullptr, 0);
  for (size_t b = 0, left = size; b < blocks; ++b) {
    const size_t length = std::min<size_t>(left, 65535);
    left -= length;
    in[at++] = left == 0 ? 1 : 0;
    in[at++] = static_cast<uint8_t>(length);
    in[at++] = static_cast<uint8_t>(length >> 8);
    in[at++] = static_cast<uint8_t>(~length);
    in[at++] = static_cast<uint8_t>(~length >> 8);
    std::memcpy(in.get() + at, block.data(), length);
    at += length;
    adler = adler32(adler, block.data(), static_cast<uInt>(length));
  }
  for (int shift = 24; shift >= 0; shift -= 8) in[at++] = static_cast<uint8_t>(adler >> shift);
  std::unique_ptr<uint8_t[]> out(new uint8_t[size]);
  inflate_zlib(in.get(), at, out.get(), size);
  for (size_t offset = 0; offset < size; offset += 65535) {
    ASSERT_EQ(std::memcmp(out.get() + offset, block.data(), std::min<size_t>(65535, size - offset)), 0) << offset;
  }
  EXPECT_THROW(inflate_zlib(in.get(), at, out.get(), size - 1), std::runtime_error);
}

}  // namespace
}  // namespace torch_shards::io::codecs
