// A Source is a row-addressable dataset: N rows, a few named fields, each
// field a tensor whose first dimension is the row (dense, or a sparse CSR
// matrix). Readers hand it the rows of one unit of work (in delivery order,
// possibly repeated) and get back one tensor per field with exactly those
// rows, in that order.
//
// A read has two steps, so that every output tensor of a unit can be carved
// out of one allocation (one recycled storage; one shared-memory segment for
// DataLoader workers): plan() reads what decides the sizes (a CSR matrix's
// row offsets) and declares the outputs; PlannedRead::fill() writes the rows
// straight into them, in their final order.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/streaming_copy.h"
#include "core/thread_pool.h"
#include "loader/tensor_pool.h"

namespace torch_shards::sources {

using Batch = c10::Dict<std::string, at::Tensor>;

struct CsrRead;  // loader/sources/array_tensors.h

}  // namespace torch_shards::sources

namespace torch_shards::io {
class File;  // io/file.h
using FileStamps = std::map<std::string, uint64_t>;
}  // namespace torch_shards::io

namespace torch_shards::sources {

// What a read runs on: the threads, and where output tensors come from.
struct ReadContext {
  core::ThreadPool& pool;
  TensorPool& tensors;
  // Whether a read writing rows of `row_bytes` into an output of
  // `output_bytes` writes them with non-temporal stores: core::streams, the
  // output crossing to another process when its memory does
  // (TensorPool::crosses: its consumer reads it only after many more units
  // are written there, never from this process's caches).
  bool streams(size_t output_bytes, size_t row_bytes) const {
    return core::streams(output_bytes, row_bytes, tensors.crosses());
  }
};

struct FieldSpec {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> row_shape;  // shape of one row (sparse CSR: {columns})
  bool sparse_csr = false;
  bool operator==(const FieldSpec& other) const {
    return name == other.name && dtype == other.dtype && row_shape == other.row_shape && sparse_csr == other.sparse_csr;
  }
  std::string describe() const;  // "X: float32[2000] (sparse CSR)"
};

// One output tensor of a read: a dense field, or one array of a sparse CSR field.
struct OutputSpec {
  enum class Part { kDense, kCsrOffsets, kCsrColumns, kCsrValues };
  std::string field;
  Part part = Part::kDense;
  TensorSpec tensor;
};

// The rows of a read: rows[i] lands in row dests[i] of the dense outputs
// (row i when dests is null), which have out_rows rows (rows.size() when
// negative). Sparse CSR outputs always hold the rows in the order of `rows`:
// the caller places them. `sorted`, when not null, holds the positions of
// `rows` in ascending row order, as the planner knows them from its shuffle.
struct RowRequest {
  const std::vector<int64_t>& rows;
  const std::vector<int64_t>* dests = nullptr;
  int64_t out_rows = -1;
  const std::vector<int64_t>* sorted = nullptr;
  int64_t num_out_rows() const { return out_rows >= 0 ? out_rows : static_cast<int64_t>(rows.size()); }
  int64_t dest(size_t i) const { return dests ? (*dests)[i] : static_cast<int64_t>(i); }
  // The positions of `rows` in ascending row order, for reads in source
  // order: `sorted` when given, else sorted here into `order` (`scratch`:
  // working memory).
  const std::vector<int64_t>& positions_by_row(std::vector<int64_t>& order, std::vector<int64_t>& scratch) const;
};

// A read whose outputs are known and not yet written (it refers to the
// request's rows: they must outlive it).
class PlannedRead {
 public:
  virtual ~PlannedRead() = default;
  // The tensors fill() writes, in order.
  const std::vector<OutputSpec>& outputs() const { return outputs_; }
  // Writes the rows into `tensors` (uninitialised, one per output, in order;
  // they may be views of one storage) and returns the batch: one tensor per
  // field, CSR fields assembled from their three outputs.
  virtual Batch fill(const std::vector<at::Tensor>& tensors, ReadContext& context) = 0;
  // The read of sparse CSR field `field` where this read can write its rows
  // into arrays it shares with other reads (a collection's parts into the
  // collection's arrays, with no staging and merging), else nullptr. Once
  // that read is claimed (CsrRead::claimed), fill() leaves the field out of
  // its batch and does not touch the tensors of its outputs (they may be
  // undefined): CsrRead::fill_placed() writes it.
  virtual CsrRead* shared_csr(const std::string& /*field*/) { return nullptr; }
  // Adds the open files this read reads from (io::Array::open_files): once
  // the read is filled, the caller checks those it used unchanged
  // (check_unchanged), so that rows of a file rewritten meanwhile are never
  // delivered.
  virtual void open_files(std::vector<const io::File*>& /*files*/) const {}
  // Whether the next read like this one would wait on requests to a server (io::Array::remote of what
  // it reads): false once a remote store's objects are all held whole in the node-local cache.
  virtual bool waits_on_requests() const { return false; }
  // Throws io's ReadError if a file this read used at or after `since`
  // (io::use_clock(), taken before the read was planned) changed.
  void check_unchanged(int64_t since) const;
  // fill(), then check_unchanged(since): how readers fill. A fill that
  // throws is checked first (a file changed mid-read may fail a check of
  // what was read, e.g. a category code out of range: the change is what to
  // report).
  Batch fill_checked(const std::vector<at::Tensor>& tensors, ReadContext& context, int64_t since);

 protected:
  std::vector<OutputSpec> outputs_;
};

// An obs column a source delivers, as a collection needs to know it to give
// its parts' codes one meaning (Source::obs_column_kinds).
struct ObsColumnKind {
  std::string name;
  std::string encoding;                        // anndata's encoding-type ("categorical", "string-array", "array", ...)
  const nlohmann::json* categories = nullptr;  // what its int64 codes mean (owned by the source), or null: not codes
  std::string file;                            // the file it is read from (a collection's: its first part's)
  std::string where;                           // where that file's source sits in this one: "" itself, "[1][0]"
  bool categorical() const { return categories != nullptr; }
};

class Source {
 public:
  virtual ~Source() = default;
  virtual int64_t num_rows() const = 0;
  virtual std::vector<FieldSpec> fields() const = 0;
  // Plans reading the request's rows (the row offsets of CSR fields are read
  // here, on the context's pool).
  virtual std::unique_ptr<PlannedRead> plan(const RowRequest& request, ReadContext& context) const = 0;
  // Canonical description (type, files and their sizes, fields, shapes).
  virtual std::string describe() const = 0;
  // The files its reads rest on, with their stamps from when it opened them
  // (io::Array::opened_stamps): a process that opens the source again (a
  // spawned DataLoader worker) compares its own with the first process's
  // (check_same_files).
  virtual void opened_stamps(io::FileStamps& /*stamps*/) const {}
  // Throws io's ReadError naming the first file whose stamp differs from
  // `first` (another process's opened_stamps of this source).
  void check_same_files(const io::FileStamps& first) const;
  // The obs columns it delivers (an AnnData source's; a collection's, their
  // categories united), or nullopt for a source without obs.
  virtual std::optional<std::vector<ObsColumnKind>> obs_column_kinds() const { return std::nullopt; }
  // Output bytes of an average row of its sparse CSR fields (values, column
  // indices and a row offset), from the sizes of what is stored; 0 without
  // any. A reader admits its first pieces under prefetch_bytes by it, before
  // any has been read (EpochReader).
  virtual int64_t sparse_row_bytes() const { return 0; }

  // One tensor per field, row i of each holding source row rows[i]: plan,
  // one allocation from the context's TensorPool, fill.
  Batch read(const std::vector<int64_t>& rows, ReadContext& context) const;
  std::vector<std::string> field_names() const;
};

std::vector<TensorSpec> tensor_specs(const std::vector<OutputSpec>& outputs);

// A read of `rows` rows of `source`, for an error allocating its output: the
// source (Source::describe, cut short for a long collection), the rows asked
// for and the bytes of a row's dense fields.
std::string describe_read(const Source& source, int64_t rows);

}  // namespace torch_shards::sources
