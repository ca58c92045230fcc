#include "io/zarr/chunk_decoding.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <utility>

#include "core/errors.h"
#include "io/codecs.h"

namespace torch_shards::io::zarr {

using core::concat;

namespace {

// Largest decoded size a frame header is trusted to announce (guards against
// corrupt headers asking for absurd allocations).
constexpr size_t kMaxRecordedSize = size_t{1} << 32;

codecs::Codec decompressor(BytesCodec codec) {
  switch (codec) {
    case BytesCodec::kBlosc:
      return codecs::Codec::kBlosc;
    case BytesCodec::kGzip:
      return codecs::Codec::kGzip;
    case BytesCodec::kZlib:
      return codecs::Codec::kZlib;
    case BytesCodec::kZstd:
      return codecs::Codec::kZstd;
    case BytesCodec::kCrc32c:
      break;
  }
  throw std::logic_error("not a decompressor");
}

// The decoded size a compressed frame records (blosc and zstd headers), for
// chunks whose decoded size the metadata does not give (variable-length
// strings), checked against the frame before it is used to allocate. zlib and
// gzip record none: undo_bytes_codecs inflates them into a growing buffer.
size_t recorded_decoded_size(BytesCodec codec, const std::vector<uint8_t>& data) {
  const codecs::DecodedSize found = codecs::decoded_size(decompressor(codec), data.data(), data.size());
  if (!found.exact) {
    throw std::runtime_error(
        concat("a ", bytes_codec_name(codec), " stream that does not record its decoded size, which this chunk needs"));
  }
  if (found.size > kMaxRecordedSize) {
    throw std::runtime_error(concat(bytes_codec_name(codec), " frame claims ", found.size, " decoded bytes"));
  }
  return static_cast<size_t>(found.size);
}

void decompress(BytesCodec codec, const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size) {
  switch (codec) {
    case BytesCodec::kBlosc:
      return codecs::decompress_blosc(in, in_size, out, out_size);
    case BytesCodec::kGzip:
      return codecs::inflate_gzip(in, in_size, out, out_size);
    case BytesCodec::kZlib:
      return codecs::inflate_zlib(in, in_size, out, out_size);
    case BytesCodec::kZstd:
      return codecs::decompress_zstd(in, in_size, out, out_size);
    case BytesCodec::kCrc32c:
      break;
  }
  throw std::logic_error("not a decompressor");
}

void decompress(BytesCodec codec, const std::vector<uint8_t>& in, uint8_t* out, size_t out_size) {
  decompress(codec, in.data(), in.size(), out, out_size);
}

}  // namespace

void strip_crc32c(std::vector<uint8_t>& data) {
  if (data.size() < 4) throw std::runtime_error(concat("crc32c: ", data.size(), " bytes cannot hold a checksum"));
  const size_t size = data.size() - 4;
  uint32_t stored = 0;
  for (int i = 3; i >= 0; --i) stored = stored << 8 | data[size + i];
  const uint32_t computed = codecs::crc32c(data.data(), size);
  if (stored != computed) {
    throw std::runtime_error(concat("crc32c checksum mismatch (stored ", stored, ", computed ", computed, ")"));
  }
  data.resize(size);
}

bool undo_bytes_codecs(const std::vector<BytesCodec>& chain, std::vector<uint8_t>& data,
                       std::optional<size_t> decoded_size, uint8_t* out) {
  for (size_t i = chain.size(); i-- > 0;) {
    if (chain[i] == BytesCodec::kCrc32c) {
      strip_crc32c(data);
      continue;
    }
    // Below this codec only checksums (4 bytes each) may remain.
    const bool only_checksums_below =
        std::all_of(chain.begin(), chain.begin() + i, [](BytesCodec codec) { return codec == BytesCodec::kCrc32c; });
    const bool known = decoded_size && only_checksums_below;
    if (!known && (chain[i] == BytesCodec::kGzip || chain[i] == BytesCodec::kZlib)) {
      data = codecs::inflate_unsized(decompressor(chain[i]), data.data(), data.size(), kMaxRecordedSize);
      continue;
    }
    const size_t size = known ? *decoded_size + 4 * i : recorded_decoded_size(chain[i], data);
    if (out && i == 0) {
      decompress(chain[i], data, out, size);
      return true;
    }
    std::vector<uint8_t> decoded(size);
    decompress(chain[i], data, decoded.data(), size);
    data.swap(decoded);
  }
  return false;
}

namespace {

// Writes into `out` (C order, shape `decoded_shape`) the C-order array `in`
// whose axes are the decoded axes permuted by `order` (encoded axis k is
// decoded axis order[k]), as zarr's transpose codec and Fortran order store it.
template <size_t kItem>
void untranspose(const uint8_t* in, uint8_t* out, const std::vector<int64_t>& decoded_shape,
                 const std::vector<int64_t>& order) {
  const size_t dims = decoded_shape.size();
  std::vector<int64_t> decoded_strides(dims, 1);
  for (size_t d = dims - 1; d-- > 0;) decoded_strides[d] = decoded_strides[d + 1] * decoded_shape[d + 1];
  std::vector<int64_t> encoded_shape(dims), out_strides(dims);
  int64_t total = 1;
  for (size_t k = 0; k < dims; ++k) {
    encoded_shape[k] = decoded_shape[order[k]];
    out_strides[k] = decoded_strides[order[k]];
    total *= encoded_shape[k];
  }
  if (total == 0) return;
  const int64_t run = encoded_shape[dims - 1], run_stride = out_strides[dims - 1];
  std::vector<int64_t> index(dims, 0);
  int64_t offset = 0;  // output element of index (over the outer encoded axes)
  for (int64_t base = 0; base < total; base += run) {
    const uint8_t* source = in + static_cast<size_t>(base) * kItem;
    for (int64_t j = 0; j < run; ++j) {
      std::memcpy(out + static_cast<size_t>(offset + j * run_stride) * kItem, source + static_cast<size_t>(j) * kItem,
                  kItem);
    }
    for (size_t k = dims - 1; k-- > 0;) {
      offset += out_strides[k];
      if (++index[k] < encoded_shape[k]) break;
      offset -= out_strides[k] * encoded_shape[k];
      index[k] = 0;
    }
  }
}

void untranspose(const uint8_t* in, uint8_t* out, const std::vector<int64_t>& decoded_shape,
                 const std::vector<int64_t>& order, size_t item) {
  switch (item) {
    case 1:
      return untranspose<1>(in, out, decoded_shape, order);
    case 2:
      return untranspose<2>(in, out, decoded_shape, order);
    case 4:
      return untranspose<4>(in, out, decoded_shape, order);
    case 8:
      return untranspose<8>(in, out, decoded_shape, order);
    case 16:
      return untranspose<16>(in, out, decoded_shape, order);
  }
  // Fixed-length strings of any width: one element at a time.
  const size_t dims = decoded_shape.size();
  std::vector<int64_t> decoded_strides(dims, 1);
  for (size_t d = dims - 1; d-- > 0;) decoded_strides[d] = decoded_strides[d + 1] * decoded_shape[d + 1];
  int64_t total = 1;
  for (int64_t extent : decoded_shape) total *= extent;
  std::vector<int64_t> index(dims, 0);
  for (int64_t e = 0; e < total; ++e) {
    int64_t rest = e, offset = 0;
    for (size_t k = dims; k-- > 0;) {
      const int64_t extent = decoded_shape[order[k]];
      offset += (rest % extent) * decoded_strides[order[k]];
      rest /= extent;
    }
    std::memcpy(out + offset * item, in + e * item, item);
  }
}

// Decodes the fixed-size elements of one chunk (numeric or fixed-length
// strings): bytes->bytes codecs, then the transposes, into C order.
class ZarrChunkDecoder : public ChunkDecoder {
 public:
  ZarrChunkDecoder(CodecChain chain, std::vector<int64_t> chunk_shape, size_t item_size)
      : chain_(std::move(chain)), item_size_(item_size) {
    // Shapes before each transpose (decoded side), innermost last.
    std::vector<int64_t> shape = std::move(chunk_shape);
    for (const std::vector<int64_t>& order : chain_.transposes) {
      shapes_.push_back(shape);
      std::vector<int64_t> next(shape.size());
      for (size_t k = 0; k < shape.size(); ++k) next[k] = shape[order[k]];
      shape = std::move(next);
    }
  }

  bool stores_raw() const override { return chain_.transposes.empty() && chain_.bytes_codecs.empty(); }

  // The outermost decompressor, with only checksums (4 bytes each) after
  // and before it, must be able to yield the chunk's bytes.
  void check_encoded(const std::vector<uint8_t>& encoded, size_t out_bytes, uint32_t) const override {
    size_t size = encoded.size();
    for (size_t i = chain_.bytes_codecs.size(); i-- > 0;) {
      if (chain_.bytes_codecs[i] == BytesCodec::kCrc32c) {
        if (size < 4) throw std::runtime_error(concat("crc32c: ", size, " bytes cannot hold a checksum"));
        size -= 4;
        continue;
      }
      const bool only_checksums_below = std::all_of(chain_.bytes_codecs.begin(), chain_.bytes_codecs.begin() + i,
                                                    [](BytesCodec codec) { return codec == BytesCodec::kCrc32c; });
      if (only_checksums_below) {
        codecs::check_decoded_size(decompressor(chain_.bytes_codecs[i]), encoded.data(), size, out_bytes + 4 * i);
      }
      return;
    }
    if (size != out_bytes) throw std::runtime_error(concat("holds ", size, " bytes, expected ", out_bytes));
  }

  // One decompressor and nothing else (annbatch's blosc, most zarr arrays):
  // it reads the stored bytes where they are.
  bool decodes_views() const override {
    return chain_.transposes.empty() && chain_.bytes_codecs.size() == 1 &&
           chain_.bytes_codecs[0] != BytesCodec::kCrc32c;
  }

  void decode_view(const uint8_t* encoded, size_t size, size_t out_bytes,
                   core::FunctionRef<uint8_t*()> out) const override {
    codecs::check_decoded_size(decompressor(chain_.bytes_codecs[0]), encoded, size, out_bytes);  // before out()
    decompress(chain_.bytes_codecs[0], encoded, size, out(), out_bytes);  // writes exactly out_bytes or throws
  }

  // blosc frames: parts of a chunk decoded without the rest.
  bool decodes_ranges() const override { return decodes_views() && chain_.bytes_codecs[0] == BytesCodec::kBlosc; }

  bool decode_view_ranges(const uint8_t* encoded, size_t size, size_t out_bytes,
                          const std::vector<codecs::ByteRange>& ranges, bool trusted) const override {
    return codecs::decompress_blosc_ranges(encoded, size, out_bytes, ranges, trusted);
  }

  void decode(std::vector<uint8_t>& encoded, uint8_t* out, size_t out_bytes) const override {
    const bool plain = chain_.transposes.empty();
    if (undo_bytes_codecs(chain_.bytes_codecs, encoded, out_bytes, plain ? out : nullptr)) return;
    if (encoded.size() != out_bytes) {
      throw std::runtime_error(concat("decodes to ", encoded.size(), " bytes, expected ", out_bytes));
    }
    if (plain) {
      std::memcpy(out, encoded.data(), out_bytes);
      return;
    }
    std::vector<uint8_t> scratch(shapes_.size() > 1 ? out_bytes : 0);
    const uint8_t* source = encoded.data();
    for (size_t t = shapes_.size(); t-- > 0;) {
      uint8_t* target = t == 0 ? out : (source == scratch.data() ? encoded.data() : scratch.data());
      untranspose(source, target, shapes_[t], chain_.transposes[t], item_size_);
      source = target;
    }
  }

 private:
  CodecChain chain_;
  size_t item_size_;
  std::vector<std::vector<int64_t>> shapes_;
};

}  // namespace

std::shared_ptr<const ChunkDecoder> make_chunk_decoder(const CodecChain& chain, const std::vector<int64_t>& chunk_shape,
                                                       size_t item_size) {
  return std::make_shared<ZarrChunkDecoder>(chain, chunk_shape, item_size);
}

}  // namespace torch_shards::io::zarr
