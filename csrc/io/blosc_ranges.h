// Parts of a blosc1 frame, decoded without decoding the rest of it.
//
// A random block of rows needs the tail of one chunk and the head of the
// next; decoding both chunks whole (what c-blosc offers) decodes twice what
// is used. Frames c-blosc writes with lz4 (numcodecs' and annbatch's default)
// store each block as one stream per byte of the element (split streams) or
// one stream, each either raw or lz4-compressed. Here raw streams are read
// where they lie, only the lz4 streams the ranges need are decoded (whole:
// their exact length is the only check lz4 data allows), and only the wanted
// elements are unshuffled, straight into the ranges' outputs: no copy of the
// chunk, no allocation per frame. lz4 has no checksum: a stream decoding to
// exactly its length is c-blosc's only check, so a frame is decoded whole (or
// its needed streams are) until the caller knows it checked once; after
// that, only the prefix of each stream the ranges need is decoded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace torch_shards::io::codecs {

// Bytes [begin, end) of a decoded buffer, to be written to out[0, end - begin).
struct ByteRange {
  size_t begin = 0, end = 0;
  uint8_t* out = nullptr;
};

// Writes each range of what the blosc1 frame `in` decodes to (out_size bytes,
// checked as decompress_blosc checks them). Ranges come in any order and may
// overlap; each lies within [0, out_size). Stored frames, and lz4 frames
// with byte shuffle or none wanted for less than 7/8 of their bytes, are
// decoded in part, as above (a damaged stream a range needs throws as c-blosc
// would; a block's many ranges are unshuffled as one span, then copied out);
// any other frame (more wanted, blosclz, zstd, zlib, bit shuffle) is decoded
// whole by c-blosc into a buffer kept per thread, then copied. Throws std::runtime_error naming the frame for corrupt
// or truncated input; never reads outside [in, in + in_size).
//
// trusted: this frame's bytes returned true before (the caller remembers
// frames by their place in a read-only mapping); its lz4 streams are then
// decoded only as far as the ranges need. A damaged frame passed as trusted
// may deliver wrong bytes but never reads or writes out of bounds. Returns
// true when this call checked the whole frame as c-blosc would (every lz4
// stream decoded to its exact length, or the frame holds none).
bool decompress_blosc_ranges(const uint8_t* in, size_t in_size, size_t out_size, const std::vector<ByteRange>& ranges,
                             bool trusted = false);

}  // namespace torch_shards::io::codecs
