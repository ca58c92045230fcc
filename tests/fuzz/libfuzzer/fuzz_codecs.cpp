// libFuzzer target: the chunk decoders (zlib, gzip, zstd, blosc whole and in
// part, lzf, HDF5 scale-offset) and the size checks that run before a chunk's
// buffer is allocated. Input: a selector byte, a 20-bit output size (under 1 MiB),
// then the encoded bytes. Every input must decode to exactly that size or
// throw std::runtime_error (blosc ranges marked trusted: may deliver any
// bytes for a damaged frame); nothing else (no crash, no sanitizer report, no
// allocation the header did not justify).
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "io/blosc_ranges.h"
#include "io/codecs.h"

using namespace torch_shards::io::codecs;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const uint8_t selector = data[0];
  const size_t out_size = (size_t{data[1]} | size_t{data[2]} << 8 | static_cast<size_t>(data[3] & 0x0f) << 16);
  const uint8_t* in = data + 4;
  const size_t in_size = size - 4;
  try {
    if (selector % 6 == 5) {
      ScaleOffsetParameters parameters;
      const size_t sizes[] = {1, 2, 4, 8};
      parameters.size = sizes[(selector >> 3) & 3];
      parameters.count = out_size / parameters.size;
      parameters.big_endian = selector & 0x20;
      parameters.fill_defined = selector & 0x40;
      parameters.fill = 0x5a5a5a5a5a5a5a5aull;
      std::vector<uint8_t> out(parameters.count * parameters.size);
      decode_scaleoffset(in, in_size, out.data(), parameters);
      return 0;
    }
    const Codec codec = static_cast<Codec>(selector % 6);
    // As the readers do: the size check first, the buffer after.
    check_decoded_size(codec, in, in_size, out_size);
    std::vector<uint8_t> out(out_size);
    switch (codec) {
      case Codec::kZlib:
        inflate_zlib(in, in_size, out.data(), out_size);
        break;
      case Codec::kGzip:
        inflate_gzip(in, in_size, out.data(), out_size);
        break;
      case Codec::kZstd:
        decompress_zstd(in, in_size, out.data(), out_size);
        break;
      case Codec::kLzf:
        decompress_lzf(in, in_size, out.data(), out_size);
        break;
      case Codec::kBlosc:
        if (selector & 0x80) {  // parts of the frame, as block reads of annbatch's chunks ask for them
          // Trusted (bit 6): lz4 streams decoded only as far as needed; a damaged frame may then
          // deliver wrong bytes, but must not read or write out of bounds.
          decompress_blosc_ranges(
              in, in_size, out_size,
              {ByteRange{0, out_size / 3, out.data()}, ByteRange{out_size / 2, out_size, out.data() + out_size / 2},
               ByteRange{out_size / 4, out_size / 4 + (out_size > 0), out.data()}},
              (selector & 0x40) != 0);
        } else {
          decompress_blosc(in, in_size, out.data(), out_size);
        }
        break;
    }
  } catch (const std::runtime_error&) {
  }
  return 0;
}
