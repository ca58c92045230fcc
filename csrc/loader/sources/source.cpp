#include "loader/sources/source.h"

#include <c10/util/Exception.h>

#include <sstream>

#include "io/file.h"

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

void PlannedRead::check_unchanged(int64_t since) const {
  std::vector<const io::File*> files;
  open_files(files);
  io::check_files_unchanged(files, since);
}

Batch Source::read(const std::vector<int64_t>& rows, ReadContext& context) const {
  const int64_t since = io::use_clock();
  std::unique_ptr<PlannedRead> planned = plan(RowRequest{rows}, context);
  Batch batch = planned->fill(context.tensors.allocate(tensor_specs(planned->outputs())), context);
  planned->check_unchanged(since);
  return batch;
}

std::vector<TensorSpec> tensor_specs(const std::vector<OutputSpec>& outputs) {
  std::vector<TensorSpec> specs;
  specs.reserve(outputs.size());
  for (const OutputSpec& output : outputs) specs.push_back(output.tensor);
  return specs;
}

}  // namespace torch_shards::sources
