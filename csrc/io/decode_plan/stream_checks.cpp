#include "io/decode_plan/stream_checks.h"

#include "core/errors.h"

namespace torch_shards::io::decode_plan {

using core::concat;

namespace {

// A length continued by bytes of 255 (LZ4's literal and match lengths); false past the input.
bool add_length(const uint8_t* in, size_t size, size_t& at, size_t& length) {
  for (;;) {
    if (at >= size) return false;
    const uint8_t byte = in[at++];
    length += byte;
    if (byte != 255) return true;
  }
}

// Whether the block is valid (what check_lz4_block checks), at the speed of its sequences: pointers, one
// bound check per length, no message. A block that fails is walked again for the message.
bool lz4_block_valid(const uint8_t* in, size_t size, size_t out_size) {
  const uint8_t* p = in;
  const uint8_t* const end = in + size;
  size_t written = 0;
  const auto extend = [&](size_t& length) {  // a length of 15 or more (rare): add_length's walk
    size_t at = static_cast<size_t>(p - in);
    const bool ended = add_length(in, size, at, length);
    p = in + at;
    return ended;
  };
  while (p < end) {
    const unsigned token = *p++;
    size_t literals = token >> 4;
    if (literals == 15 && !extend(literals)) return false;
    if (literals > static_cast<size_t>(end - p) || literals > out_size - written) return false;
    p += literals;
    written += literals;
    if (p == end) return written == out_size;
    if (end - p < 2) return false;
    const size_t offset = size_t{p[0]} | size_t{p[1]} << 8;
    p += 2;
    if (offset - 1 >= written) return false;  // 0 (wraps) or before the start
    size_t match = token & 15;
    if (match == 15 && !extend(match)) return false;
    match += 4;
    if (match > out_size - written) return false;
    written += match;
  }
  return false;  // no last sequence
}

}  // namespace

std::string check_lz4_block(const uint8_t* in, size_t size, size_t out_size) {
  if (in != nullptr && lz4_block_valid(in, size, out_size)) return "";
  size_t at = 0, written = 0;
  for (;;) {
    if (at >= size)
      return concat("the block ends after ", written, " of ", out_size, " bytes without its last literals");
    const uint8_t token = in[at++];
    size_t literals = token >> 4;
    if (literals == 15 && !add_length(in, size, at, literals)) return "a literal length runs past the block";
    if (literals > size - at) return concat("literals run ", literals - (size - at), " bytes past the block");
    if (literals > out_size - written) return concat("literals run past the ", out_size, " decoded bytes");
    at += literals;
    written += literals;
    if (at == size) break;  // the last sequence: literals only
    if (size - at < 2) return "a match offset cut off by the block's end";
    const size_t offset = size_t{in[at]} | size_t{in[at + 1]} << 8;
    at += 2;
    if (offset == 0 || offset > written) {
      return concat("a match offset of ", offset, " at decoded byte ", written, " reaches before the start");
    }
    size_t match = token & 15;
    if (match == 15 && !add_length(in, size, at, match)) return "a match length runs past the block";
    match += 4;
    if (match > out_size - written) return concat("a match runs past the ", out_size, " decoded bytes");
    written += match;
  }
  if (written != out_size) return concat("the block decodes to ", written, " bytes, not ", out_size);
  return "";
}

std::string check_zstd_frame(const uint8_t* in, size_t size, size_t out_size) {
  constexpr size_t kMaxBlock = 128 * 1024;
  if (size < 6 ||
      (uint32_t{in[0]} | uint32_t{in[1]} << 8 | uint32_t{in[2]} << 16 | uint32_t{in[3]} << 24) != 0xFD2FB528u) {
    return "not a zstd frame";
  }
  const uint8_t descriptor = in[4];
  const unsigned size_flag = descriptor >> 6, dictionary_flag = descriptor & 3;
  const bool single_segment = descriptor & 0x20, checksum = descriptor & 0x04;
  if (descriptor & 0x08) return "a frame header with its reserved bit set";
  if (dictionary_flag != 0) return "a frame that needs a dictionary";
  size_t at = 5;
  if (!single_segment) ++at;  // the window descriptor: the decoded size bounds what the decoder keeps
  const size_t size_bytes = size_flag == 0 ? (single_segment ? 1 : 0) : size_flag == 1 ? 2 : size_flag == 2 ? 4 : 8;
  if (at + size_bytes > size) return "a frame header cut off";
  if (size_bytes > 0) {
    uint64_t content = 0;
    for (size_t i = 0; i < size_bytes; ++i) content |= uint64_t{in[at + i]} << (8 * i);
    if (size_bytes == 2) content += 256;
    if (content != out_size) return concat("a frame that records ", content, " decoded bytes, not ", out_size);
  }
  at += size_bytes;
  uint64_t least = 0, most = 0;  // decoded bytes the blocks can make
  for (bool last = false; !last;) {
    if (size - at < 3) return "a block header cut off by the frame's end";
    const uint32_t header = uint32_t{in[at]} | uint32_t{in[at + 1]} << 8 | uint32_t{in[at + 2]} << 16;
    at += 3;
    last = header & 1;
    const unsigned type = (header >> 1) & 3;
    const size_t block = header >> 3;
    if (type == 3) return "a block of the reserved type";
    const size_t stored = type == 1 ? 1 : block;
    if (stored > size - at) return concat("a block of ", stored, " bytes runs past the frame");
    if (block > kMaxBlock) return concat("a block of ", block, " bytes (at most ", kMaxBlock, ")");
    if (type == 2) {
      most += kMaxBlock;
    } else {
      least += block;
      most += block;
    }
    at += stored;
  }
  if (checksum) at += 4;
  if (at != size) return concat("the frame takes ", at, " of its ", size, " bytes");
  if (least > out_size || most < out_size) return concat("blocks that cannot make ", out_size, " decoded bytes");
  return "";
}

}  // namespace torch_shards::io::decode_plan
