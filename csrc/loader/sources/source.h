// A Source is a row-addressable dataset: N rows, a few named fields, each
// field a tensor whose first dimension is the row (dense, or a sparse CSR
// matrix). Readers hand it the rows of one unit of work (in delivery order,
// possibly repeated) and get back one tensor per field with exactly those
// rows, in that order.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "loader/tensor_pool.h"

namespace torch_shards::sources {

using Batch = c10::Dict<std::string, at::Tensor>;

// What a read runs on: the threads, and where output tensors come from.
struct ReadContext {
  core::ThreadPool& pool;
  TensorPool& tensors;
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

class Source {
 public:
  virtual ~Source() = default;
  virtual int64_t num_rows() const = 0;
  virtual std::vector<FieldSpec> fields() const = 0;
  // One tensor per field, row i of each holding source row rows[i]. Reads
  // run on the context's pool (its threads plus the calling thread) into
  // tensors from its TensorPool.
  virtual Batch read(const std::vector<int64_t>& rows, ReadContext& context) const = 0;
  // Canonical description (type, files and their sizes, fields, shapes).
  virtual std::string describe() const = 0;

  std::vector<std::string> field_names() const;
};

}  // namespace torch_shards::sources
