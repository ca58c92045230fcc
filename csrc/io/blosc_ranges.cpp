#include "io/blosc_ranges.h"

#include <lz4.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/cpu_features.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#ifdef TORCH_SHARDS_CPU_DISPATCH
#include <immintrin.h>
#endif

#include "core/errors.h"
#include "core/scratch_buffer.h"
#include "io/codecs.h"

namespace torch_shards::io::codecs {

using core::concat;

namespace {

// The header's flags (its byte 2) and the rules c-blosc 1.x decodes blocks by.
constexpr uint8_t kByteShuffle = 0x1, kStored = 0x2, kBitShuffle = 0x4, kDontSplit = 0x10;
constexpr int kLz4Format = 1;  // the compressor, in bits 5-7 of the flags
constexpr size_t kHeaderBytes = 16;
constexpr size_t kMaxSplits = 16;          // a block is split into one stream per byte of the element
constexpr size_t kMinSplitElements = 128;  // when the element is at most 16 bytes and a block holds 128 of them
constexpr size_t kSpanRanges = 4;          // ranges in a block from which their span is unshuffled once

// out[i * kSize + k] = planes[k][first + i] for i < count.
template <size_t kSize>
void interleave_fixed(const uint8_t* const* planes, size_t first, size_t count, uint8_t* out) {
  size_t i = 0;
#if defined(__SSE2__)
  const auto load = [&](size_t k) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(planes[k] + first + i)); };
  const auto store = [&](size_t part, __m128i value) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i * kSize + 16 * part), value);
  };
  for (; i + 16 <= count; i += 16) {  // 16 elements a round
    if constexpr (kSize == 2) {
      const __m128i a = load(0), b = load(1);
      store(0, _mm_unpacklo_epi8(a, b));
      store(1, _mm_unpackhi_epi8(a, b));
    } else if constexpr (kSize == 4) {
      const __m128i a = load(0), b = load(1), c = load(2), d = load(3);
      const __m128i ab_lo = _mm_unpacklo_epi8(a, b), ab_hi = _mm_unpackhi_epi8(a, b);
      const __m128i cd_lo = _mm_unpacklo_epi8(c, d), cd_hi = _mm_unpackhi_epi8(c, d);
      store(0, _mm_unpacklo_epi16(ab_lo, cd_lo));
      store(1, _mm_unpackhi_epi16(ab_lo, cd_lo));
      store(2, _mm_unpacklo_epi16(ab_hi, cd_hi));
      store(3, _mm_unpackhi_epi16(ab_hi, cd_hi));
    } else {
      static_assert(kSize == 8);
      __m128i pairs[8];  // planes 2m and 2m+1 byte by byte: elements 0-7 at 2m, 8-15 at 2m+1
      for (size_t m = 0; m < 4; ++m) {
        const __m128i low = load(2 * m), high = load(2 * m + 1);
        pairs[2 * m] = _mm_unpacklo_epi8(low, high);
        pairs[2 * m + 1] = _mm_unpackhi_epi8(low, high);
      }
      for (size_t e = 0; e < 4; ++e) {  // elements 4e .. 4e+3: bytes 0-3 from pairs 01/23, bytes 4-7 from 45/67
        const size_t half = e / 2;
        const auto quads = [&](size_t p) {
          return e % 2 == 0 ? _mm_unpacklo_epi16(pairs[p + half], pairs[p + 2 + half])
                            : _mm_unpackhi_epi16(pairs[p + half], pairs[p + 2 + half]);
        };
        const __m128i first_half = quads(0), second_half = quads(4);
        store(2 * e, _mm_unpacklo_epi32(first_half, second_half));
        store(2 * e + 1, _mm_unpackhi_epi32(first_half, second_half));
      }
    }
  }
#endif
  for (; i < count; ++i) {
    for (size_t k = 0; k < kSize; ++k) out[i * kSize + k] = planes[k][first + i];
  }
}

#ifdef TORCH_SHARDS_CPU_DISPATCH
// Elements of 2 or 4 bytes, 32 a round with AVX2 (built for baseline x86-64,
// used where the CPU has it): the unpacks work within 128-bit lanes, the
// permutes put the lanes' elements in order. Returns the elements written
// (a multiple of 32); interleave_fixed does the rest.
__attribute__((target("avx2"))) size_t interleave_avx2(const uint8_t* const* planes, size_t size, size_t first,
                                                       size_t count, uint8_t* out) {
  // (No lambdas here: they would not inherit the target.)
  const auto* a_in = reinterpret_cast<const __m256i*>(planes[0] + first);
  const auto* b_in = reinterpret_cast<const __m256i*>(planes[1] + first);
  size_t i = 0;
  if (size == 2) {
    for (; i + 32 <= count; i += 32) {
      const __m256i a = _mm256_loadu_si256(a_in + i / 32), b = _mm256_loadu_si256(b_in + i / 32);
      const __m256i lo = _mm256_unpacklo_epi8(a, b), hi = _mm256_unpackhi_epi8(a, b);  // 0-7|16-23, 8-15|24-31
      auto* to = reinterpret_cast<__m256i*>(out + i * 2);
      _mm256_storeu_si256(to, _mm256_permute2x128_si256(lo, hi, 0x20));
      _mm256_storeu_si256(to + 1, _mm256_permute2x128_si256(lo, hi, 0x31));
    }
    return i;
  }
  const auto* c_in = reinterpret_cast<const __m256i*>(planes[2] + first);
  const auto* d_in = reinterpret_cast<const __m256i*>(planes[3] + first);
  for (; i + 32 <= count; i += 32) {
    const __m256i a = _mm256_loadu_si256(a_in + i / 32), b = _mm256_loadu_si256(b_in + i / 32);
    const __m256i c = _mm256_loadu_si256(c_in + i / 32), d = _mm256_loadu_si256(d_in + i / 32);
    const __m256i ab_lo = _mm256_unpacklo_epi8(a, b), ab_hi = _mm256_unpackhi_epi8(a, b);  // 0-7|16-23, 8-15|24-31
    const __m256i cd_lo = _mm256_unpacklo_epi8(c, d), cd_hi = _mm256_unpackhi_epi8(c, d);
    const __m256i e0 = _mm256_unpacklo_epi16(ab_lo, cd_lo), e4 = _mm256_unpackhi_epi16(ab_lo, cd_lo);  // 0-3|16-19
    const __m256i e8 = _mm256_unpacklo_epi16(ab_hi, cd_hi), e12 = _mm256_unpackhi_epi16(ab_hi, cd_hi);
    auto* to = reinterpret_cast<__m256i*>(out + i * 4);
    _mm256_storeu_si256(to, _mm256_permute2x128_si256(e0, e4, 0x20));
    _mm256_storeu_si256(to + 1, _mm256_permute2x128_si256(e8, e12, 0x20));
    _mm256_storeu_si256(to + 2, _mm256_permute2x128_si256(e0, e4, 0x31));
    _mm256_storeu_si256(to + 3, _mm256_permute2x128_si256(e8, e12, 0x31));
  }
  return i;
}
#endif

void interleave(const uint8_t* const* planes, size_t size, size_t first, size_t count, uint8_t* out) {
#ifdef TORCH_SHARDS_CPU_DISPATCH
  if ((size == 2 || size == 4) && count >= 32 && core::cpu_has_avx2()) {
    const size_t done = interleave_avx2(planes, size, first, count, out);
    first += done;
    count -= done;
    out += done * size;
  }
#endif
  switch (size) {
    case 2:
      return interleave_fixed<2>(planes, first, count, out);
    case 4:
      return interleave_fixed<4>(planes, first, count, out);
    case 8:
      return interleave_fixed<8>(planes, first, count, out);
    default:
      for (size_t i = 0; i < count; ++i) {
        for (size_t k = 0; k < size; ++k) out[i * size + k] = planes[k][first + i];
      }
  }
}

struct Frame {
  const uint8_t* in;
  size_t cbytes, nbytes, blocksize, typesize;
  uint8_t flags;

  [[noreturn]] void corrupt(const std::string& detail) const {
    throw std::runtime_error(concat("corrupt ", describe_blosc(in), ": ", detail));
  }
  // c-blosc splits every block but a short last one into one stream per
  // byte of the element, unless the header says not to or it is too small.
  bool splits(size_t block_bytes) const {
    return !(flags & kDontSplit) && typesize <= kMaxSplits && block_bytes / typesize >= kMinSplitElements &&
           block_bytes == blocksize;
  }
};

// One block's bytes before unshuffling (T), as far as they were needed:
// T[x] lies in stream x / stream_bytes, each either where it is stored or
// decoded into scratch. Shuffled, byte k of element i is T[k * elements + i]
// and the bytes after the last whole element stay in place.
struct Block {
  size_t size = 0, typesize = 0, stream_bytes = 0, elements = 0;
  bool shuffled = false;
  const uint8_t* streams[kMaxSplits] = {};
  const uint8_t* planes[kMaxSplits] = {};  // shuffled elements of up to 16 bytes: byte plane k

  const uint8_t* at(size_t x) const { return streams[x / stream_bytes] + x % stream_bytes; }

  // Once the streams are in place.
  void find_planes() {
    if (shuffled && typesize <= kMaxSplits) {
      for (size_t k = 0; k < typesize; ++k) planes[k] = at(k * elements);  // a plane never straddles streams
    }
  }

  // Bytes [a, e) of the decoded block to out.
  void write(size_t a, size_t e, uint8_t* out) const {
    if (!shuffled) {
      while (a < e) {
        const size_t end = std::min(e, (a / stream_bytes + 1) * stream_bytes);
        std::memcpy(out, at(a), end - a);
        out += end - a;
        a = end;
      }
      return;
    }
    const uint8_t* wide[256];  // planes of longer elements (one stream: never split)
    const uint8_t* const* plane = planes;
    if (typesize > kMaxSplits) {
      for (size_t k = 0; k < typesize; ++k) wide[k] = at(k * elements);
      plane = wide;
    }
    const size_t whole_end = std::min(e, elements * typesize);
    if (a < whole_end) {
      const size_t head = a / typesize, tail = whole_end / typesize;  // the elements holding a and whole_end
      const size_t head_byte = a - head * typesize, tail_bytes = whole_end - tail * typesize;
      if (head == tail) {
        for (size_t k = head_byte; k < tail_bytes; ++k) *out++ = plane[k][head];
      } else {
        size_t first = head;
        if (head_byte != 0) {
          for (size_t k = head_byte; k < typesize; ++k) *out++ = plane[k][head];
          ++first;
        }
        interleave(plane, typesize, first, tail - first, out);
        out += (tail - first) * typesize;
        for (size_t k = 0; k < tail_bytes; ++k) *out++ = plane[k][tail];
      }
    }
    const size_t rest = std::max(a, elements * typesize);  // bytes after the last whole element stay in place
    if (rest < e) std::memcpy(out, at(rest), e - rest);
  }
};

// How many leading bytes of stream j bytes [lo, hi) of the block need (0: none).
size_t needed_prefix(const Block& block, size_t streams, size_t j, size_t lo, size_t hi) {
  if (hi <= lo) return 0;
  const size_t whole = block.elements * block.typesize;
  if (!block.shuffled) {  // stream j holds bytes [j * stream_bytes, (j + 1) * stream_bytes) in place
    const size_t first = j * block.stream_bytes;
    return hi > first && lo < first + block.stream_bytes ? std::min(hi - first, block.stream_bytes) : 0;
  }
  const size_t elements_needed = (std::min(hi, whole) + block.typesize - 1) / block.typesize;
  if (streams > 1) return elements_needed;  // stream j is plane j (split blocks hold whole elements only)
  // One stream: planes one after another, then the bytes after the last whole element.
  return hi > whole ? hi : (block.typesize - 1) * block.elements + elements_needed;
}

// Locates block b's streams and decodes the lz4 ones that [lo, hi) needs.
// Untrusted, each is decoded whole: lz4 carries no checksum, and a stream
// decoding to exactly its length is the check c-blosc makes (decoding only a
// prefix would deliver the rows of a damaged stream that c-blosc refuses);
// `checked_whole` turns false when a stream is skipped. Trusted (the frame
// was checked whole before), only the prefix the range needs is decoded.
Block decode_block(const Frame& frame, size_t b, size_t lo, size_t hi, uint8_t* scratch, bool trusted,
                   bool& checked_whole) {
  Block block;
  block.size = std::min(frame.blocksize, frame.nbytes - b * frame.blocksize);
  block.typesize = frame.typesize;
  block.shuffled = (frame.flags & kByteShuffle) && frame.typesize > 1;
  const size_t streams = frame.splits(block.size) ? frame.typesize : 1;
  block.stream_bytes = block.size / streams;
  block.elements = block.size / block.typesize;
  size_t offset = read_le32(frame.in + kHeaderBytes + 4 * b);
  for (size_t j = 0; j < streams; ++j) {
    if (offset > frame.cbytes || frame.cbytes - offset < 4) {
      frame.corrupt(concat("block ", b, " stream ", j, " starts at byte ", offset, ", past its ", frame.cbytes));
    }
    const size_t stored = read_le32(frame.in + offset);
    offset += 4;
    if (stored > frame.cbytes - offset) {
      frame.corrupt(concat("block ", b, " stream ", j, " of ", stored, " bytes at byte ", offset, " overruns its ",
                           frame.cbytes));
    }
    const uint8_t* source = frame.in + offset;
    offset += stored;
    if (stored == block.stream_bytes) {  // stored as is
      block.streams[j] = source;
      continue;
    }
    uint8_t* decoded = scratch + j * block.stream_bytes;
    block.streams[j] = decoded;
    const size_t prefix = needed_prefix(block, streams, j, lo, hi);
    if (prefix == 0 || (trusted && prefix < block.stream_bytes)) checked_whole = false;
    if (prefix == 0) continue;
    const auto source_text = reinterpret_cast<const char*>(source);
    const auto decoded_text = reinterpret_cast<char*>(decoded);
    const size_t want = trusted ? prefix : block.stream_bytes;
    const int got = want < block.stream_bytes
                        ? LZ4_decompress_safe_partial(source_text, decoded_text, static_cast<int>(stored),
                                                      static_cast<int>(want), static_cast<int>(block.stream_bytes))
                        : LZ4_decompress_safe(source_text, decoded_text, static_cast<int>(stored),
                                              static_cast<int>(block.stream_bytes));
    if (got < 0 || static_cast<size_t>(got) != want) {
      frame.corrupt(concat("block ", b, " stream ", j, " is not lz4 data of ", block.stream_bytes, " bytes"));
    }
  }
  block.find_planes();
  return block;
}

}  // namespace

bool decompress_blosc_ranges(const uint8_t* in, size_t in_size, size_t out_size, const std::vector<ByteRange>& ranges,
                             bool trusted) {
  size_t wanted = 0;
  for (const ByteRange& range : ranges) {
    if (range.begin > range.end || range.end > out_size) {
      throw std::logic_error(concat("bytes [", range.begin, ", ", range.end, ") of a ", out_size, "-byte blosc frame"));
    }
    wanted += range.end - range.begin;
  }
  if (wanted == 0) {
    check_blosc_frame(in, in_size, out_size);
    return false;
  }
  if (ranges.size() == 1 && wanted == out_size) {
    decompress_blosc(in, in_size, ranges[0].out, out_size);  // all of it: c-blosc's vectorised unshuffle
    return true;
  }
  const auto decode_whole = [&] {  // by c-blosc, which checks the frame
    thread_local core::ScratchBuffer whole;
    uint8_t* decoded = whole.get(out_size);
    decompress_blosc(in, in_size, decoded, out_size);
    for (const ByteRange& range : ranges) std::memcpy(range.out, decoded + range.begin, range.end - range.begin);
    return true;
  };
  // Decoded here: stored frames and lz4 frames (byte shuffle or none) less
  // than 7/8 wanted, each lz4 stream only as far as the ranges need once the
  // frame is trusted: on annbatch's chunks that beats c-blosc's whole decode
  // and copies out (random 64-row blocks: +14% read in order, +2-3%
  // shuffled). For more, c-blosc's vectorised unshuffle of the whole frame
  // wins. Other compressors and bit shuffle: c-blosc.
  const uint8_t flags = in_size >= kHeaderBytes ? in[2] : 0;
  const bool lz4 = (flags >> 5) == kLz4Format && !(flags & kBitShuffle);
  const bool most = wanted >= out_size - out_size / 8;
  if (in_size < kHeaderBytes || !((flags & kStored) || (lz4 && !most))) return decode_whole();
  // The sizes c-blosc checks: a stored frame holds exactly out_size bytes,
  // block offsets fit, blocks of 1 to out_size bytes, typesize 1 or more.
  check_blosc_frame(in, in_size, out_size);
  if (flags & kStored) {
    for (const ByteRange& range : ranges) {
      std::memcpy(range.out, in + kHeaderBytes + range.begin, range.end - range.begin);
    }
    return true;
  }
  const Frame frame{in, read_le32(in + 12), out_size, read_le32(in + 8), in[3], flags};
  if (frame.splits(frame.blocksize) && frame.blocksize % frame.typesize != 0) return decode_whole();  // not c-blosc's
  // (block, range) pairs, by block: each block is decoded once, as far as its ranges need.
  thread_local std::vector<std::pair<size_t, size_t>> touches;
  touches.clear();
  for (size_t r = 0; r < ranges.size(); ++r) {
    if (ranges[r].begin == ranges[r].end) continue;
    for (size_t b = ranges[r].begin / frame.blocksize; b <= (ranges[r].end - 1) / frame.blocksize; ++b) {
      touches.emplace_back(b, r);
    }
  }
  if (!std::is_sorted(touches.begin(), touches.end())) std::sort(touches.begin(), touches.end());
  thread_local core::ScratchBuffer lz4_out, span_out;
  uint8_t* scratch = lz4_out.get(std::min(frame.blocksize, out_size));
  // Checked whole when every block's every lz4 stream decoded whole.
  size_t blocks_decoded = 0;
  bool checked_whole = true;
  for (size_t t = 0; t < touches.size();) {
    const size_t b = touches[t].first, start = b * frame.blocksize;
    const size_t block_end = std::min(out_size, start + frame.blocksize);
    size_t lo = block_end, hi = start, u = t;
    for (; u < touches.size() && touches[u].first == b; ++u) {
      const ByteRange& range = ranges[touches[u].second];
      lo = std::min(lo, std::max(range.begin, start));
      hi = std::max(hi, std::min(range.end, block_end));
    }
    const Block block = decode_block(frame, b, lo - start, hi - start, scratch, trusted, checked_whole);
    ++blocks_decoded;
    // Many ranges (a shuffled fetch's rows, one each): the span they cover is unshuffled once, in one long
    // vectorised pass into memory that stays in cache, and each range copied out of it.
    const bool via_span = block.shuffled && u - t >= kSpanRanges;
    uint8_t* span = via_span ? span_out.get(hi - lo) : nullptr;
    if (via_span) block.write(lo - start, hi - start, span);
    for (; t < u; ++t) {
      const ByteRange& range = ranges[touches[t].second];
      const size_t a = std::max(range.begin, start), e = std::min(range.end, block_end);
      if (via_span) {
        std::memcpy(range.out + (a - range.begin), span + (a - lo), e - a);
      } else {
        block.write(a - start, e - start, range.out + (a - range.begin));
      }
    }
  }
  const size_t blocks = (out_size + frame.blocksize - 1) / frame.blocksize;
  return checked_whole && blocks_decoded == blocks;
}

BloscLayout blosc_layout(const uint8_t* in, size_t in_size, size_t out_size) {
  check_blosc_frame(in, in_size, out_size);
  BloscLayout layout;
  layout.version = in[0];
  layout.flags = in[2];
  layout.compressor = in[2] >> 5;
  layout.typesize = in[3];
  layout.nbytes = out_size;
  layout.blocksize = read_le32(in + 8);
  layout.stored = (layout.flags & kStored) != 0;
  if (layout.stored || out_size == 0) return layout;
  const Frame frame{in, read_le32(in + 12), out_size, layout.blocksize, layout.typesize, layout.flags};
  if (frame.splits(frame.blocksize) && frame.blocksize % frame.typesize != 0) {
    frame.corrupt(concat("blocks of ", frame.blocksize, " bytes split into ", frame.typesize, " streams"));
  }
  const size_t blocks = (out_size + frame.blocksize - 1) / frame.blocksize;
  layout.blocks.resize(blocks);
  for (size_t b = 0; b < blocks; ++b) {
    BloscBlock& block = layout.blocks[b];
    block.offset = b * frame.blocksize;
    block.size = std::min(frame.blocksize, out_size - block.offset);
    const size_t streams = frame.splits(block.size) ? frame.typesize : 1;
    block.stream_bytes = block.size / streams;
    size_t offset = read_le32(in + kHeaderBytes + 4 * b);
    for (size_t j = 0; j < streams; ++j) {
      if (offset > frame.cbytes || frame.cbytes - offset < 4) {
        frame.corrupt(concat("block ", b, " stream ", j, " starts at byte ", offset, ", past its ", frame.cbytes));
      }
      const size_t stored = read_le32(in + offset);
      offset += 4;
      if (stored > frame.cbytes - offset) {
        frame.corrupt(concat("block ", b, " stream ", j, " of ", stored, " bytes at byte ", offset, " overruns its ",
                             frame.cbytes));
      }
      block.streams.push_back(BloscStream{offset, stored, stored == block.stream_bytes});
      offset += stored;
    }
  }
  layout.byte_shuffle = (layout.flags & kByteShuffle) && layout.typesize > 1;
  layout.bit_shuffle = !layout.byte_shuffle && (layout.flags & kBitShuffle);
  return layout;
}

}  // namespace torch_shards::io::codecs
