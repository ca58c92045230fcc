#include "io/decode_plan/cpu_executor.h"

#include <lz4.h>
#include <zlib.h>

#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "core/errors.h"
#include "io/codecs.h"

namespace torch_shards::io::decode_plan {

using core::concat;

namespace {

void inflate_raw(const uint8_t* in, size_t in_size, uint8_t* out, size_t out_size) {
  constexpr size_t kMax = std::numeric_limits<uInt>::max();
  if (in_size > kMax || out_size > kMax) throw std::runtime_error("a deflate piece of more than 4 GiB");
  z_stream stream{};
  if (inflateInit2(&stream, -15) != Z_OK) throw std::runtime_error("inflateInit2 failed");
  stream.next_in = const_cast<Bytef*>(in);
  stream.avail_in = static_cast<uInt>(in_size);
  stream.next_out = out;
  stream.avail_out = static_cast<uInt>(out_size);
  const int status = inflate(&stream, Z_FINISH);
  const size_t produced = stream.total_out, consumed = stream.total_in;
  inflateEnd(&stream);
  if (status != Z_STREAM_END || produced != out_size || consumed != in_size) {
    throw std::runtime_error(concat("deflate piece of ", in_size, " bytes does not decode to ", out_size, " bytes"));
  }
}

void decompress(const Piece& piece, const uint8_t* in, uint8_t* out) {
  const size_t in_size = piece.input_size, out_size = piece.output_size;
  switch (piece.codec) {
    case PieceCodec::kCopy:
      if (in_size != out_size) throw std::runtime_error(concat("a copy of ", in_size, " bytes into ", out_size));
      std::memcpy(out, in, out_size);
      return;
    case PieceCodec::kLz4: {
      constexpr size_t kMax = std::numeric_limits<int>::max();
      const int got = in_size > kMax || out_size > kMax
                          ? -1
                          : LZ4_decompress_safe(reinterpret_cast<const char*>(in), reinterpret_cast<char*>(out),
                                                static_cast<int>(in_size), static_cast<int>(out_size));
      if (got < 0 || static_cast<size_t>(got) != out_size) {
        throw std::runtime_error(concat("lz4 piece of ", in_size, " bytes does not decode to ", out_size, " bytes"));
      }
      return;
    }
    case PieceCodec::kZstd:
      return codecs::decompress_zstd(in, in_size, out, out_size);
    case PieceCodec::kDeflate:
      return inflate_raw(in, in_size, out, out_size);
  }
}

void check(const Piece& piece, const uint8_t* decoded) {
  uint32_t computed = 0;
  switch (piece.check) {
    case PieceCheck::kNone:
      return;
    case PieceCheck::kAdler32:
      computed = static_cast<uint32_t>(adler32(adler32(0, nullptr, 0), decoded, static_cast<uInt>(piece.output_size)));
      break;
    case PieceCheck::kCrc32:
      computed = static_cast<uint32_t>(crc32(crc32(0, nullptr, 0), decoded, static_cast<uInt>(piece.output_size)));
      break;
  }
  if (computed != piece.expected) {
    throw std::runtime_error(concat(piece.check == PieceCheck::kAdler32 ? "adler32" : "crc32", " mismatch (stored ",
                                    piece.expected, ", computed ", computed, ")"));
  }
}

}  // namespace

void bit_unshuffle(const uint8_t* in, size_t size, size_t typesize, uint8_t* out) {
  const size_t elements = size / typesize, n = elements - elements % 8;
  const size_t row = n / 8;  // bytes per bit plane
  std::memset(out, 0, n * typesize);
  for (size_t j = 0; j < typesize; ++j) {
    for (size_t k = 0; k < 8; ++k) {
      const uint8_t* plane = in + (8 * j + k) * row;
      for (size_t i = 0; i < n; ++i) {
        out[i * typesize + j] |= static_cast<uint8_t>(((plane[i / 8] >> (i % 8)) & 1) << k);
      }
    }
  }
  std::memcpy(out + n * typesize, in + n * typesize, size - n * typesize);
}

void decode_piece(const DecodePlan& plan, const Piece& piece, const uint8_t* in, uint8_t* out) {
  try {
    decompress(piece, in, out);
    check(piece, out);
  } catch (const std::runtime_error& error) {
    throw core::ReadError(concat(chunk_where(plan, piece.chunk), ": ", error.what()));
  }
}

void decode_host_chunk(const DecodePlan& plan, uint32_t chunk, uint8_t* out) {
  std::vector<uint8_t> encoded = plan.inputs.at(chunk);  // a copy: the decoder may work in place
  try {
    plan.host_decoder->check_encoded(encoded, plan.chunk_bytes, 0);
    plan.host_decoder->decode(encoded, out, plan.chunk_bytes);
  } catch (const std::runtime_error& error) {
    throw core::ReadError(concat(chunk_where(plan, chunk), ": ", error.what()));
  }
}

void execute_on_cpu(const DecodePlan& plan, uint8_t* out) {
  std::vector<uint8_t> staging(plan.staging_bytes), scratch(plan.scratch_bytes);
  for (const PlannedChunk& chunk : plan.chunks) {
    if (chunk.kind != ChunkKind::kFill) continue;
    uint8_t* at = staging.data() + chunk.staging_offset;
    for (size_t e = 0; e + plan.item_size <= plan.chunk_bytes; e += plan.item_size) {
      std::memcpy(at + e, plan.fill_value.data(), plan.item_size);
    }
  }
  for (const Piece& piece : plan.pieces) {
    if (piece.output_offset + piece.output_size > (piece.to_scratch ? scratch.size() : staging.size())) {
      throw std::logic_error(concat(chunk_where(plan, piece.chunk), ": a piece outside the plan's buffers"));
    }
    uint8_t* target = (piece.to_scratch ? scratch.data() : staging.data()) + piece.output_offset;
    decode_piece(plan, piece, plan.piece_input(piece), target);
  }
  for (const Unshuffle& step : plan.unshuffles) {
    const uint8_t* from = scratch.data() + step.scratch_offset;
    uint8_t* to = staging.data() + step.staging_offset;
    if (step.kind == Shuffle::kByte) {
      codecs::unshuffle(from, step.size, step.typesize, to);
    } else if (step.kind == Shuffle::kBit) {
      bit_unshuffle(from, step.size, step.typesize, to);
    } else {
      std::memcpy(to, from, step.size);
    }
  }
  for (size_t c = 0; c < plan.chunks.size(); ++c) {
    const PlannedChunk& chunk = plan.chunks[c];
    if (chunk.kind == ChunkKind::kHost)
      decode_host_chunk(plan, static_cast<uint32_t>(c), staging.data() + chunk.staging_offset);
  }
  for (const Copy& copy : plan.copies) {
    std::memcpy(out + copy.output_offset, staging.data() + copy.staging_offset, copy.size);
  }
  if (plan.byteswap_unit > 1 || plan.booleans) {
    for (const Copy& copy : plan.copies) {
      uint8_t* first = out + copy.output_offset;
      if (plan.byteswap_unit > 1) codecs::byteswap(first, copy.size / plan.byteswap_unit, plan.byteswap_unit);
      if (plan.booleans) {
        for (size_t i = 0; i < copy.size; ++i) first[i] = first[i] != 0;
      }
    }
  }
}

}  // namespace torch_shards::io::decode_plan
