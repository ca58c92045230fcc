#include "loader/sources/source.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace torch_shards::sources {

std::string FieldSpec::describe() const {
  std::ostringstream out;
  out << name << ": " << c10::toString(dtype) << "[";
  for (size_t i = 0; i < row_shape.size(); ++i) out << (i ? ", " : "") << row_shape[i];
  out << "]" << (sparse_csr ? " (sparse CSR)" : "");
  return out.str();
}

std::vector<std::string> Source::field_names() const {
  std::vector<std::string> names;
  for (const FieldSpec& field : fields()) names.push_back(field.name);
  return names;
}

Batch Source::read(const std::vector<int64_t>& rows, ReadContext& context) const {
  std::unique_ptr<PlannedRead> planned = plan(RowRequest{rows}, context);
  return planned->fill(context.tensors.allocate(tensor_specs(planned->outputs())), context);
}

std::vector<TensorSpec> tensor_specs(const std::vector<OutputSpec>& outputs) {
  std::vector<TensorSpec> specs;
  specs.reserve(outputs.size());
  for (const OutputSpec& output : outputs) specs.push_back(output.tensor);
  return specs;
}

}  // namespace torch_shards::sources
