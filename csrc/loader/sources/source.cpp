#include "loader/sources/source.h"

#include <c10/util/Exception.h>

#include <sstream>

#include "core/errors.h"
#include "core/radix_sort.h"
#include "io/file.h"

namespace torch_shards::sources {

const std::vector<int64_t>& RowRequest::positions_by_row(std::vector<int64_t>& order,
                                                         std::vector<int64_t>& scratch) const {
  if (sorted != nullptr) return *sorted;
  core::sort_positions_by_row(rows, order, scratch);
  return order;
}

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
  const auto purpose = [&] { return describe_read(*this, static_cast<int64_t>(rows.size())); };
  return planned->fill_checked(context.tensors.allocate(tensor_specs(planned->outputs()), purpose), context, since);
}

std::string describe_read(const Source& source, int64_t rows) {
  constexpr size_t kMaxDescription = 2000;
  uint64_t row_bytes = 0;
  bool sparse = false, saturated = false;
  for (const FieldSpec& field : source.fields()) {
    if (field.sparse_csr) {
      sparse = true;
      continue;
    }
    uint64_t bytes = c10::elementSize(field.dtype);
    for (int64_t size : field.row_shape)
      saturated |= __builtin_mul_overflow(bytes, static_cast<uint64_t>(size), &bytes);
    saturated |= __builtin_add_overflow(row_bytes, bytes, &row_bytes);
  }
  std::string text = source.describe();
  if (text.size() > kMaxDescription) text = text.substr(0, kMaxDescription) + "...";
  return core::concat(text, ": a read of ", rows, " rows of ",
                      saturated ? std::string("2^64 or more") : std::to_string(row_bytes), " bytes",
                      sparse ? " (dense fields; sparse ones besides)" : "");
}

std::vector<TensorSpec> tensor_specs(const std::vector<OutputSpec>& outputs) {
  std::vector<TensorSpec> specs;
  specs.reserve(outputs.size());
  for (const OutputSpec& output : outputs) specs.push_back(output.tensor);
  return specs;
}

}  // namespace torch_shards::sources
