// Arrays stored as a regular grid of encoded chunks (HDF5 chunked layout,
// zarr v2 and v3, zarr v3 shards). Where a chunk's bytes are is a ChunkStore;
// how they are encoded is a ChunkDecoder. A read decodes every chunk it needs
// once, in parallel, and copies each requested row straight to its
// destination.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/function_ref.h"
#include "io/array.h"
#include "io/blosc_ranges.h"

namespace torch_shards::io {

// Where a chunk's stored bytes lie in a file.
struct ChunkLocation {
  std::shared_ptr<const File> file;
  int64_t offset = 0;
  int64_t size = 0;
};

class ChunkStore {
 public:
  virtual ~ChunkStore() = default;
  // Whether locate() works: chunks stored raw can then be read in parts.
  virtual bool can_locate() const { return false; }
  // Whether located chunks lie in long-lived mapped files (zarr shards): they
  // are then decoded from the mapping, never copied.
  virtual bool maps_chunks() const { return false; }
  // Whether located chunks lie in files kept open that may be mapped (an
  // HDF5 file, zarr shards), whose raw bytes can then be used where they lie;
  // false where each locate() opens a file read by copy (zarr chunk files).
  virtual bool locates_in_kept_files() const { return maps_chunks(); }
  // The file and byte range of a chunk, or nullopt if it was never written.
  virtual std::optional<ChunkLocation> locate(const std::vector<int64_t>& coords) const;
  // The encoded bytes of the chunk at grid coordinates `coords`, or nullopt
  // if it was never written (the array's fill value stands in for it).
  virtual std::optional<std::vector<uint8_t>> read_chunk(const std::vector<int64_t>& coords) const = 0;
  // Whether chunks lie in objects that are opened when first read, each a wait on round trips
  // (zarr shards behind URLs), and some are not open yet: a read then opens those it needs together
  // first (open).
  virtual bool opens_objects() const { return false; }
  // Whether reading these chunks would open objects not open in this process yet.
  virtual bool opens(const std::vector<std::vector<int64_t>>& /*coords*/) const { return false; }
  // Opens the objects reading these chunks needs that are not open yet, together.
  virtual void open(const std::vector<std::vector<int64_t>>& /*coords*/) const {}
  // Whether a read fetches its chunks together (read_chunks) rather than
  // each when decoded: objects behind URLs, where each request costs a round
  // trip and many can be in flight at once.
  virtual bool reads_together() const { return false; }
  // read_chunk of each of `coords`, fetched together: located chunks by one
  // File::read_ranges per file (the files at once), others one by one.
  virtual std::vector<std::optional<std::vector<uint8_t>>> read_chunks(const std::vector<std::vector<int64_t>>& coords,
                                                                       core::ThreadPool& pool) const;
  // Where the chunk lives, for messages ("chunk (3, 0) at offset 1234").
  virtual std::string describe_chunk(const std::vector<int64_t>& coords) const;
  // Bit i set: filter i of the pipeline was not applied to this chunk (HDF5
  // skips optional filters that do not help); 0 for formats without masks.
  virtual uint32_t skipped_filters(const std::vector<int64_t>& /*coords*/) const { return 0; }
  // The files of this store that stay open (Array::open_files).
  virtual void open_files(std::vector<const File*>& /*files*/) const {}
  // Array::opened_stamps.
  virtual void opened_stamps(FileStamps& /*stamps*/) const {}
};

class ChunkDecoder {
 public:
  virtual ~ChunkDecoder() = default;
  // True when decoding is the identity (no filters or codecs, no transpose):
  // a chunk's rows are then read straight from the file, only those needed.
  virtual bool stores_raw() const { return false; }
  // Decodes one chunk into exactly out_bytes bytes: the whole chunk's
  // elements in C order, in the array's stored byte order. May reuse
  // `encoded` as scratch.
  virtual void decode(std::vector<uint8_t>& encoded, uint8_t* out, size_t out_bytes) const = 0;
  // Decoders of pipelines with optional stages honour the chunk's mask.
  virtual void decode(std::vector<uint8_t>& encoded, uint8_t* out, size_t out_bytes,
                      uint32_t /*skipped_filters*/) const {
    decode(encoded, out, out_bytes);
  }
  // Whether decode_view() works: the pipeline can decode from bytes it must
  // not modify (a file's mapping), for chunks without skipped filters.
  virtual bool decodes_views() const { return false; }
  // Decodes one chunk as decode() does, straight from `encoded`, into out()
  // (asked for once what check_encoded checks has passed, so that a corrupt
  // header allocates nothing). Only where decodes_views().
  virtual void decode_view(const uint8_t* /*encoded*/, size_t /*size*/, size_t /*out_bytes*/,
                           core::FunctionRef<uint8_t*()> /*out*/) const {
    throw std::logic_error("this chunk decoder cannot decode from a view");
  }
  // Whether decode_view_ranges() works: the pipeline decodes parts of a
  // chunk from a view without decoding all of it (blosc's lz4 frames).
  virtual bool decodes_ranges() const { return false; }
  // Writes byte ranges of the decoded chunk (out_bytes in all) straight from
  // `encoded` to each range's output. Only where decodes_ranges(). trusted
  // and the result as codecs::decompress_blosc_ranges: true when the call
  // checked the whole chunk; trusted chunks (checked before, same bytes) are
  // decoded only as far as the ranges need.
  virtual bool decode_view_ranges(const uint8_t* /*encoded*/, size_t /*size*/, size_t /*out_bytes*/,
                                  const std::vector<codecs::ByteRange>& /*ranges*/, bool /*trusted*/) const {
    throw std::logic_error("this chunk decoder cannot decode parts of a chunk");
  }
  // Throws (std::runtime_error) unless `encoded` can decode to out_bytes as
  // far as its headers tell: called before memory is allocated for it.
  virtual void check_encoded(const std::vector<uint8_t>& /*encoded*/, size_t /*out_bytes*/,
                             uint32_t /*skipped_filters*/) const {}
};

// The number of chunks of a grid (chunks along each dimension), or cap + 1
// when there are more (no overflow): for tables kept per chunk.
int64_t chunk_count_capped(const std::vector<int64_t>& grid, int64_t cap);

class ChunkedArray : public Array {
 public:
  // fill_value: the bytes of one element (stored byte order) for missing chunks.
  ChunkedArray(ArrayInfo info, std::vector<int64_t> chunk_shape, std::shared_ptr<const ChunkStore> store,
               std::shared_ptr<const ChunkDecoder> decoder, std::vector<uint8_t> fill_value);

  const std::vector<int64_t>& chunk_shape() const { return chunk_shape_; }
  void open_files(std::vector<const File*>& files) const override { store_->open_files(files); }
  void opened_stamps(FileStamps& stamps) const override { store_->opened_stamps(stamps); }
  bool remote() const override { return store_->reads_together(); }
  bool opens_for(const std::vector<Segment>& segments) const override;
  void open_for(const std::vector<Segment>& segments) const override;

 protected:
  void read_raw(const std::vector<Segment>& segments, uint8_t* out, core::ThreadPool& pool) const override;
  // Chunks of whole rows stored raw at known places of mapped files: a piece per chunk the rows touch.
  bool find_raw_in_place(int64_t source, int64_t length, std::vector<InPlace>& pieces) const override;

 private:
  // Reads only the requested rows of chunks stored raw (see ChunkDecoder::stores_raw).
  void read_raw_chunk_rows(int64_t chunk_row, const std::vector<const Segment*>& touching, uint8_t* out,
                           bool streaming) const;
  // Runs use(bytes, size) on the chunk at `coords` where it lies in its
  // file's mapping (a fault there is a ReadError naming the chunk); false
  // when the store does not map chunks, the chunk skips filters, or it was
  // never written (the caller then reads or fills it).
  bool use_mapped_chunk(const std::vector<int64_t>& coords, core::FunctionRef<void(const uint8_t*, size_t)> use) const;
  // Decodes the rows of the chunk at `coords` that `touching` wants (its
  // rows [first_row, end_row)) straight into the output, from the mapping
  // (ChunkDecoder::decode_view_ranges); false as use_mapped_chunk. A chunk
  // is decoded whole the first time, then trusted (checked_chunks_).
  bool decode_rows_from_mapping(const std::vector<int64_t>& coords, int64_t first_row, int64_t end_row,
                                const std::vector<const Segment*>& touching, uint8_t* out) const;
  // The same from the chunk's bytes wherever they are: with_bytes(use) runs use(bytes, size) on them and
  // returns true, or returns false (running nothing) when it has none.
  bool decode_rows_from(const std::vector<int64_t>& coords, int64_t first_row, int64_t end_row,
                        const std::vector<const Segment*>& touching, uint8_t* out,
                        core::FunctionRef<bool(core::FunctionRef<void(const uint8_t*, size_t)>)> with_bytes) const;
  // Copies row `row_in_chunk` of a decoded chunk at inner grid position
  // `inner_coords` into its place in an output row.
  void copy_row_part(const uint8_t* chunk, int64_t row_in_chunk, const std::vector<int64_t>& inner_coords,
                     uint8_t* out_row) const;
  // The grid coordinates of every chunk a read of `segments` touches.
  std::vector<std::vector<int64_t>> chunks_of(const std::vector<Segment>& segments) const;

  std::vector<int64_t> chunk_shape_;
  std::vector<int64_t> grid_;  // chunks along each dimension
  int64_t inner_chunks_ = 1;   // chunks per chunk-row (product of grid_[1:])
  size_t chunk_bytes_ = 0;
  std::shared_ptr<const ChunkStore> store_;
  std::shared_ptr<const ChunkDecoder> decoder_;
  std::vector<uint8_t> fill_value_;
  bool whole_rows_ = false;  // a chunk holds whole rows (no inner dimension is split)
  // This process's bits, one per chunk (linear grid index): the chunk's
  // mapped bytes were checked whole by decode_view_ranges. Null for grids of
  // more than kMaxCheckedChunks chunks (always checked then).
  std::atomic<uint64_t>* checked_chunks() const;
  static constexpr int64_t kMaxCheckedChunks = int64_t{1} << 26;  // 8 MiB of bits
  // Made per process (a forked child may map files replaced since): its
  // first partial decode in a process makes them.
  mutable std::atomic<int> checked_pid_{0};
  mutable std::unique_ptr<std::atomic<uint64_t>[]> checked_chunks_;
};

}  // namespace torch_shards::io
