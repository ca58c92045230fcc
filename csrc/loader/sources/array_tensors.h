// Tensors read from io arrays: dense rows land directly in the output
// tensor's memory; CSR rows become torch sparse CSR tensors (or dense ones).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "io/array.h"
#include "io/csr_matrix.h"
#include "loader/sources/source.h"

namespace torch_shards::sources {

at::ScalarType to_scalar_type(io::DType dtype);

// Rows of `array` given by `segments` (destinations 0 .. rows-1) as a
// [rows, *array.shape[1:]] tensor of the array's dtype.
at::Tensor read_dense(const io::Array& array, const std::vector<io::Segment>& segments, int64_t rows,
                      ReadContext& context);

// Rows (delivery order) of a CSR matrix as a sparse CSR tensor of shape
// [rows, columns] (int32 indices when they fit), or densified when `dense`.
at::Tensor read_csr(const io::CsrMatrix& matrix, const std::vector<int64_t>& rows, bool dense, ReadContext& context);

}  // namespace torch_shards::sources
