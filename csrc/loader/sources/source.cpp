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

}  // namespace torch_shards::sources
