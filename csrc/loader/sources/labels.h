// Class labels of every row of a source, for ClassBalancedSampling(label_key=...):
// read from a field of the source or, for AnnData, from any obs column.
#pragma once

#include <ATen/core/Tensor.h>

#include <nlohmann/json.hpp>
#include <string>

#include "loader/sources/source.h"

namespace torch_shards::sources {

struct Labels {
  at::Tensor codes;  // int64, one per row; -1 where the label is missing
  // What the codes mean (a categorical's or a string column's categories), or null for integers.
  nlohmann::json categories;
};

// Throws InvalidArgument naming the source and the column if it holds no
// labels (missing, not 1-D, or floating point).
Labels read_labels(const Source& source, const std::string& name);

}  // namespace torch_shards::sources
