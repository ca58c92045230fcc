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

// Where the compressed streams of a blosc1 frame lie, for decoders that
// decode them elsewhere (the GPU decode plan, csrc/io/decode_plan): the same
// rules decompress_blosc_ranges follows. Each block decodes its streams, one
// after another, into its bytes before unshuffling.
struct BloscStream {
  size_t offset = 0, size = 0;  // in the frame
  bool stored = false;          // held as is (size == the stream's decoded bytes)
};
struct BloscBlock {
  size_t offset = 0, size = 0;  // decoded bytes of the block within the frame's
  size_t stream_bytes = 0;      // decoded bytes of each of its streams
  std::vector<BloscStream> streams;
};
struct BloscLayout {
  uint8_t version = 0, flags = 0;
  int compressor = 0;  // bits 5-7 of the flags: 0 blosclz, 1 lz4 (lz4hc too), 2 snappy, 3 zlib, 4 zstd
  size_t typesize = 1, nbytes = 0, blocksize = 0;
  bool stored = false;             // the frame holds its bytes as is after the 16-byte header
  bool byte_shuffle = false;       // each block unshuffled by byte (elements of typesize > 1)
  bool bit_shuffle = false;        // each block bit-unshuffled (blocks of at least typesize bytes)
  std::vector<BloscBlock> blocks;  // none when stored
};
// The layout of the blosc1 frame `in`, checked as check_blosc_frame checks it
// (decoding to out_size bytes) and every stream lying within the frame.
// Throws std::runtime_error naming the frame otherwise.
BloscLayout blosc_layout(const uint8_t* in, size_t in_size, size_t out_size);

}  // namespace torch_shards::io::codecs
