#include "io/decode_plan/decode_plan.h"

#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <stdexcept>
#include <utility>

#include "core/errors.h"
#include "core/stopwatch.h"
#include "io/blosc_ranges.h"
#include "io/codecs.h"
#include "io/decode_plan/stream_checks.h"
#include "io/zarr/chunk_decoding.h"
#include "io/zarr/chunk_stores.h"
#include "io/zarr/fill_value.h"

namespace torch_shards::io::decode_plan {

using core::concat;
using zarr::BytesCodec;

namespace {

uint32_t read_be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

// A chunk the device cannot decode: the reason, for the notice.
struct HostOnly {
  std::string reason;
};

// The raw deflate data of a zlib stream (RFC 1950), its Adler-32 trailer
// expected; nullopt for what the planner leaves to the host (a preset
// dictionary, a header it does not understand: the host reports those).
struct Wrapped {
  size_t begin = 0, end = 0;
  uint32_t expected = 0;
};

std::optional<Wrapped> unwrap_zlib(const uint8_t* in, size_t size) {
  if (size < 6) return std::nullopt;
  const unsigned cmf = in[0], flg = in[1];
  if ((cmf & 0x0f) != 8 || (cmf >> 4) > 7 || (cmf * 256 + flg) % 31 != 0 || (flg & 0x20)) return std::nullopt;
  return Wrapped{2, size - 4, read_be32(in + size - 4)};
}

// The deflate data of a one-member gzip stream (RFC 1952) of decoded_size bytes, its CRC-32 expected.
std::optional<Wrapped> unwrap_gzip(const uint8_t* in, size_t size, size_t decoded_size) {
  if (size < 18 || in[0] != 0x1f || in[1] != 0x8b || in[2] != 8) return std::nullopt;
  const uint8_t flags = in[3];
  if (flags & 0xe0) return std::nullopt;
  size_t at = 10;
  if (flags & 0x04) {  // FEXTRA
    if (at + 2 > size) return std::nullopt;
    at += 2 + (size_t{in[at]} | size_t{in[at + 1]} << 8);
  }
  for (uint8_t flag : {uint8_t{0x08}, uint8_t{0x10}}) {  // FNAME, FCOMMENT: zero-terminated
    if (!(flags & flag)) continue;
    while (at < size && in[at] != 0) ++at;
    ++at;
  }
  if (flags & 0x02) at += 2;  // FHCRC
  if (at + 8 > size) return std::nullopt;
  // A stream of several members records the last one's size: the host decodes those.
  if (codecs::read_le32(in + size - 4) != static_cast<uint32_t>(decoded_size)) return std::nullopt;
  return Wrapped{at, size - 8, codecs::read_le32(in + size - 8)};
}

int64_t product(const std::vector<int64_t>& values, size_t from) {
  int64_t result = 1;
  for (size_t d = from; d < values.size(); ++d) result *= values[d];
  return result;
}

}  // namespace

const char* const kUnverifiedReason =
    "nvCOMP's zstd and deflate decoders can fault the GPU on damaged data (an illegal memory access, which loses "
    "the process's CUDA context), so the host decodes them; trust_unverified=True hands them to the device";

const char* piece_codec_name(PieceCodec codec) {
  switch (codec) {
    case PieceCodec::kCopy:
      return "copy";
    case PieceCodec::kLz4:
      return "lz4";
    case PieceCodec::kZstd:
      return "zstd";
    case PieceCodec::kDeflate:
      return "deflate";
  }
  return "?";
}

std::string chunk_where(const DecodePlan& plan, uint32_t chunk) {
  std::string coords;
  for (int64_t c : plan.chunks[chunk].coords) coords += (coords.empty() ? "" : ", ") + std::to_string(c);
  return concat(plan.where, ": chunk (", coords, ")");
}

const uint8_t* DecodePlan::piece_input(const Piece& piece) const {
  if (piece.chunk >= inputs.size() || piece.input_offset + piece.input_size > inputs[piece.chunk].size()) {
    throw std::logic_error(concat(chunk_where(*this, piece.chunk), ": a piece outside its chunk's bytes"));
  }
  return inputs[piece.chunk].data() + piece.input_offset;
}

uint64_t DecodePlan::input_bytes() const {
  uint64_t sum = 0;
  for (const std::vector<uint8_t>& input : inputs) sum += input.size();
  return sum;
}

bool DecodePlan::all_on_device() const {
  return std::none_of(chunks.begin(), chunks.end(), [](const PlannedChunk& c) { return c.kind == ChunkKind::kHost; });
}

std::string DecodePlan::fallback_reason() const {
  for (const PlannedChunk& chunk : chunks) {
    if (chunk.kind == ChunkKind::kHost) return concat(where, ": ", chunk.host_reason);
  }
  return "";
}

DecodePlanner::DecodePlanner(zarr::ZarrMetadata meta) : meta_(std::move(meta)) {
  if (meta_.kind != zarr::ElementKind::kNumeric) {
    throw core::Unsupported(concat(meta_.where, ": '", meta_.type_name, "' is a string type (read it as strings)"));
  }
  if (meta_.shape.empty()) throw core::InvalidArgument(concat(meta_.where, ": 0-d arrays are not supported"));
  chunk_shape_ = meta_.read_chunk_shape();
  for (size_t d = 0; d < meta_.shape.size(); ++d) {
    grid_.push_back(chunk_shape_[d] > 0 ? (meta_.shape[d] + chunk_shape_[d] - 1) / chunk_shape_[d] : 0);
  }
  chunk_bytes_ = static_cast<size_t>(product(chunk_shape_, 0)) * meta_.item_size;
  store_ = zarr::make_chunk_store(meta_);
  host_decoder_ = zarr::make_chunk_decoder(meta_.chain, chunk_shape_, meta_.item_size);
  const zarr::CodecChain& chain = meta_.chain;
  if (!chain.transposes.empty()) {
    array_fallback_ = "a transpose (or Fortran order) the device does not undo";
    return;
  }
  for (size_t i = 0; i < chain.bytes_codecs.size(); ++i) {
    if (chain.bytes_codecs[i] == BytesCodec::kCrc32c) {
      if (compressor_ < 0 && i > 0) array_fallback_ = "a crc32c checksum inside the chunk's decoded bytes";
      continue;
    }
    if (compressor_ >= 0) {
      array_fallback_ = concat("two compressors (", zarr::bytes_codec_name(chain.bytes_codecs[compressor_]), ", ",
                               zarr::bytes_codec_name(chain.bytes_codecs[i]), ")");
      return;
    }
    compressor_ = static_cast<int>(i);
  }
  if (compressor_ > 0) array_fallback_ = "a crc32c checksum inside the chunk's decoded bytes";
}

DecodePlanner DecodePlanner::open(const std::string& store, const std::string& path) {
  return DecodePlanner(zarr::read_metadata(store, path));
}

DecodePlan DecodePlanner::plan(const std::vector<Segment>& segments, core::ThreadPool& pool) const {
  DecodePlan plan;
  plan.where = meta_.where;
  plan.item_size = meta_.item_size;
  plan.chunk_bytes = chunk_bytes_;
  plan.row_bytes = static_cast<size_t>(product(meta_.shape, 1)) * meta_.item_size;
  plan.fill_value = zarr::numeric_fill_bytes(meta_);
  plan.host_decoder = host_decoder_;
  const size_t unit = dtype_swap_unit(meta_.dtype);
  plan.byteswap_unit = meta_.chain.big_endian && unit > 1 ? unit : 0;
  plan.booleans = meta_.dtype == DType::kBool;
  const int64_t rows = meta_.shape[0];
  for (const Segment& segment : segments) {
    if (segment.source < 0 || segment.length < 0 || segment.source + segment.length > rows) {
      throw core::InvalidArgument(concat(meta_.where, ": rows [", segment.source, ", ", segment.source + segment.length,
                                         ") outside [0, ", rows, ")"));
    }
    plan.output_bytes =
        std::max<uint64_t>(plan.output_bytes, static_cast<uint64_t>(segment.dest + segment.length) * plan.row_bytes);
  }
  if (plan.row_bytes == 0) return plan;

  // What one row of a chunk row gives each place of an output row: per inner
  // chunk (grid coordinates over dimensions 1..), runs along the last dimension.
  const size_t dims = meta_.shape.size();
  struct Part {
    std::vector<int64_t> inner;  // grid coordinates, dimensions 1..
    std::vector<Copy> runs;      // staging offsets relative to the chunk's row, output ones to the row
  };
  std::vector<Part> parts;
  {
    std::vector<int64_t> inner_grid(grid_.begin() + 1, grid_.end()), inner(dims - 1, 0);
    std::vector<int64_t> out_stride(dims, 1), chunk_stride(dims, 1);
    for (size_t d = dims - 1; d-- > 0;) {
      out_stride[d] = out_stride[d + 1] * meta_.shape[d + 1];
      chunk_stride[d] = chunk_stride[d + 1] * chunk_shape_[d + 1];
    }
    const size_t item = meta_.item_size;
    for (bool more = product(inner_grid, 0) > 0; more;) {
      Part part{inner, {}};
      if (dims == 1) {
        part.runs.push_back(Copy{0, 0, item});
      } else {
        std::vector<int64_t> extent(dims, 1);
        for (size_t d = 1; d < dims; ++d) {
          extent[d] = std::min(chunk_shape_[d], meta_.shape[d] - inner[d - 1] * chunk_shape_[d]);
        }
        std::vector<int64_t> local(dims, 0);  // over dimensions 1 .. dims-2; runs along dims-1
        for (;;) {
          int64_t staging = 0, out = 0;
          for (size_t d = 1; d < dims; ++d) {
            staging += local[d] * chunk_stride[d];
            out += (inner[d - 1] * chunk_shape_[d] + local[d]) * out_stride[d];
          }
          part.runs.push_back(Copy{static_cast<uint64_t>(staging) * item, static_cast<uint64_t>(out) * item,
                                   static_cast<uint64_t>(extent[dims - 1]) * item});
          size_t d = dims - 1;
          while (--d >= 1) {
            if (++local[d] < extent[d]) break;
            local[d] = 0;
          }
          if (d == 0) break;
        }
      }
      parts.push_back(std::move(part));
      more = false;
      for (size_t d = dims - 1; d-- > 0;) {
        if (++inner[d] < inner_grid[d]) {
          more = true;
          break;
        }
        inner[d] = 0;
      }
    }
  }

  std::map<std::vector<int64_t>, uint32_t> index_of;
  const uint64_t chunk_row_bytes = static_cast<uint64_t>(product(chunk_shape_, 1)) * meta_.item_size;
  const auto add_copy = [&](const Copy& copy) {
    if (!plan.copies.empty()) {
      Copy& last = plan.copies.back();
      if (last.staging_offset + last.size == copy.staging_offset &&
          last.output_offset + last.size == copy.output_offset) {
        last.size += copy.size;
        return;
      }
    }
    plan.copies.push_back(copy);
  };
  int64_t last_chunk_row = -1;
  std::vector<uint32_t> chunk_of_part(parts.size());  // of last_chunk_row
  // A chunk's row as wide as the array's (1-D arrays, 2-D chunks of every column): the rows of a segment
  // within one chunk row are one copy.
  const bool whole_rows = parts.size() == 1 && parts[0].runs.size() == 1 && chunk_row_bytes == plan.row_bytes &&
                          parts[0].runs[0].size == plan.row_bytes;
  for (const Segment& segment : segments) {
    const int64_t end = segment.source + segment.length;
    for (int64_t row = segment.source; row < end;) {
      const int64_t chunk_row = row / chunk_shape_[0], in_chunk = row % chunk_shape_[0];
      const int64_t span = whole_rows ? std::min(end - row, chunk_shape_[0] - in_chunk) : 1;
      const uint64_t out_row = static_cast<uint64_t>(segment.dest + row - segment.source) * plan.row_bytes;
      if (chunk_row != last_chunk_row) {
        for (size_t p = 0; p < parts.size(); ++p) {
          std::vector<int64_t> coords{chunk_row};
          coords.insert(coords.end(), parts[p].inner.begin(), parts[p].inner.end());
          auto [it, added] = index_of.emplace(std::move(coords), static_cast<uint32_t>(plan.chunks.size()));
          if (added) {
            PlannedChunk chunk;
            chunk.coords = it->first;
            chunk.staging_offset = static_cast<uint64_t>(plan.chunks.size()) * chunk_bytes_;
            plan.chunks.push_back(std::move(chunk));
          }
          chunk_of_part[p] = it->second;
        }
        last_chunk_row = chunk_row;
      }
      for (size_t p = 0; p < parts.size(); ++p) {
        const uint64_t base = plan.chunks[chunk_of_part[p]].staging_offset + in_chunk * chunk_row_bytes;
        for (const Copy& run : parts[p].runs) {
          add_copy(Copy{base + run.staging_offset, out_row + run.output_offset,
                        whole_rows ? static_cast<uint64_t>(span) * plan.row_bytes : run.size});
        }
      }
      row += span;
    }
  }
  plan.staging_bytes = static_cast<uint64_t>(plan.chunks.size()) * chunk_bytes_;

  // Fetch the chunks' bytes, together where the store reads them together.
  std::vector<std::vector<int64_t>> coords;
  coords.reserve(plan.chunks.size());
  for (const PlannedChunk& chunk : plan.chunks) coords.push_back(chunk.coords);
  std::vector<std::optional<std::vector<uint8_t>>> fetched;
  const auto fetching = std::chrono::steady_clock::now();
  if (store_->reads_together()) {
    fetched = store_->read_chunks(coords, pool);
  } else {
    fetched.resize(coords.size());
    pool.parallel_for(static_cast<int64_t>(coords.size()),
                      [&](int64_t i) { fetched[static_cast<size_t>(i)] = store_->read_chunk(coords[i]); });
  }
  plan.fetch_us = core::microseconds_since(fetching);
  const auto checking = std::chrono::steady_clock::now();
  // Each chunk planned on its own (in parallel: the checks of its streams read every byte), as a plan of that
  // chunk alone, its input the fetched bytes; then joined in chunk order.
  std::vector<DecodePlan> alone(plan.chunks.size());
  std::vector<std::string> errors(plan.chunks.size());
  pool.parallel_for(static_cast<int64_t>(plan.chunks.size()), [&](int64_t i) {
    if (!fetched[i]) return;
    DecodePlan& part = alone[i];
    part.chunks.push_back(plan.chunks[i]);
    part.inputs.push_back(std::move(*fetched[i]));
    fetched[i].reset();
    try {
      plan_chunk(part, 0);
      // Where its bytes lie (a chunk file is opened again: here, in parallel, not in the join below).
      if (store_->can_locate()) {
        if (const std::optional<ChunkLocation> location = store_->locate(part.chunks[0].coords)) {
          part.chunks[0].file = location->file ? location->file->path() : "";
          part.chunks[0].file_offset = location->offset;
        }
      }
    } catch (const std::runtime_error& error) {
      errors[i] = concat(meta_.where, ": ", store_->describe_chunk(plan.chunks[i].coords), ": ", error.what());
    }
  });
  plan.check_us = core::microseconds_since(checking);
  for (const std::string& error : errors) {
    if (!error.empty()) throw core::ReadError(error);
  }
  plan.inputs.resize(plan.chunks.size());
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    PlannedChunk& chunk = plan.chunks[i];
    DecodePlan& part = alone[i];
    if (part.chunks.empty()) {
      chunk.kind = ChunkKind::kFill;
      continue;
    }
    const uint64_t scratch = plan.scratch_bytes;
    chunk = std::move(part.chunks[0]);
    plan.inputs[i] = std::move(part.inputs[0]);  // moved, not copied: the bytes stay where they were fetched
    for (Piece piece : part.pieces) {
      if (piece.to_scratch) piece.output_offset += scratch;
      piece.chunk = static_cast<uint32_t>(i);
      plan.pieces.push_back(piece);
    }
    for (Unshuffle step : part.unshuffles) {
      step.scratch_offset += scratch;
      plan.unshuffles.push_back(step);
    }
    plan.scratch_bytes += part.scratch_bytes;
  }
  return plan;
}

void DecodePlanner::plan_chunk(DecodePlan& plan, uint32_t index) const {
  PlannedChunk& chunk = plan.chunks[index];
  if (!array_fallback_.empty()) {
    chunk.kind = ChunkKind::kHost;
    chunk.host_reason = array_fallback_;
    return;
  }
  const uint8_t* bytes = plan.inputs[index].data();
  size_t size = plan.inputs[index].size();
  const std::vector<BytesCodec>& chain = meta_.chain.bytes_codecs;
  // Checksums over the stored bytes: checked here, on the host, before anything is uploaded.
  bool verified = false;  // by a crc32c over the compressed bytes
  for (size_t i = chain.size(); i-- > static_cast<size_t>(compressor_ + 1);) {
    verified = true;
    if (size < 4) throw std::runtime_error(concat("crc32c: ", size, " bytes cannot hold a checksum"));
    size -= 4;
    const uint32_t stored = codecs::read_le32(bytes + size), computed = codecs::crc32c(bytes, size);
    if (stored != computed) {
      throw std::runtime_error(concat("crc32c checksum mismatch (stored ", stored, ", computed ", computed, ")"));
    }
  }
  const auto piece = [&](PieceCodec codec, uint64_t offset, uint64_t in_size, bool to_scratch, uint64_t out_offset,
                         uint64_t out_size, PieceCheck check = PieceCheck::kNone, uint32_t expected = 0) {
    plan.pieces.push_back(Piece{codec, offset, in_size, to_scratch, out_offset, out_size, check, expected, index});
  };
  const auto host = [&](std::string reason) {
    chunk.kind = ChunkKind::kHost;
    chunk.host_reason = std::move(reason);
  };
  const size_t pieces_before = plan.pieces.size(), unshuffles_before = plan.unshuffles.size();
  if (compressor_ < 0) {
    if (size != chunk_bytes_) throw std::runtime_error(concat("holds ", size, " bytes, expected ", chunk_bytes_));
    if (size > 0) piece(PieceCodec::kCopy, 0, size, false, chunk.staging_offset, size);
    return;
  }
  // What the device is handed is checked first (stream_checks.h): a chunk with a piece that fails is the host's.
  const auto checked = [&]() {
    for (size_t p = pieces_before; p < plan.pieces.size(); ++p) {
      const Piece& piece = plan.pieces[p];
      const uint8_t* at = plan.piece_input(piece);
      const std::string problem =
          piece.codec == PieceCodec::kLz4    ? check_lz4_block(at, piece.input_size, piece.output_size)
          : piece.codec == PieceCodec::kZstd ? check_zstd_frame(at, piece.input_size, piece.output_size)
                                             : std::string();
      if (!problem.empty() ||
          (piece.codec != PieceCodec::kLz4 && piece.codec != PieceCodec::kCopy && !verified && !trust_unverified_)) {
        plan.pieces.resize(pieces_before);
        plan.unshuffles.resize(unshuffles_before);
        if (!problem.empty()) {
          return host(concat("a malformed ", piece_codec_name(piece.codec), " stream (", problem, ")"));
        }
        return host(
            concat(piece_codec_name(piece.codec), " streams without a checksum (a crc32c codec): ", kUnverifiedReason));
      }
    }
  };
  switch (chain[compressor_]) {
    case BytesCodec::kBlosc: {
      const codecs::BloscLayout layout = codecs::blosc_layout(bytes, size, chunk_bytes_);
      if (chunk_bytes_ == 0) return;
      if (layout.stored) {
        piece(PieceCodec::kCopy, 16, chunk_bytes_, false, chunk.staging_offset, chunk_bytes_);
        return;
      }
      PieceCodec codec = PieceCodec::kCopy;
      switch (layout.compressor) {
        case 1:
          codec = PieceCodec::kLz4;
          break;
        case 3:
          codec = PieceCodec::kDeflate;
          break;
        case 4:
          codec = PieceCodec::kZstd;
          break;
        default:
          return host(concat("blosc's ", layout.compressor == 0 ? "blosclz" : "snappy",
                             " codec, which the device does not decode"));
      }
      uint64_t scratch = 0;
      bool scratch_used = false;
      for (const codecs::BloscBlock& block : layout.blocks) {
        Shuffle shuffle = Shuffle::kNone;
        if (layout.byte_shuffle) {
          shuffle = Shuffle::kByte;
        } else if (layout.bit_shuffle && block.size >= layout.typesize) {
          // Format version 2 (c-blosc 1.x) bit-unshuffles blocks of a multiple of 8 elements only.
          if (layout.version >= 3 || (block.size / layout.typesize) % 8 == 0) shuffle = Shuffle::kBit;
        }
        const bool shuffled = shuffle != Shuffle::kNone;
        if (shuffled && !scratch_used) {
          scratch = plan.scratch_bytes;
          plan.scratch_bytes += chunk_bytes_;
          scratch_used = true;
        }
        const uint64_t base = (shuffled ? scratch : chunk.staging_offset) + block.offset;
        for (size_t j = 0; j < block.streams.size(); ++j) {
          const codecs::BloscStream& stream = block.streams[j];
          const uint64_t out = base + j * block.stream_bytes;
          if (stream.stored) {
            piece(PieceCodec::kCopy, stream.offset, stream.size, shuffled, out, block.stream_bytes);
          } else if (codec == PieceCodec::kDeflate) {
            const std::optional<Wrapped> data = unwrap_zlib(bytes + stream.offset, stream.size);
            if (!data) {
              plan.pieces.resize(pieces_before);
              plan.unshuffles.resize(unshuffles_before);
              return host("a blosc zlib stream with a preset dictionary or an unknown header");
            }
            piece(codec, stream.offset + data->begin, data->end - data->begin, shuffled, out, block.stream_bytes,
                  PieceCheck::kAdler32, data->expected);
          } else {
            piece(codec, stream.offset, stream.size, shuffled, out, block.stream_bytes);
          }
        }
        if (shuffled) {
          plan.unshuffles.push_back(Unshuffle{shuffle, static_cast<uint32_t>(layout.typesize), base,
                                              chunk.staging_offset + block.offset, block.size});
        }
      }
      return checked();
    }
    case BytesCodec::kZstd: {
      // One piece per frame (nvCOMP decodes single frames), each of the size it records; a lone frame that
      // records none holds the whole chunk.
      struct Frame {
        size_t offset, size;
        unsigned long long content;
      };
      std::vector<Frame> frames;
      for (size_t at = 0; at < size;) {
        const size_t frame = ZSTD_findFrameCompressedSize(bytes + at, size - at);
        if (ZSTD_isError(frame)) return host("zstd data the planner cannot split into frames");
        const uint32_t magic = size - at >= 4 ? codecs::read_le32(bytes + at) : 0;
        if ((magic & 0xfffffff0u) != 0x184d2a50u) {  // not a skippable frame
          frames.push_back(Frame{at, frame, ZSTD_getFrameContentSize(bytes + at, size - at)});
        }
        at += frame;
      }
      uint64_t total = 0;
      for (Frame& frame : frames) {
        if (frame.content == ZSTD_CONTENTSIZE_UNKNOWN && frames.size() == 1) frame.content = chunk_bytes_;
        if (frame.content == ZSTD_CONTENTSIZE_UNKNOWN || frame.content == ZSTD_CONTENTSIZE_ERROR) {
          return host("zstd frames that do not record their decoded sizes");
        }
        total += frame.content;
      }
      if (total != chunk_bytes_)
        throw std::runtime_error(concat("zstd frames of ", total, " bytes, expected ", chunk_bytes_));
      uint64_t out = chunk.staging_offset;
      for (const Frame& frame : frames) {
        if (frame.content > 0) piece(PieceCodec::kZstd, frame.offset, frame.size, false, out, frame.content);
        out += frame.content;
      }
      return checked();
    }
    case BytesCodec::kZlib:
    case BytesCodec::kGzip: {
      const bool gzip = chain[compressor_] == BytesCodec::kGzip;
      const std::optional<Wrapped> data = gzip ? unwrap_gzip(bytes, size, chunk_bytes_) : unwrap_zlib(bytes, size);
      if (!data) return host(concat("a ", gzip ? "gzip" : "zlib", " stream the planner does not unwrap"));
      piece(PieceCodec::kDeflate, data->begin, data->end - data->begin, false, chunk.staging_offset, chunk_bytes_,
            gzip ? PieceCheck::kCrc32 : PieceCheck::kAdler32, data->expected);
      return checked();
    }
    case BytesCodec::kCrc32c:
      break;
  }
  throw std::logic_error("not a compressor");
}

}  // namespace torch_shards::io::decode_plan
