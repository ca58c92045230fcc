#include "io/codecs.h"

#include <blosc.h>
#include <zlib.h>

// For ZSTD_d_stableOutBuffer, passed through the stable ZSTD_DCtx_setParameter.
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/errors.h"

#ifdef TORCH_SHARDS_CPU_DISPATCH
#include <nmmintrin.h>
#endif

namespace torch_shards::io::codecs {

using core::concat;

namespace {

// ---------------------------------------------------------------- zlib / gzip

// z_stream counts in uInt, so buffers above 4 GiB are fed in pieces.
constexpr size_t kMaxZlibChunk = std::numeric_limits<uInt>::max();

class Inflater {
 public:
  explicit Inflater(int window_bits) {
    const int status = inflateInit2(&stream_, window_bits);
    if (status == Z_MEM_ERROR) throw std::bad_alloc();
    if (status != Z_OK) throw std::runtime_error(concat("cannot start zlib: ", zError(status)));
  }
  ~Inflater() { inflateEnd(&stream_); }
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;

  z_stream& stream() { return stream_; }

 private:
  z_stream stream_{};  // value-initialised: zalloc, zfree and opaque are Z_NULL
};

// Inflates a whole stream into out[0, out_size), which it must fill exactly;
// or, given `grown`, into that vector, grown as the stream needs up to
// max_size bytes and cut to what the stream decoded (out, out_size unused).
void inflate_stream(const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size, bool gzip,
                    std::vector<uint8_t>* grown = nullptr, size_t max_size = 0) {
  const char* format = gzip ? "gzip" : "zlib";
  Inflater inflater(gzip ? 15 + 16 : 15);
  z_stream& stream = inflater.stream();
  uint8_t spare = 0;  // inflate refuses a null next_out even when avail_out is 0
  size_t in_pos = 0;
  size_t out_pos = 0;
  if (grown) {
    grown->clear();
    out = nullptr;
    out_size = 0;
  }
  for (;;) {
    if (grown && out_pos == out_size && out_size < max_size) {
      out_size = std::min(max_size, std::max<size_t>(2 * out_size, 4 * in_size + 4096));
      grown->resize(out_size);
      out = grown->data();
    }
    const size_t in_chunk = std::min(in_size - in_pos, kMaxZlibChunk);
    const size_t out_chunk = std::min(out_size - out_pos, kMaxZlibChunk);
    stream.next_in = const_cast<Bytef*>(in_chunk ? in + in_pos : &spare);
    stream.avail_in = static_cast<uInt>(in_chunk);
    stream.next_out = out_chunk ? out + out_pos : &spare;
    stream.avail_out = static_cast<uInt>(out_chunk);
    const int status = inflate(&stream, Z_NO_FLUSH);
    const size_t consumed = in_chunk - stream.avail_in;
    const size_t produced = out_chunk - stream.avail_out;
    in_pos += consumed;
    out_pos += produced;
    if (status == Z_STREAM_END) {
      // Bytes after a zlib stream are ignored, as HDF5 and Python's zlib do.
      if (!gzip) break;
      // A gzip file may hold several members and be padded with zeros
      // (RFC 1952 section 2.2; Python's gzip, which numcodecs uses, reads both).
      while (in_pos < in_size && in[in_pos] == 0) ++in_pos;
      if (in_pos == in_size) break;
      if (in_size - in_pos < 2 || in[in_pos] != 0x1f || in[in_pos + 1] != 0x8b) {
        throw std::runtime_error(
            concat("gzip stream has ", in_size - in_pos, " unexpected bytes after its end (at offset ", in_pos, ")"));
      }
      inflateReset(&stream);
      continue;
    }
    switch (status) {
      case Z_OK:
      case Z_BUF_ERROR:  // no progress possible: handled below
        break;
      case Z_MEM_ERROR:
        throw std::bad_alloc();
      case Z_NEED_DICT:
        throw std::runtime_error(concat("corrupt ", format, " stream: it needs a preset dictionary"));
      default:
        throw std::runtime_error(concat("corrupt ", format, " stream: ", stream.msg ? stream.msg : zError(status)));
    }
    if (consumed == 0 && produced == 0) {
      if (in_pos == in_size) {
        throw std::runtime_error(concat(format, " stream is truncated: it ends after ", out_pos,
                                        grown ? std::string(" bytes") : concat(" of ", out_size, " bytes")));
      }
      if (out_pos == out_size) {
        throw std::runtime_error(concat(format, " stream decompresses to more than ", out_size, " bytes"));
      }
      throw std::runtime_error(concat("corrupt ", format, " stream: inflate makes no progress"));
    }
  }
  if (grown) {
    grown->resize(out_pos);
    return;
  }
  if (out_pos != out_size) {
    throw std::runtime_error(concat(format, " stream decompressed to ", out_pos, " bytes, expected ", out_size));
  }
}

// ----------------------------------------------------------------------- zstd

struct ZstdDCtxDeleter {
  void operator()(ZSTD_DCtx* dctx) const { ZSTD_freeDCtx(dctx); }
};

using ZstdContext = std::unique_ptr<ZSTD_DCtx, ZstdDCtxDeleter>;

ZstdContext make_zstd_context() {
  ZstdContext context(ZSTD_createDCtx());
  if (!context) throw std::bad_alloc();
  // Decoding straight into the caller's buffer spares the internal window
  // buffer (up to the frame's window size, kept per thread) and a copy; with
  // no window to allocate, frames declaring windows above the streaming
  // default (128 MiB, e.g. zstd --long) are safe to accept.
  if (!ZSTD_isError(ZSTD_DCtx_setParameter(context.get(), ZSTD_d_stableOutBuffer, 1))) {
    ZSTD_DCtx_setParameter(context.get(), ZSTD_d_windowLogMax, ZSTD_WINDOWLOG_MAX);
  }
  return context;
}

}  // namespace

// ---------------------------------------------------------------------- blosc

std::string describe_blosc(const uint8_t* header) {
  size_t typesize = 0;
  int flags = 0;
  blosc_cbuffer_metainfo(header, &typesize, &flags);
  if (flags & BLOSC_MEMCPYED) return concat("blosc frame (stored, typesize ", typesize, ")");
  // Named as numcodecs names them; lz4hc writes the lz4 format.
  const int format = (header[2] & 0xe0) >> 5;
  std::string codec = format == BLOSC_BLOSCLZ_FORMAT  ? "blosclz"
                      : format == BLOSC_LZ4_FORMAT    ? "lz4"
                      : format == BLOSC_SNAPPY_FORMAT ? "snappy"
                      : format == BLOSC_ZLIB_FORMAT   ? "zlib"
                      : format == BLOSC_ZSTD_FORMAT   ? "zstd"
                                                      : concat("unknown compressor ", format);
  const char* shuffle = (flags & BLOSC_DOBITSHUFFLE) ? "bit shuffle"
                        : (flags & BLOSC_DOSHUFFLE)  ? "byte shuffle"
                                                     : "no shuffle";
  return concat("blosc frame (", codec, ", ", shuffle, ", typesize ", typesize, ")");
}

namespace {

// --------------------------------------------------------------------- crc32c

struct Crc32cTables {
  uint32_t table[8][256];
};

// Slicing-by-8 tables: table[k][b] is the CRC of byte b followed by k zeros.
constexpr Crc32cTables make_crc32c_tables() {
  Crc32cTables tables{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    tables.table[0][b] = crc;
  }
  for (int k = 1; k < 8; ++k) {
    for (int b = 0; b < 256; ++b) {
      const uint32_t previous = tables.table[k - 1][b];
      tables.table[k][b] = (previous >> 8) ^ tables.table[0][previous & 0xff];
    }
  }
  return tables;
}

constexpr Crc32cTables kCrc32c = make_crc32c_tables();

// ----------------------------------------------------------- shuffle, swap

template <size_t kElementSize>
void unshuffle_fixed(const uint8_t* in, size_t n, uint8_t* out) {
  for (size_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < kElementSize; ++k) out[i * kElementSize + k] = in[k * n + i];
  }
}

void unshuffle_any(const uint8_t* in, size_t n, size_t element_size, uint8_t* out) {
  for (size_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < element_size; ++k) out[i * element_size + k] = in[k * n + i];
  }
}

template <typename Word>
Word reverse_bytes(Word value) {
  static_assert(sizeof(Word) == 2 || sizeof(Word) == 4 || sizeof(Word) == 8);
#if defined(__GNUC__) || defined(__clang__)
  if constexpr (sizeof(Word) == 2) return __builtin_bswap16(value);
  if constexpr (sizeof(Word) == 4) return __builtin_bswap32(value);
  if constexpr (sizeof(Word) == 8) return __builtin_bswap64(value);
#else
  Word result = 0;
  for (size_t i = 0; i < sizeof(Word); ++i, value >>= 8) result = static_cast<Word>((result << 8) | (value & 0xff));
  return result;
#endif
}

template <typename Word>
void byteswap_words(uint8_t* data, size_t count) {
  for (size_t i = 0; i < count; ++i, data += sizeof(Word)) {
    Word value;
    std::memcpy(&value, data, sizeof(Word));  // memcpy: data need not be aligned
    value = reverse_bytes(value);
    std::memcpy(data, &value, sizeof(Word));
  }
}

}  // namespace

void inflate_zlib(const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size) {
  inflate_stream(in, in_size, out, out_size, /*gzip=*/false);
}

void inflate_gzip(const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size) {
  inflate_stream(in, in_size, out, out_size, /*gzip=*/true);
}

std::vector<uint8_t> inflate_unsized(Codec codec, const uint8_t* in, size_t in_size, size_t max_size) {
  if (codec != Codec::kZlib && codec != Codec::kGzip) throw std::logic_error("inflate_unsized: not zlib or gzip");
  std::vector<uint8_t> out;
  inflate_stream(in, in_size, nullptr, 0, codec == Codec::kGzip, &out, max_size);
  return out;
}

void decompress_lzf(const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size) {
  // Each control byte starts a literal run (below 32: that many bytes plus one follow) or a
  // back-reference (length in its top 3 bits, 7 meaning "plus the next byte", then 2 more; distance:
  // its low 5 bits, then the next byte, plus 1), which may overlap what it copies.
  size_t in_pos = 0, out_pos = 0;
  while (in_pos < in_size) {
    const unsigned control = in[in_pos++];
    if (control < 32) {
      const size_t length = control + 1;
      if (length > in_size - in_pos) {
        throw std::runtime_error(concat("lzf stream is truncated: a literal run of ", length, " bytes at offset ",
                                        in_pos - 1, " has ", in_size - in_pos, " left"));
      }
      if (length > out_size - out_pos) {
        throw std::runtime_error(concat("lzf stream decompresses to more than ", out_size, " bytes"));
      }
      std::memcpy(out + out_pos, in + in_pos, length);
      in_pos += length;
      out_pos += length;
      continue;
    }
    size_t length = control >> 5;
    if (in_pos + (length == 7 ? 2 : 1) > in_size) {
      throw std::runtime_error(concat("lzf stream is truncated: a back-reference at offset ", in_pos - 1));
    }
    if (length == 7) length += in[in_pos++];
    length += 2;
    const size_t distance = ((static_cast<size_t>(control & 0x1f) << 8) | in[in_pos++]) + 1;
    if (distance > out_pos) {
      throw std::runtime_error(concat("corrupt lzf stream: a back-reference ", distance, " bytes back at output byte ",
                                      out_pos, " (offset ", in_pos, ")"));
    }
    if (length > out_size - out_pos) {
      throw std::runtime_error(concat("lzf stream decompresses to more than ", out_size, " bytes"));
    }
    for (size_t k = 0; k < length; ++k, ++out_pos) out[out_pos] = out[out_pos - distance];  // may overlap
  }
  if (out_pos != out_size) {
    throw std::runtime_error(concat("lzf stream decompressed to ", out_pos, " bytes, expected ", out_size));
  }
}

void decompress_zstd(const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size) {
  if (in_size == 0) throw std::runtime_error("zstd data is empty");
  // One context per thread: creating one costs more than decoding a small chunk.
  thread_local ZstdContext context = make_zstd_context();
  ZSTD_DCtx* dctx = context.get();
  ZSTD_DCtx_reset(dctx, ZSTD_reset_session_only);  // a previous call may have failed mid-frame
  uint8_t spare = 0;                               // zstd wants a valid pointer even for 0 bytes
  ZSTD_outBuffer output{out_size ? out : &spare, out_size, 0};
  ZSTD_inBuffer input{in, in_size, 0};
  for (;;) {
    const size_t in_before = input.pos;
    const size_t out_before = output.pos;
    const size_t status = ZSTD_decompressStream(dctx, &output, &input);
    if (ZSTD_isError(status)) {
      if (ZSTD_getErrorCode(status) == ZSTD_error_dstSize_tooSmall) {
        throw std::runtime_error(concat("zstd data decompresses to more than ", out_size, " bytes"));
      }
      throw std::runtime_error(concat("corrupt zstd data: ", ZSTD_getErrorName(status)));
    }
    // 0: a frame ended and everything decoded was written; more input is another frame.
    if (status == 0 && input.pos == input.size) break;
    if (input.pos == in_before && output.pos == out_before) {
      if (input.pos == input.size) {
        throw std::runtime_error(
            concat("zstd data is truncated: it ends after ", output.pos, " of ", out_size, " bytes"));
      }
      if (output.pos == output.size) {
        throw std::runtime_error(concat("zstd data decompresses to more than ", out_size, " bytes"));
      }
      throw std::runtime_error("corrupt zstd data: decoding makes no progress");
    }
  }
  if (output.pos != out_size) {
    throw std::runtime_error(concat("zstd data decompressed to ", output.pos, " bytes, expected ", out_size));
  }
}

void check_blosc_frame(const uint8_t* in, size_t in_size, size_t out_size) {
  if (in_size < BLOSC_MIN_HEADER_LENGTH) {
    throw std::runtime_error(
        concat("blosc frame is ", in_size, " bytes, shorter than its ", BLOSC_MIN_HEADER_LENGTH, "-byte header"));
  }
  if (in[0] != BLOSC_VERSION_FORMAT) {
    throw std::runtime_error(
        concat("unsupported blosc format version ", int{in[0]}, " (expected ", BLOSC_VERSION_FORMAT, ")"));
  }
  const auto what = [&] { return describe_blosc(in); };  // for messages only: no allocation per chunk
  const uint32_t nbytes = read_le32(in + 4);
  const uint32_t cbytes = read_le32(in + 12);
  constexpr uint32_t kMaxBytes = BLOSC_MAX_BUFFERSIZE;
  if (nbytes > kMaxBytes || cbytes > kMaxBytes + BLOSC_MAX_OVERHEAD || cbytes < BLOSC_MIN_HEADER_LENGTH) {
    throw std::runtime_error(
        concat(what(), " has an invalid header (", nbytes, " bytes compressed to ", cbytes, " bytes)"));
  }
  if (cbytes > in_size) {
    throw std::runtime_error(
        concat(what(), " is truncated: its header says ", cbytes, " bytes but only ", in_size, " are present"));
  }
  // What c-blosc's decoder requires of a non-empty frame, checked here for
  // every decoder of blosc frames (decompress_blosc_ranges too).
  const uint32_t blocksize = read_le32(in + 8);
  if (nbytes > 0) {
    if (in[3] == 0 || blocksize == 0 || blocksize > nbytes || blocksize > BLOSC_MAX_BLOCKSIZE) {
      throw std::runtime_error(concat(what(), " has an invalid header (typesize ", int{in[3]}, ", blocks of ",
                                      blocksize, " bytes for ", nbytes, ")"));
    }
    if (in[2] & 0x08) throw std::runtime_error(concat(what(), " has flags from a later blosc (", int{in[2]}, ")"));
    if ((in[2] & BLOSC_MEMCPYED) && cbytes != nbytes + BLOSC_MAX_OVERHEAD) {
      throw std::runtime_error(concat(what(), " stores ", cbytes, " bytes for ", nbytes));
    }
    const uint32_t blocks = nbytes / blocksize + (nbytes % blocksize != 0);
    if (!(in[2] & BLOSC_MEMCPYED) && blocks > (cbytes - BLOSC_MIN_HEADER_LENGTH) / 4) {
      throw std::runtime_error(concat(what(), ": ", blocks, " block offsets do not fit in ", cbytes, " bytes"));
    }
  }
  size_t validated_nbytes = 0;
  if (blosc_cbuffer_validate(in, cbytes, &validated_nbytes) != 0 || validated_nbytes != nbytes) {
    throw std::runtime_error(concat(what(), " has an invalid header"));
  }
  if (nbytes != out_size) {
    throw std::runtime_error(concat(what(), " decompresses to ", nbytes, " bytes, expected ", out_size));
  }
}

void decompress_blosc(const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size) {
  // blosc_decompress_ctx trusts the header's sizes (it is not told in_size),
  // so everything it relies on is checked first.
  check_blosc_frame(in, in_size, out_size);
  if (out_size == 0) return;
  const auto what = [&] { return describe_blosc(in); };
  // The _ctx variant keeps no global state (thread-safe); one internal thread
  // because callers already decode chunks in parallel.
  const int result = blosc_decompress_ctx(in, out, out_size, /*numinternalthreads=*/1);
  if (result == -5) throw std::runtime_error(concat(what(), ": this libblosc cannot decode that compressor"));
  if (result < 0) throw std::runtime_error(concat("corrupt ", what(), " (blosc error ", result, ")"));
  if (static_cast<size_t>(result) != out_size) {
    throw std::runtime_error(concat(what(), " decompressed to ", result, " bytes, expected ", out_size));
  }
}

void decode_scaleoffset(const uint8_t* in, size_t in_size, uint8_t* out, const ScaleOffsetParameters& parameters) {
  constexpr size_t kHeader = 21;  // minbits, minval size, minval (16 bytes reserved)
  const size_t size = parameters.size, count = parameters.count;
  if (size != 1 && size != 2 && size != 4 && size != 8) {
    throw std::runtime_error(concat("scale-offset data of ", size, "-byte elements"));
  }
  if (in_size < kHeader) {
    throw std::runtime_error(concat("scale-offset chunk of ", in_size, " bytes, shorter than its 21-byte header"));
  }
  const uint32_t minbits = read_le32(in);
  const size_t minval_size = std::min<size_t>(in[4], 8);
  uint64_t minval = 0;
  for (size_t i = 0; i < minval_size; ++i) minval |= static_cast<uint64_t>(in[5 + i]) << (8 * i);
  const size_t width = 8 * size;
  if (minbits > width) {
    throw std::runtime_error(concat("scale-offset chunk packs ", minbits, " bits into ", width, "-bit elements"));
  }
  const uint8_t* packed = in + kHeader;
  const size_t available = in_size - kHeader;
  const auto store = [&](size_t i, uint64_t value) {
    for (size_t b = 0; b < size; ++b) {
      const size_t byte = parameters.big_endian ? size - 1 - b : b;
      out[i * size + byte] = static_cast<uint8_t>(value >> (8 * b));
    }
  };
  if (minbits == width) {  // stored as they are, in the writer's (little-endian) order
    if (available < count * size) {
      throw std::runtime_error(concat("scale-offset chunk holds ", available, " bytes of ", count * size));
    }
    for (size_t i = 0; i < count; ++i) {
      uint64_t value = 0;
      for (size_t b = 0; b < size; ++b) value |= static_cast<uint64_t>(packed[i * size + b]) << (8 * b);
      store(i, value);
    }
    return;
  }
  if (count != 0 && minbits != 0 && (available * 8) / minbits < count) {
    throw std::runtime_error(
        concat("scale-offset chunk holds ", available, " bytes, too few for ", count, " values of ", minbits, " bits"));
  }
  const uint64_t mask = width == 64 ? ~uint64_t{0} : (uint64_t{1} << width) - 1;
  const uint64_t all_ones = minbits == 64 ? ~uint64_t{0} : (uint64_t{1} << minbits) - 1;
  size_t bit = 0;
  for (size_t i = 0; i < count; ++i) {
    uint64_t value = 0;
    for (uint32_t k = 0; k < minbits; ++k, ++bit) {
      value = value << 1 | ((packed[bit / 8] >> (7 - bit % 8)) & 1);
    }
    store(i, parameters.fill_defined && value == all_ones ? parameters.fill : (value + minval) & mask);
  }
}

const char* codec_name(Codec codec) {
  switch (codec) {
    case Codec::kZlib:
      return "zlib";
    case Codec::kGzip:
      return "gzip";
    case Codec::kZstd:
      return "zstd";
    case Codec::kBlosc:
      return "blosc";
    case Codec::kLzf:
      return "lzf";
  }
  return "?";
}

DecodedSize decoded_size(Codec codec, const uint8_t* in, size_t in_size) {
  // Deflate's longest match (258 bytes) costs at least two bits: 1032:1. LZF's (264 bytes) costs three.
  constexpr uint64_t kDeflateRatio = 1032, kZstdRatio = 65536, kLzfRatio = 88, kSlack = 1 << 16;
  switch (codec) {
    case Codec::kLzf:
      return {static_cast<uint64_t>(in_size) * kLzfRatio, false};
    case Codec::kZlib:
    case Codec::kGzip:
      return {static_cast<uint64_t>(in_size) * kDeflateRatio + kSlack, false};
    case Codec::kZstd: {
      const unsigned long long size = in_size == 0 ? ZSTD_CONTENTSIZE_ERROR : ZSTD_findDecompressedSize(in, in_size);
      if (size == ZSTD_CONTENTSIZE_ERROR) throw std::runtime_error("invalid zstd frame");
      if (size != ZSTD_CONTENTSIZE_UNKNOWN) return {static_cast<uint64_t>(size), true};
      return {static_cast<uint64_t>(in_size) * kZstdRatio + kSlack, false};
    }
    case Codec::kBlosc: {
      if (in_size < BLOSC_MIN_HEADER_LENGTH) {
        throw std::runtime_error(
            concat("blosc frame is ", in_size, " bytes, shorter than its ", BLOSC_MIN_HEADER_LENGTH, "-byte header"));
      }
      const uint32_t nbytes = read_le32(in + 4), cbytes = read_le32(in + 12);
      size_t validated = 0;
      if (in[0] != BLOSC_VERSION_FORMAT || cbytes > in_size || cbytes < BLOSC_MIN_HEADER_LENGTH ||
          blosc_cbuffer_validate(in, cbytes, &validated) != 0 || validated != nbytes) {
        throw std::runtime_error(concat("invalid blosc header (", nbytes, " bytes compressed to ", cbytes, " bytes, ",
                                        in_size, " present)"));
      }
      return {nbytes, true};
    }
  }
  throw std::logic_error("unknown codec");
}

void check_decoded_size(Codec codec, const uint8_t* in, size_t in_size, size_t out_size) {
  const DecodedSize size = decoded_size(codec, in, in_size);
  if (size.exact && size.size != out_size) {
    throw std::runtime_error(
        concat(codec_name(codec), " data decompresses to ", size.size, " bytes, expected ", out_size));
  }
  if (!size.exact && out_size > size.size) {
    throw std::runtime_error(
        concat(in_size, " bytes of ", codec_name(codec), " data cannot decompress to ", out_size, " bytes"));
  }
}

void unshuffle(const uint8_t* in, size_t size, size_t element_size, uint8_t* out) {
  if (size == 0) return;  // in and out may be null
  const size_t n = element_size > 1 ? size / element_size : 0;
  if (n == 0) {  // element_size <= 1, or fewer bytes than one element: nothing was shuffled
    std::memcpy(out, in, size);
    return;
  }
  switch (element_size) {
    case 2:
      unshuffle_fixed<2>(in, n, out);
      break;
    case 4:
      unshuffle_fixed<4>(in, n, out);
      break;
    case 8:
      unshuffle_fixed<8>(in, n, out);
      break;
    case 16:
      unshuffle_fixed<16>(in, n, out);
      break;
    default:
      unshuffle_any(in, n, element_size, out);
  }
  const size_t body = n * element_size;
  if (body < size) std::memcpy(out + body, in + body, size - body);
}

namespace {

constexpr uint32_t kCrc32cPolynomial = 0x82F63B78u;  // reflected: x^0 in the top bit

// a * b modulo the CRC's polynomial, both in its reflected bit order.
uint32_t multiply_modulo(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t bit = 1u << 31; bit != 0; bit >>= 1) {
    if ((a & bit) != 0) product ^= b;
    b = (b & 1u) != 0 ? (b >> 1) ^ kCrc32cPolynomial : b >> 1;
  }
  return product;
}

// x^(8 * bytes) modulo the polynomial: multiplying a CRC by it moves the CRC past `bytes` bytes.
uint32_t shift_past(uint64_t bytes) {
  uint32_t result = 1u << 31;  // x^0
  uint32_t power = 1u << 23;   // x^8, then x^16, x^32, ...
  for (; bytes != 0; bytes >>= 1) {
    if ((bytes & 1u) != 0) result = multiply_modulo(power, result);
    power = multiply_modulo(power, power);
  }
  return result;
}

}  // namespace

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t size_b) {
  return multiply_modulo(shift_past(size_b), crc_a) ^ crc_b;
}

#ifdef TORCH_SHARDS_CPU_DISPATCH
// Eight bytes per instruction, little-endian words as the tables take bytes. Large inputs in three
// streams at once (the instruction takes 3 cycles and can start every cycle), joined as
// crc32c_combine joins CRCs: about 3x one stream.
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(uint32_t crc, const uint8_t* data, size_t size) {
  constexpr size_t kStream = 32 << 10;
  if (size >= 3 * kStream) {
    static const uint32_t stream_shift = shift_past(kStream);
    do {
      uint64_t a = ~crc, b = 0xffffffffu, c = 0xffffffffu;
      for (size_t i = 0; i < kStream; i += 8) {
        uint64_t words[3];
        std::memcpy(&words[0], data + i, 8);
        std::memcpy(&words[1], data + kStream + i, 8);
        std::memcpy(&words[2], data + 2 * kStream + i, 8);
        a = _mm_crc32_u64(a, words[0]);
        b = _mm_crc32_u64(b, words[1]);
        c = _mm_crc32_u64(c, words[2]);
      }
      const uint32_t ab = multiply_modulo(stream_shift, ~static_cast<uint32_t>(a)) ^ ~static_cast<uint32_t>(b);
      crc = multiply_modulo(stream_shift, ab) ^ ~static_cast<uint32_t>(c);
      data += 3 * kStream;
      size -= 3 * kStream;
    } while (size >= 3 * kStream);
  }
  uint64_t state = ~crc;
  for (; size >= 8; size -= 8, data += 8) {
    uint64_t word;
    std::memcpy(&word, data, 8);
    state = _mm_crc32_u64(state, word);
  }
  auto low = static_cast<uint32_t>(state);
  for (; size > 0; --size, ++data) low = _mm_crc32_u8(low, *data);
  return ~low;
}
#endif

uint32_t crc32c(const uint8_t* data, size_t size) { return crc32c_extend(0, data, size); }

uint32_t crc32c_extend(uint32_t crc, const uint8_t* data, size_t size) {
#ifdef TORCH_SHARDS_CPU_DISPATCH
  if (core::cpu_has_sse42()) return crc32c_sse42(crc, data, size);
#endif
  return crc32c_portable(crc, data, size);
}

uint32_t crc32c_portable(const uint8_t* data, size_t size) { return crc32c_portable(0, data, size); }

uint32_t crc32c_portable(uint32_t previous, const uint8_t* data, size_t size) {
  const auto& t = kCrc32c.table;
  uint32_t crc = ~previous;
  for (; size >= 8; size -= 8, data += 8) {
    const uint32_t low = crc ^ read_le32(data);
    const uint32_t high = read_le32(data + 4);
    crc = t[7][low & 0xff] ^ t[6][(low >> 8) & 0xff] ^ t[5][(low >> 16) & 0xff] ^ t[4][low >> 24] ^ t[3][high & 0xff] ^
          t[2][(high >> 8) & 0xff] ^ t[1][(high >> 16) & 0xff] ^ t[0][high >> 24];
  }
  for (; size > 0; --size, ++data) crc = (crc >> 8) ^ t[0][(crc ^ *data) & 0xff];
  return ~crc;
}

void byteswap(uint8_t* data, size_t count, size_t unit) {
  switch (unit) {
    case 0:
    case 1:
      return;
    case 2:
      byteswap_words<uint16_t>(data, count);
      return;
    case 4:
      byteswap_words<uint32_t>(data, count);
      return;
    case 8:
      byteswap_words<uint64_t>(data, count);
      return;
    case 16:
      for (size_t i = 0; i < count; ++i, data += 16) {
        uint64_t low, high;
        std::memcpy(&low, data, 8);
        std::memcpy(&high, data + 8, 8);
        low = reverse_bytes(low);
        high = reverse_bytes(high);
        std::memcpy(data, &high, 8);
        std::memcpy(data + 8, &low, 8);
      }
      return;
    default:
      for (size_t i = 0; i < count; ++i, data += unit) std::reverse(data, data + unit);
  }
}

}  // namespace torch_shards::io::codecs
