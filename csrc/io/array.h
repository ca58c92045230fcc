// An on-disk N-D array read by rows (axis 0): the one abstraction HDF5 and
// zarr datasets, dense matrices and the three arrays of a CSR matrix share.
//
// Reads are lists of segments: "rows [source, source + length) of the array
// go to rows [dest, dest + length) of the output". Segments come sorted by
// source (a row may be asked for more than once, e.g. by weighted sampling);
// destinations never overlap. Implementations coalesce nearby segments into
// large reads, decode each chunk once per call, and write every row straight
// to its destination.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/function_ref.h"
#include "core/thread_pool.h"
#include "io/dtype.h"
#include "io/file.h"

namespace torch_shards::io {

struct Segment {
  int64_t source = 0;
  int64_t length = 0;
  int64_t dest = 0;
};

struct ArrayInfo {
  std::string file;  // the file, or the zarr store directory
  std::string path;  // the dataset / array inside it, e.g. "/X/data"
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  // shape[0] is the number of rows
  bool big_endian = false;     // stored byte order; reads return native order
};

class Array {
 public:
  explicit Array(ArrayInfo info);
  virtual ~Array() = default;

  const ArrayInfo& info() const { return info_; }
  int64_t num_rows() const { return info_.shape.empty() ? 1 : info_.shape[0]; }
  // Elements and bytes of one row (the product of shape[1:]).
  int64_t row_elements() const { return row_elements_; }
  size_t row_bytes() const { return static_cast<size_t>(row_elements_) * dtype_size(info_.dtype); }
  // "file:path", for messages.
  std::string where() const { return info_.file + ":" + info_.path; }

  // Reads the segments into `out`, row-major, native byte order, bools as 0/1.
  // Throws InvalidArgument for rows outside the array and ReadError (naming
  // the file and path) for anything wrong on disk.
  void read(const std::vector<Segment>& segments, void* out, core::ThreadPool& pool) const;
  // Consecutive rows stored together in a mapped file, as read() returns them.
  struct InPlace {
    std::shared_ptr<const File> file;  // holds the mapping
    const uint8_t* bytes = nullptr;
    int64_t rows = 0;
  };
  // Rows [source, source + length) where they are stored, when they all lie
  // in mapped local files as read() returns them (raw, in native byte order,
  // not bool): `pieces` (cleared first) then covers them in order and true is
  // returned; a caller uses them without copying them first. False otherwise
  // (compressed, read by copy, behind URLs, a chunk never written...): the
  // caller reads a copy, and read() raises whatever is wrong. The bytes may
  // be read only inside use_in_place.
  bool find_in_place(int64_t source, int64_t length, std::vector<InPlace>& pieces) const;
  // Runs work(), which reads find_in_place's pieces of rows [source, source +
  // length): a fault in the mapping (the file shrank, its storage failed)
  // abandons it where it stands and raises a ReadError naming the rows.
  // work() may throw; it must hold nothing that needs destroying.
  void use_in_place(int64_t source, int64_t length, core::FunctionRef<void()> work) const;
  // Convenience: rows [begin, end) into a new buffer.
  std::vector<uint8_t> read_range(int64_t begin, int64_t end, core::ThreadPool& pool) const;
  // Adds the files that reads of this array use and that stay open (in this
  // process, so far): a reader checks them once a unit is read
  // (check_files_unchanged). None for arrays in memory.
  virtual void open_files(std::vector<const File*>& /*files*/) const {}
  // Adds the files this array's reads rest on, stamped when the array was
  // opened (a zarr array's metadata file, an HDF5 file).
  virtual void opened_stamps(FileStamps& /*stamps*/) const {}
  // Whether reads are requests to a server (objects behind URLs): a read
  // then costs a round trip, so callers read in few large calls rather than
  // in many small ones.
  virtual bool remote() const { return false; }
  // Whether a read of `segments` would first open objects not open yet in this process, each a wait
  // on round trips (zarr shards behind URLs); open_for opens them, together. A caller reading several
  // arrays (a CSR matrix's values and indices) opens what they need at once before reading them.
  virtual bool opens_for(const std::vector<Segment>& /*segments*/) const { return false; }
  virtual void open_for(const std::vector<Segment>& /*segments*/) const {}

 protected:
  virtual void read_raw(const std::vector<Segment>& segments, uint8_t* out, core::ThreadPool& pool) const = 0;
  // find_in_place for rows inside the array, stored in native byte order, not bool.
  virtual bool find_raw_in_place(int64_t /*source*/, int64_t /*length*/, std::vector<InPlace>& /*pieces*/) const {
    return false;
  }

  ArrayInfo info_;
  int64_t row_elements_ = 1;
};

// Segments reading rows[i] into output row dests[i], sorted by source row,
// with runs that are consecutive in both source and destination merged.
// `sorted`, when not null, holds the positions of `rows` in ascending row
// order (the planner's: they are then not sorted again).
std::vector<Segment> segments_for_rows(const std::vector<int64_t>& rows, const std::vector<int64_t>& dests,
                                       const std::vector<int64_t>* sorted = nullptr);
// Segments reading rows[i] into output row i (delivery order).
std::vector<Segment> segments_in_delivery_order(const std::vector<int64_t>& rows,
                                                const std::vector<int64_t>* sorted = nullptr);

// Consecutive segments grouped into one read when the rows between them cost
// less to read through than a separate request: from the page cache a request
// costs about as much as copying 16 KiB.
constexpr size_t kMaxGapBytes = 16 << 10;
constexpr size_t kMaxSpanBytes = 32 << 20;
struct Span {
  int64_t begin = 0, end = 0;  // source rows
  size_t first = 0, last = 0;  // segments [first, last)
};
std::vector<Span> plan_spans(const std::vector<Segment>& segments, size_t row_bytes, size_t max_gap_bytes,
                             size_t max_span_bytes);

// Reads the rows of a span from a region of `file` holding rows contiguously
// from byte `region_offset` (its row 0), and puts the span's segments in
// place: straight into `out` when the span is exactly one segment or the file
// is mapped, else through a buffer holding the span. streaming: `out` is
// written with non-temporal stores (see streams_output). what() names the
// bytes in an error message (called only for one).
void read_span(const File& file, int64_t region_offset, const Span& span, const std::vector<Segment>& segments,
               size_t row_bytes, uint8_t* out, core::FunctionRef<std::string()> what, bool streaming = false);
// Reads every span as read_span does, all requested together: for objects
// behind URLs, where a request costs a round trip.
void read_spans_together(const File& file, int64_t region_offset, const std::vector<Span>& spans,
                         const std::vector<Segment>& segments, size_t row_bytes, uint8_t* out,
                         core::FunctionRef<std::string()> what);

// Whether a read of `segments` writes enough, in rows that fill whole lines
// (core::streams), that its output is read only once it has left the
// caches: it is then streamed out.
bool streams_output(const std::vector<Segment>& segments, size_t row_bytes);

// Bytes held in memory (small datasets, e.g. HDF5 compact layout).
class MemoryArray : public Array {
 public:
  MemoryArray(ArrayInfo info, std::vector<uint8_t> bytes);

 protected:
  void read_raw(const std::vector<Segment>& segments, uint8_t* out, core::ThreadPool& pool) const override;

 private:
  std::vector<uint8_t> bytes_;
};

}  // namespace torch_shards::io
