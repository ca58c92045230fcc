// A Source is a row-addressable dataset: N rows, a few named fields, each
// field a tensor whose first dimension is the row. Readers hand it the rows of
// one unit of work (in delivery order, possibly repeated) and get back one
// tensor per field with exactly those rows, in that order.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torch_shards::io {

using Batch = c10::Dict<std::string, at::Tensor>;

class Source {
 public:
  virtual ~Source() = default;
  virtual int64_t num_rows() const = 0;
  virtual std::vector<std::string> field_names() const = 0;
  // One tensor per field, row i of each holding source row rows[i].
  virtual Batch read(const std::vector<int64_t>& rows) const = 0;
  // Canonical description (type, files and their sizes, fields, shapes).
  virtual std::string describe() const = 0;
};

}  // namespace torch_shards::io
