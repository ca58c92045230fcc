#include "loader/sources/source.h"

#include <c10/util/Exception.h>

#include <sstream>

#include "core/errors.h"
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

Batch PlannedRead::fill_checked(const std::vector<at::Tensor>& tensors, ReadContext& context, int64_t since) {
  Batch batch;
  try {
    batch = fill(tensors, context);
  } catch (const std::exception&) {
    check_unchanged(since);
    throw;
  }
  check_unchanged(since);
  return batch;
}

void Source::check_same_files(const io::FileStamps& first) const {
  io::FileStamps mine;
  opened_stamps(mine);
  for (const auto& [path, digest] : first) {
    const auto found = mine.find(path);
    if (found == mine.end() || found->second == digest) continue;
    throw core::ReadError(core::concat(path,
                                       ": the file changed since the dataset opened it in the main process "
                                       "(replaced or written since): this process would read other contents "
                                       "than the others; open the dataset again once the file is written"));
  }
}

Batch Source::read(const std::vector<int64_t>& rows, ReadContext& context) const {
  const int64_t since = io::use_clock();
  std::unique_ptr<PlannedRead> planned = plan(RowRequest{rows}, context);
  return planned->fill_checked(context.tensors.allocate(tensor_specs(planned->outputs())), context, since);
}

std::vector<TensorSpec> tensor_specs(const std::vector<OutputSpec>& outputs) {
  std::vector<TensorSpec> specs;
  specs.reserve(outputs.size());
  for (const OutputSpec& output : outputs) specs.push_back(output.tensor);
  return specs;
}

}  // namespace torch_shards::sources
