#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "loader/sources/collection_source.h"

#include <ATen/ops/sparse_csr_tensor.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <stdexcept>

#include "core/errors.h"
#include "core/scratch_buffer.h"
#include "io/dtype.h"
#include "loader/sources/array_tensors.h"

namespace torch_shards::sources {

using core::check_argument;

namespace {

// The rows one part delivers: its local rows, their rows in the collection's
// request (CSR order) and their destinations in the dense outputs (when the
// request has its own; else their rows in the request are).
struct PartRows {
  size_t part = 0;
  std::vector<int64_t> local;
  std::vector<int64_t> order;
  std::vector<int64_t> dests;
  std::vector<int64_t> sorted;  // positions in `local` in ascending row order, when the request has its own
  std::unique_ptr<PlannedRead> read;
  // Where its rows landed in the dense outputs.
  const std::vector<int64_t>& rows_in_output() const { return dests.empty() ? order : dests; }
};

using UnitedColumn = CollectionSource::UnitedColumn;

// The categorical columns whose codes part `part` writes in codes of its own.
std::vector<const UnitedColumn*> columns_to_map(const std::vector<UnitedColumn>& columns, size_t part) {
  std::vector<const UnitedColumn*> mapped;
  for (const UnitedColumn& column : columns) {
    if (column.categorical && !column.tables[part].empty()) mapped.push_back(&column);
  }
  return mapped;
}

// Maps the codes a part wrote into `codes` (a dense int64 output: its rows
// of it) to the union's, in place.
void map_part_codes(const UnitedColumn& column, const PartRows& part, const at::Tensor& codes) {
  int64_t* data = codes.data_ptr<int64_t>();
  const std::vector<int64_t>& table = column.tables[part.part];
  for (const int64_t row : part.rows_in_output()) data[row] = united_code(data[row], table, column.kind.name);
}

int64_t offset_at(const at::Tensor& offsets, int64_t i) {
  return offsets.scalar_type() == at::kInt ? offsets.const_data_ptr<int32_t>()[i]
                                           : offsets.const_data_ptr<int64_t>()[i];
}

// The CSR row pointer of the collection's rows (request order) from the
// number of values of each part's rows (length(p, i): part p's row i),
// written into `offsets` (int32 or int64) and returned.
template <typename Length>
std::vector<int64_t> merged_row_offsets(const std::vector<PartRows>& parts, int64_t rows, at::Tensor& offsets,
                                        Length&& length) {
  std::vector<int64_t> row_offsets(static_cast<size_t>(rows) + 1, 0);
  for (size_t p = 0; p < parts.size(); ++p) {
    for (size_t i = 0; i < parts[p].order.size(); ++i) row_offsets[parts[p].order[i] + 1] = length(p, i);
  }
  for (int64_t i = 0; i < rows; ++i) row_offsets[i + 1] += row_offsets[i];
  write_row_offsets(row_offsets, offsets);
  return row_offsets;
}

// A CSR field whose parts write their rows straight into the final arrays
// (each part's CsrRead, claimed).
at::Tensor place_csr(const std::vector<PartRows>& parts, const std::vector<CsrRead*>& reads, int64_t rows,
                     int64_t columns, at::Tensor offsets, at::Tensor out_columns, at::Tensor out_values,
                     ReadContext& context) {
  const std::vector<int64_t> row_offsets = merged_row_offsets(parts, rows, offsets, [&](size_t p, size_t i) {
    const std::vector<int64_t>& part = reads[p]->plan.row_offsets;
    return part[i + 1] - part[i];
  });
  // Column indices stored narrower than the output's (annbatch's uint16): each part places them as
  // stored, checked, in per-thread memory that stays in cache, and one sequential pass widens them all
  // into the output. Converted straight into their scattered places in the output instead, they cost
  // up to three times as much a row in the VM's slow memory phases.
  const io::DType stored = reads.front()->matrix->index_dtype();
  bool staged = io::dtype_size(stored) < static_cast<size_t>(out_columns.element_size());
  for (const CsrRead* read : reads) staged = staged && read->matrix->index_dtype() == stored;
  thread_local core::ScratchBuffer staging;
  void* raw_columns = staged ? staging.get(static_cast<size_t>(row_offsets.back()) * io::dtype_size(stored)) : nullptr;
  std::vector<int64_t> starts;
  for (size_t p = 0; p < parts.size(); ++p) {
    starts.resize(parts[p].order.size());
    for (size_t i = 0; i < starts.size(); ++i) starts[i] = row_offsets[parts[p].order[i]];
    reads[p]->fill_placed(starts, out_columns, out_values, context, raw_columns);
  }
  if (staged) reads.front()->widen_columns(raw_columns, out_columns);
  return at::sparse_csr_tensor(offsets, out_columns, out_values, {rows, columns},
                               out_values.options().layout(at::kSparseCsr));
}

// A CSR field merged from the parts' staged CSR tensors into the final arrays.
at::Tensor merge_csr(const std::vector<PartRows>& parts, const std::vector<at::Tensor>& staged, int64_t rows,
                     int64_t columns, at::Tensor offsets, at::Tensor out_columns, at::Tensor out_values,
                     core::ThreadPool& pool) {
  std::vector<at::Tensor> crows;
  for (const at::Tensor& part : staged) crows.push_back(part.crow_indices());
  const std::vector<int64_t> row_offsets = merged_row_offsets(parts, rows, offsets, [&](size_t p, size_t i) {
    return offset_at(crows[p], static_cast<int64_t>(i) + 1) - offset_at(crows[p], static_cast<int64_t>(i));
  });
  constexpr int64_t kRowsPerTask = 1024;
  std::vector<std::pair<size_t, int64_t>> tasks;  // (part, first row of the task)
  for (size_t p = 0; p < parts.size(); ++p) {
    for (int64_t first = 0; first < static_cast<int64_t>(parts[p].order.size()); first += kRowsPerTask) {
      tasks.emplace_back(p, first);
    }
  }
  const size_t value_size = out_values.element_size();
  pool.parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t t) {
    const auto [p, first] = tasks[static_cast<size_t>(t)];
    const at::Tensor& part = staged[p];
    const at::Tensor crow = part.crow_indices(), cols = part.col_indices(), vals = part.values();
    const auto* values_in = static_cast<const uint8_t*>(vals.const_data_ptr());
    auto* values_out = static_cast<uint8_t*>(out_values.data_ptr());
    const int64_t end = std::min<int64_t>(first + kRowsPerTask, static_cast<int64_t>(parts[p].order.size()));
    for (int64_t i = first; i < end; ++i) {
      const int64_t source = offset_at(crow, i), length = offset_at(crow, i + 1) - source;
      const int64_t dest = row_offsets[parts[p].order[i]];
      std::memcpy(values_out + dest * value_size, values_in + source * value_size, length * value_size);
      if (cols.scalar_type() == out_columns.scalar_type()) {
        const size_t index_size = cols.element_size();
        std::memcpy(static_cast<uint8_t*>(out_columns.data_ptr()) + dest * index_size,
                    static_cast<const uint8_t*>(cols.const_data_ptr()) + source * index_size, length * index_size);
      } else {  // an int32 part into int64 arrays
        const int32_t* in = cols.const_data_ptr<int32_t>() + source;
        std::copy(in, in + length, out_columns.data_ptr<int64_t>() + dest);
      }
    }
  });
  return at::sparse_csr_tensor(offsets, out_columns, out_values, {rows, columns},
                               out_values.options().layout(at::kSparseCsr));
}

// All rows from one part: its read is the collection's.
class SinglePartRead : public PlannedRead {
 public:
  SinglePartRead(std::vector<PartRows> parts, const std::vector<UnitedColumn>& columns) : parts_(std::move(parts)) {
    outputs_ = parts_.front().read->outputs();
    for (const UnitedColumn* column : columns_to_map(columns, parts_.front().part)) {
      for (size_t i = 0; i < outputs_.size(); ++i) {
        if (outputs_[i].field == column->kind.name && outputs_[i].part == OutputSpec::Part::kDense) {
          mapped_.emplace_back(i, column);
        }
      }
    }
  }
  Batch fill(const std::vector<at::Tensor>& tensors, ReadContext& context) override {
    Batch batch = parts_.front().read->fill(tensors, context);
    for (const auto& [output, column] : mapped_) map_part_codes(*column, parts_.front(), tensors[output]);
    return batch;
  }
  CsrRead* shared_csr(const std::string& field) override { return parts_.front().read->shared_csr(field); }
  void open_files(std::vector<const io::File*>& files) const override { parts_.front().read->open_files(files); }
  bool waits_on_requests() const override { return parts_.front().read->waits_on_requests(); }

 private:
  std::vector<PartRows> parts_;                                 // one; its rows are referred to by its read
  std::vector<std::pair<size_t, const UnitedColumn*>> mapped_;  // (output, column) whose codes are mapped
};

class CollectionRead : public PlannedRead {
 public:
  CollectionRead(const std::vector<FieldSpec>& fields, const std::vector<UnitedColumn>& columns,
                 std::vector<PartRows> parts, const RowRequest& request)
      : fields_(fields), columns_(columns), parts_(std::move(parts)), rows_(static_cast<int64_t>(request.rows.size())) {
    const int64_t out_rows = request.num_out_rows();
    // The final outputs: a dense field once, written by every part; a CSR field's three arrays.
    for (const FieldSpec& field : fields_) {
      if (!field.sparse_csr) {
        std::vector<int64_t> shape{out_rows};
        shape.insert(shape.end(), field.row_shape.begin(), field.row_shape.end());
        outputs_.push_back(OutputSpec{field.name, OutputSpec::Part::kDense, TensorSpec{shape, field.dtype}});
        continue;
      }
      // Index dtypes may differ between parts (int32 where they fit): merged as the widest.
      int64_t nnz = 0;
      bool wide = false;
      for (const PartRows& part : parts_) {
        for (const OutputSpec& output : part.read->outputs()) {
          if (output.field != field.name) continue;
          if (output.part == OutputSpec::Part::kCsrColumns) nnz += output.tensor.shape.at(0);
          wide |= output.part == OutputSpec::Part::kCsrOffsets && output.tensor.dtype == at::kLong;
        }
      }
      wide |= nnz > std::numeric_limits<int32_t>::max();
      const at::ScalarType index = wide ? at::kLong : at::kInt;
      outputs_.push_back(OutputSpec{field.name, OutputSpec::Part::kCsrOffsets, TensorSpec{{rows_ + 1}, index}});
      outputs_.push_back(OutputSpec{field.name, OutputSpec::Part::kCsrColumns, TensorSpec{{nnz}, index}});
      outputs_.push_back(OutputSpec{field.name, OutputSpec::Part::kCsrValues, TensorSpec{{nnz}, field.dtype}});
    }
  }

  Batch fill(const std::vector<at::Tensor>& tensors, ReadContext& context) override {
    std::map<std::string, at::Tensor> dense;
    std::map<std::string, std::vector<at::Tensor>> csr;
    for (size_t i = 0; i < outputs_.size(); ++i) {
      if (outputs_[i].part == OutputSpec::Part::kDense) {
        dense[outputs_[i].field] = tensors[i];
      } else {
        csr[outputs_[i].field].push_back(tensors[i]);
      }
    }
    // CSR fields every part writes straight into the final arrays; the
    // others' parts are staged, together, in recycled memory, then merged.
    std::map<std::string, std::vector<CsrRead*>> placed;
    for (const auto& [name, arrays] : csr) {
      std::vector<CsrRead*> reads;
      for (PartRows& part : parts_) {
        CsrRead* read = part.read->shared_csr(name);
        if (read == nullptr) break;
        reads.push_back(read);
      }
      if (reads.size() != parts_.size()) continue;
      for (CsrRead* read : reads) read->claimed = true;
      placed[name] = std::move(reads);
    }
    const auto staged_output = [&](const OutputSpec& output) {
      return output.part != OutputSpec::Part::kDense && placed.count(output.field) == 0;
    };
    std::vector<TensorSpec> staging_specs;
    for (const PartRows& part : parts_) {
      for (const OutputSpec& output : part.read->outputs()) {
        if (staged_output(output)) staging_specs.push_back(output.tensor);
      }
    }
    std::vector<at::Tensor> staging = context.tensors.scratch(staging_specs);
    std::map<std::string, std::vector<at::Tensor>> staged;  // per merged CSR field, one sparse tensor per part
    size_t next = 0;
    for (PartRows& part : parts_) {
      std::vector<at::Tensor> inputs;
      for (const OutputSpec& output : part.read->outputs()) {
        inputs.push_back(output.part == OutputSpec::Part::kDense ? dense.at(output.field)
                         : staged_output(output)                 ? staging[next++]
                                                                 : at::Tensor());
      }
      Batch batch = part.read->fill(inputs, context);
      for (const UnitedColumn* column : columns_to_map(columns_, part.part)) {
        map_part_codes(*column, part, dense.at(column->kind.name));
      }
      for (const auto& [name, arrays] : csr) {
        if (placed.count(name) == 0) staged[name].push_back(batch.at(name));
      }
    }
    Batch out;
    for (const FieldSpec& field : fields_) {
      if (!field.sparse_csr) {
        out.insert(field.name, dense.at(field.name));
        continue;
      }
      const std::vector<at::Tensor>& arrays = csr.at(field.name);
      const int64_t columns = field.row_shape.at(0);
      out.insert(field.name, placed.count(field.name) ? place_csr(parts_, placed.at(field.name), rows_, columns,
                                                                  arrays[0], arrays[1], arrays[2], context)
                                                      : merge_csr(parts_, staged.at(field.name), rows_, columns,
                                                                  arrays[0], arrays[1], arrays[2], context.pool));
    }
    return out;
  }

  void open_files(std::vector<const io::File*>& files) const override {
    for (const PartRows& part : parts_) part.read->open_files(files);
  }

  bool waits_on_requests() const override {
    return std::any_of(parts_.begin(), parts_.end(),
                       [](const PartRows& part) { return part.read->waits_on_requests(); });
  }

 private:
  const std::vector<FieldSpec>& fields_;
  const std::vector<UnitedColumn>& columns_;
  std::vector<PartRows> parts_;
  int64_t rows_;
};

// The fix when the parts differ only in the layout of a field (a dense and a CSR matrix).
std::string layout_hint(const std::vector<FieldSpec>& first, const std::vector<FieldSpec>& other) {
  if (first.size() != other.size()) return "";
  std::string names;
  for (size_t f = 0; f < first.size(); ++f) {
    FieldSpec relaid = other[f];
    relaid.sparse_csr = first[f].sparse_csr;
    if (!(relaid == first[f])) return "";
    if (other[f].sparse_csr != first[f].sparse_csr) names += (names.empty() ? "'" : ", '") + first[f].name + "'";
  }
  return core::concat(": ", names,
                      " is sparse CSR in one and dense in the other; open the AnnData sources with dense=True "
                      "(AnnDataSource(path, dense=True) or torch_shards.open(paths, dense=True)) to read every part "
                      "densely");
}

// Why two parts' fields differ when they hold the same fields in another order.
std::string order_hint(std::vector<FieldSpec> first, std::vector<FieldSpec> other) {
  const auto by_name = [](const FieldSpec& a, const FieldSpec& b) { return a.name < b.name; };
  std::sort(first.begin(), first.end(), by_name);
  std::sort(other.begin(), other.end(), by_name);
  if (first != other) return "";
  return ": the same fields in another order; give every source its fields in one order (batches are laid out "
         "by it)";
}

// A category as a key that is equal for equal JSON values (2 and 2.0 are one, as nlohmann's == has them).
std::string category_key(const nlohmann::json& value) {
  using Type = nlohmann::json::value_t;
  constexpr double kTwo63 = 9223372036854775808.0;
  switch (value.type()) {
    case Type::string:
      return "s" + value.get_ref<const std::string&>();
    case Type::number_integer:
      return "i" + std::to_string(value.get<int64_t>());
    case Type::number_unsigned: {
      const auto number = value.get<uint64_t>();
      return number <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                 ? "i" + std::to_string(static_cast<int64_t>(number))
                 : "u" + std::to_string(number);
    }
    case Type::number_float: {
      const auto number = value.get<double>();
      if (std::isfinite(number) && number == std::trunc(number)) {
        if (number >= -kTwo63 && number < kTwo63) return "i" + std::to_string(static_cast<int64_t>(number));
        if (number >= kTwo63 && number < 2 * kTwo63) return "u" + std::to_string(static_cast<uint64_t>(number));
      }
      return "f" + value.dump();
    }
    case Type::boolean:
      return value.get<bool>() ? "b1" : "b0";
    case Type::null:
      return "n";
    default:
      return "j" + value.dump();
  }
}

// How a part delivers an obs column, for the message refusing two kinds.
std::string kind_words(bool categorical) {
  return categorical ? "categorical (int64 codes into categories)" : "not categorical (values as stored)";
}

}  // namespace

std::vector<int64_t> CategoryUnion::add(const nlohmann::json& categories) {
  std::vector<int64_t> table(categories.size());
  bool same = true;
  for (size_t i = 0; i < categories.size(); ++i) {
    const auto [found, added] =
        codes_.try_emplace(category_key(categories[i]), static_cast<int64_t>(categories_.size()));
    if (added) categories_.push_back(categories[i]);
    table[i] = found->second;
    same = same && table[i] == static_cast<int64_t>(i);
  }
  if (same) table.clear();
  return table;
}

void throw_code_past_table(int64_t code, size_t categories, const std::string& column) {
  throw core::ReadError(core::concat("Collection: obs column '", column, "': code ", code, " is past the ", categories,
                                     " categories it was read with"));
}

CollectionSource::CollectionSource(std::vector<std::shared_ptr<const Source>> parts) : parts_(std::move(parts)) {
  check_argument(!parts_.empty(), "Collection: needs at least one source");
  fields_ = parts_.front()->fields();
  offsets_.push_back(0);
  for (const auto& part : parts_) offsets_.push_back(offsets_.back() + part->num_rows());
  // Before the fields: a column categorical in one part and numeric in another is named as such.
  unite_obs_columns();
  for (size_t p = 0; p < parts_.size(); ++p) {
    const auto fields = parts_[p]->fields();
    if (fields != fields_) {
      std::string expected, got;
      for (const auto& field : fields_) expected += (expected.empty() ? "" : ", ") + field.describe();
      for (const auto& field : fields) got += (got.empty() ? "" : ", ") + field.describe();
      throw core::InvalidArgument(core::concat("Collection: source ", p, " (", parts_[p]->describe(), ") has fields {",
                                               got, "} but source 0 (", parts_.front()->describe(), ") has {", expected,
                                               "}", layout_hint(fields_, fields), order_hint(fields_, fields)));
    }
  }
}

// The int64 codes of a categorical (or string) obs column index each file's
// own categories (anndata writes only the values a file holds): the
// collection reads them as codes into the union of its parts' categories.
// Only the parts with rows count (an empty file's categories are often none
// at all), or all of them when none has rows.
void CollectionSource::unite_obs_columns() {
  std::vector<size_t> coded;
  for (size_t p = 0; p < parts_.size(); ++p) {
    if (parts_[p]->num_rows() > 0) coded.push_back(p);
  }
  if (coded.empty()) {
    coded.resize(parts_.size());
    std::iota(coded.begin(), coded.end(), 0);
  }
  std::vector<std::optional<std::vector<ObsColumnKind>>> kinds(parts_.size());
  for (size_t p = 0; p < parts_.size(); ++p) {
    kinds[p] = parts_[p]->obs_column_kinds();
    has_obs_ |= kinds[p].has_value();
  }
  const auto kind_in = [&](size_t p, const std::string& name) -> const ObsColumnKind* {
    if (!kinds[p]) return nullptr;
    for (const ObsColumnKind& kind : *kinds[p]) {
      if (kind.name == name) return &kind;
    }
    return nullptr;
  };
  std::map<std::string, size_t> seen;
  for (const size_t p : coded) {
    if (!kinds[p]) continue;
    for (const ObsColumnKind& kind : *kinds[p]) {
      if (!seen.try_emplace(kind.name, obs_columns_.size()).second) continue;
      UnitedColumn& column = obs_columns_.emplace_back();
      column.kind = kind;
      column.kind.categories = nullptr;
      column.kind.where = core::concat("[", p, "]", kind.where);
      column.categorical = kind.categorical();
      if (column.categorical) column.tables.resize(parts_.size());
    }
  }
  for (UnitedColumn& column : obs_columns_) {
    const std::string& name = column.kind.name;
    CategoryUnion united;
    for (const size_t p : coded) {
      const ObsColumnKind* kind = kind_in(p, name);
      if (kind == nullptr) {
        // A part without that obs column: the fields differ (named below), unless it has a field of that
        // name (a tensor's): not codes.
        const std::vector<FieldSpec> fields = parts_[p]->fields();
        if (std::none_of(fields.begin(), fields.end(), [&](const FieldSpec& field) { return field.name == name; })) {
          continue;
        }
      }
      const bool categorical = kind != nullptr && kind->categorical();
      if (categorical != column.categorical) {
        const std::string here = kind ? core::concat("sources[", p, "]", kind->where, " (", kind->file,
                                                     ", encoding-type '", kind->encoding, "')")
                                      : core::concat("sources[", p, "] (", parts_[p]->describe(),
                                                     ": a field of that name, not an obs column)");
        throw core::InvalidArgument(core::concat(
            "Collection: obs column '", name, "' is ", kind_words(column.categorical), " in sources", column.kind.where,
            " (", column.kind.file, ", encoding-type '", column.kind.encoding, "') and ", kind_words(categorical),
            " in ", here,
            ": one column is read one way in every file; store it as a categorical (or strings) in every file, or as "
            "values in every file"));
      }
      if (categorical) column.tables[p] = united.add(*kind->categories);
    }
    if (column.categorical) column.categories = std::move(united).release();
  }
}

std::optional<std::vector<ObsColumnKind>> CollectionSource::obs_column_kinds() const {
  if (!has_obs_) return std::nullopt;
  std::vector<ObsColumnKind> kinds;
  for (const UnitedColumn& column : obs_columns_) {
    ObsColumnKind& kind = kinds.emplace_back(column.kind);
    if (column.categorical) kind.categories = &column.categories;
  }
  return kinds;
}

nlohmann::json CollectionSource::categories(const std::string& column) const {
  check_argument(has_obs_, "Collection.categories: the collection holds no AnnDataSource");
  for (const UnitedColumn& united : obs_columns_) {
    if (united.kind.name != column) continue;
    check_argument(united.categorical, "Collection.categories: ", united.kind.file, ": obs column '", column,
                   "' is not categorical");
    return united.categories;
  }
  std::string listed;
  for (const UnitedColumn& united : obs_columns_) listed += (listed.empty() ? "'" : ", '") + united.kind.name + "'";
  throw core::InvalidArgument(core::concat("Collection.categories: '", column,
                                           "' is not an obs column the collection reads (obs=[", listed,
                                           "]); pass it in obs= when opening the sources"));
}

std::unique_ptr<PlannedRead> CollectionSource::plan(const RowRequest& request, ReadContext& context) const {
  // A collection of one source: its rows and codes (its categories are the union) are the collection's.
  if (parts_.size() == 1 && columns_to_map(obs_columns_, 0).empty()) return parts_.front()->plan(request, context);
  const std::vector<int64_t>& rows = request.rows;
  // Each row's part, then each part's rows (in request order) in vectors of their final size.
  std::vector<uint32_t> part_of(rows.size());
  std::vector<int64_t> counts(parts_.size(), 0);
  for (size_t i = 0; i < rows.size(); ++i) {
    // The last part starting at or before the row: a binary search without branches (a row's part is
    // as good as random in a shuffled fetch).
    size_t part = 0;
    for (size_t left = parts_.size(); left > 1;) {
      const size_t half = left / 2;
      part = offsets_[part + half] <= rows[i] ? part + half : part;
      left -= half;
    }
    part_of[i] = static_cast<uint32_t>(part);
    ++counts[part];
  }
  std::vector<PartRows> parts;
  std::vector<size_t> slot(parts_.size());
  for (size_t p = 0; p < parts_.size(); ++p) {
    if (counts[p] == 0) continue;
    slot[p] = parts.size();
    PartRows& part = parts.emplace_back();
    part.part = p;
    part.local.reserve(static_cast<size_t>(counts[p]));
    part.order.reserve(static_cast<size_t>(counts[p]));
    if (request.dests) part.dests.reserve(static_cast<size_t>(counts[p]));
  }
  std::vector<int64_t> index_in_part(request.sorted ? rows.size() : 0);
  for (size_t i = 0; i < rows.size(); ++i) {
    PartRows& part = parts[slot[part_of[i]]];
    if (request.sorted) index_in_part[i] = static_cast<int64_t>(part.local.size());
    part.local.push_back(rows[i] - offsets_[part.part]);
    part.order.push_back(static_cast<int64_t>(i));
    if (request.dests) part.dests.push_back((*request.dests)[i]);
  }
  // The request's positions in ascending row order, split by part, are each part's in its own rows'
  // ascending order (a part holds one range of the collection's rows): its reads sort nothing.
  if (request.sorted) {
    for (PartRows& part : parts) part.sorted.reserve(part.local.size());
    if (request.sorted->size() != rows.size()) {
      throw std::logic_error(
          core::concat("Collection: ", request.sorted->size(), " sorted positions for ", rows.size(), " rows"));
    }
    for (const int64_t i : *request.sorted) {
      const auto k = static_cast<size_t>(i);
      if (k >= rows.size())
        throw std::logic_error(core::concat("Collection: sorted position ", i, " of ", rows.size()));
      parts[slot[part_of[k]]].sorted.push_back(index_in_part[k]);
    }
  }
  // The rows of each part are read by the part straight into their places (its CSR arrays, in request order).
  for (PartRows& part : parts) {
    // Without destinations, request row i lands in row i: a part's are its rows' order.
    const std::vector<int64_t>* dests = request.dests ? &part.dests : &part.order;
    const std::vector<int64_t>* sorted = request.sorted ? &part.sorted : nullptr;
    part.read = parts_[part.part]->plan(RowRequest{part.local, dests, request.num_out_rows(), sorted}, context);
  }
  if (parts.size() == 1) return std::make_unique<SinglePartRead>(std::move(parts), obs_columns_);
  return std::make_unique<CollectionRead>(fields_, obs_columns_, std::move(parts), request);
}

int64_t CollectionSource::sparse_row_bytes() const {
  double bytes = 0;  // an estimate: sums of bytes * rows may pass 2^63
  for (const auto& part : parts_) bytes += static_cast<double>(part->sparse_row_bytes()) * part->num_rows();
  return static_cast<int64_t>(bytes / static_cast<double>(std::max<int64_t>(1, num_rows())));
}

std::string CollectionSource::describe() const {
  std::string text = core::concat("Collection(", parts_.size(), " sources, ", num_rows(), " rows: ");
  for (size_t p = 0; p < parts_.size(); ++p) text += (p ? ", " : "") + parts_[p]->describe();
  return text + ")";
}

}  // namespace torch_shards::sources
