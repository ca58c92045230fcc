// The plan of one fetch of a zarr array whose chunks a GPU decodes (issue 49,
// decode_on="device"): which compressed pieces to decompress (a batch of
// lz4 / zstd / deflate streams, as nvCOMP's batched decompressors take
// them), where each lands, which blocks to unshuffle, and which decoded bytes
// to copy to which place of the output. Built on the host from the array's
// metadata and the fetched chunk bytes; executed by the CPU reference
// (cpu_executor.h, tests) or on a device (not here: see docs/guide/gpu.md).
//
// Buffers an executor needs, all bytes:
//   input    DecodePlan::input, uploaded as is (every fetched chunk, one after another)
//   scratch  scratch_bytes: decompressed blocks still shuffled
//   staging  staging_bytes: every needed chunk decoded, in C order, chunk after chunk
//   output   output_bytes: rows of row_bytes, row `dest` of each segment
// Steps, in order: fill chunks (fills), decompress pieces (input -> scratch
// or staging), unshuffle blocks (scratch -> staging), host chunks (decoded on
// the host, uploaded to staging), copies (staging -> output), then the
// output's post-steps (byteswap_unit, booleans), as Array::read does them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "io/array.h"
#include "io/chunked_array.h"
#include "io/zarr/metadata.h"

namespace torch_shards::io::decode_plan {

// What decompresses a piece: nvCOMP's batched LZ4 (raw lz4 blocks, as blosc
// stores them; lz4hc writes the same format), Zstd (one frame), Deflate (raw
// RFC 1951: zlib and gzip wrappers are stripped by the planner), or a copy.
enum class PieceCodec : uint8_t { kCopy, kLz4, kZstd, kDeflate };

// The check a piece's wrapper carries over its decompressed bytes, made by
// the CPU executor (a device executor may skip it: zarr-python does not check them either).
enum class PieceCheck : uint8_t { kNone, kAdler32, kCrc32 };

enum class Shuffle : uint8_t { kNone, kByte, kBit };

struct Piece {
  PieceCodec codec = PieceCodec::kCopy;
  uint64_t input_offset = 0, input_size = 0;    // compressed bytes in its chunk's DecodePlan::inputs
  bool to_scratch = false;                      // lands in scratch (to be unshuffled), else in staging
  uint64_t output_offset = 0, output_size = 0;  // decompressed bytes, exactly
  PieceCheck check = PieceCheck::kNone;
  uint32_t expected = 0;  // the wrapper's checksum
  uint32_t chunk = 0;     // index in DecodePlan::chunks
};

// One blosc block: scratch [scratch_offset, + size) unshuffled into staging [staging_offset, + size).
struct Unshuffle {
  Shuffle kind = Shuffle::kByte;
  uint32_t typesize = 1;
  uint64_t scratch_offset = 0, staging_offset = 0, size = 0;
};

enum class ChunkKind : uint8_t {
  kDevice,  // decoded by pieces (and unshuffles)
  kFill,    // never written: every element is the fill value
  kHost,    // a codec the device cannot decode: decoded on the host (host_reason says why)
};

struct PlannedChunk {
  std::vector<int64_t> coords;  // in the grid of read chunks (inner chunks when sharded)
  ChunkKind kind = ChunkKind::kDevice;
  // Where those bytes lie in their file, when the store can say (file chunks, shards): for messages and
  // for executors that read files themselves. file_offset is -1 otherwise.
  std::string file;
  int64_t file_offset = -1;
  uint64_t staging_offset = 0;  // chunk_bytes decoded bytes
  std::string host_reason;      // kHost: why (for the one-time notice)
};

// Bytes staging [staging_offset, + size) to output [output_offset, + size).
struct Copy {
  uint64_t staging_offset = 0, output_offset = 0, size = 0;
};

struct DecodePlan {
  std::string where;  // "store:/path", for messages
  size_t item_size = 1, chunk_bytes = 0, row_bytes = 0;
  // Each chunk's stored bytes as fetched (empty for fills): kept apart, never joined into one copy.
  std::vector<std::vector<uint8_t>> inputs;
  // Of making the plan, the microseconds spent fetching those bytes and planning (checking) the chunks;
  // the rest of its time is the serial work around them.
  int64_t fetch_us = 0, check_us = 0;
  std::vector<PlannedChunk> chunks;
  std::vector<Piece> pieces;
  std::vector<Unshuffle> unshuffles;
  std::vector<Copy> copies;
  uint64_t scratch_bytes = 0, staging_bytes = 0, output_bytes = 0;
  std::vector<uint8_t> fill_value;  // one element, stored byte order
  // Output post-steps: reverse each unit of byteswap_unit bytes (0: none),
  // then bytes of booleans become 0 or 1.
  size_t byteswap_unit = 0;
  bool booleans = false;
  // Decodes host chunks (the reader's own decoder for this array).
  std::shared_ptr<const ChunkDecoder> host_decoder;

  // Whether the device decodes every chunk (fills included): else the
  // array falls back to the host path, with fallback_reason() as its notice.
  bool all_on_device() const;
  uint64_t input_bytes() const;  // the sum of inputs' sizes
  // A piece's compressed bytes (in its chunk's input); logic_error if it lies outside them.
  const uint8_t* piece_input(const Piece& piece) const;
  std::string fallback_reason() const;
};

// "store:/path: chunk (i, j)", for messages about plan.chunks[chunk].
std::string chunk_where(const DecodePlan& plan, uint32_t chunk);

// Plans fetches of one numeric zarr array (v2, v3, v3 shards).
class DecodePlanner {
 public:
  explicit DecodePlanner(zarr::ZarrMetadata meta);
  static DecodePlanner open(const std::string& store, const std::string& path);

  const zarr::ZarrMetadata& metadata() const { return meta_; }
  // Whether zstd and deflate streams go to the device without a checksum over them (a crc32c codec after
  // the compressor, checked on the host). Off by default: nvCOMP 6's zstd decoder faulted the GPU on a
  // frame whose block content was overwritten, and its deflate decoder wrote past its output on one
  // (structure checks cannot see inside those blocks; stream_checks.h). LZ4 is checked whole and always goes.
  void trust_unverified(bool trust) { trust_unverified_ = trust; }

  // Non-empty when no chunk of the array can be decoded on the device (its
  // codec chain: transposes, two compressors, ...): every chunk is then kHost.
  const std::string& array_fallback() const { return array_fallback_; }

  // The plan of Array::read(segments) (same segments: rows [source, +length) to output rows [dest, +length)):
  // fetches the chunks they need (together where the store reads them together). Throws ReadError naming the
  // chunk for a corrupt one (a frame whose layout cannot be right, a crc32c that does not match).
  DecodePlan plan(const std::vector<Segment>& segments, core::ThreadPool& pool) const;

 private:
  void plan_chunk(DecodePlan& plan, uint32_t index) const;

  zarr::ZarrMetadata meta_;
  std::shared_ptr<const ChunkStore> store_;
  std::shared_ptr<const ChunkDecoder> host_decoder_;
  std::vector<int64_t> chunk_shape_, grid_;
  size_t chunk_bytes_ = 0;
  std::string array_fallback_;
  int compressor_ = -1;  // index in meta_.chain.bytes_codecs of the one compressor, -1: none
  bool trust_unverified_ = false;
};

const char* piece_codec_name(PieceCodec codec);

// Why a chunk of unverified zstd or deflate streams is decoded on the host (DecodePlanner::trust_unverified).
extern const char* const kUnverifiedReason;

}  // namespace torch_shards::io::decode_plan
