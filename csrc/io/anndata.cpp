#include "io/anndata.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "core/errors.h"
#include "io/chunked_array.h"

namespace torch_shards::io {

using core::concat;
using core::ReadError;
using nlohmann::json;

namespace {

std::string encoding_type(const json& attributes) {
  const auto found = attributes.find("encoding-type");
  return found != attributes.end() && found->is_string() ? found->get<std::string>() : std::string();
}

std::string where_of(const Group& parent, const std::string& name) {
  return parent.file() + ":" + parent.child_path(name);
}

std::vector<int64_t> shape_attribute(const json& attributes, const char* key, const std::string& where) {
  const auto found = attributes.find(key);
  if (found == attributes.end() || !found->is_array() || found->size() != 2 || !(*found)[0].is_number_integer() ||
      !(*found)[1].is_number_integer()) {
    throw ReadError(concat(where, ": sparse matrix without a valid '", key, "' attribute"));
  }
  return {(*found)[0].get<int64_t>(), (*found)[1].get<int64_t>()};
}

// Output rows a list of segments writes: one past the largest destination.
int64_t output_rows(const std::vector<Segment>& segments) {
  int64_t rows = 0;
  for (const Segment& segment : segments) rows = std::max(rows, segment.dest + segment.length);
  return rows;
}

std::vector<uint8_t> read_whole(const Array& array) {
  core::ThreadPool inline_pool(0);
  return array.read_range(0, array.num_rows(), inline_pool);
}

void require_one_dimension(const Array& array, const std::string& what) {
  if (array.info().shape.size() != 1) {
    throw ReadError(concat(array.where(), ": ", what, " must be 1-D, got ", array.info().shape.size(), " dimensions"));
  }
}

// A mask array as anndata writes it (bool, one entry per row), whole.
std::vector<uint8_t> read_mask(const Array& mask, int64_t expected, const std::string& owner) {
  require_one_dimension(mask, "a mask");
  if (mask.info().dtype != DType::kBool) {
    throw ReadError(concat(mask.where(), ": mask of ", owner, " must be bool, got ", dtype_name(mask.info().dtype)));
  }
  if (mask.num_rows() != expected) {
    throw ReadError(concat(mask.where(), ": mask has ", mask.num_rows(), " entries but the values have ", expected));
  }
  return read_whole(mask);
}

// Strings of a string-array (or a plain string dataset of anndata < 0.8),
// or of a nullable-string-array group; `missing` is empty when none can be.
struct StringValues {
  std::vector<std::string> values;
  std::vector<uint8_t> missing;
  bool is_missing(size_t i) const { return !missing.empty() && missing[i]; }
};

// The nullable-string-array group `name` is (its strings in "values", its
// mask in "mask"), or null where `name` is an array of strings; anything
// else throws, naming `what`.
std::shared_ptr<const Group> nullable_strings_group(const Group& parent, const std::string& name,
                                                    const std::string& what) {
  const std::string where = where_of(parent, name);
  if (parent.has_group(name)) {
    auto group = parent.group(name);
    const std::string encoding = encoding_type(group->attributes());
    if (encoding != "nullable-string-array") {
      throw core::InvalidArgument(concat(where, ": ", what, " has encoding-type '", encoding,
                                         "', expected a string-array or a nullable-string-array"));
    }
    if (!group->has_string_array("values")) {
      throw ReadError(concat(where, "/values: missing or not an array of strings (nullable-string-array)"));
    }
    return group;
  }
  if (!parent.has_string_array(name)) {
    const std::string encoding = parent.has_array(name) ? encoding_type(parent.array_attributes(name)) : "";
    throw ReadError(concat(where, ": ", what, " is not an array of strings",
                           encoding.empty() ? std::string() : " (encoding-type '" + encoding + "')"));
  }
  return nullptr;
}

StringValues read_string_values(const Group& parent, const std::string& name, const std::string& what) {
  StringValues strings;
  if (const std::shared_ptr<const Group> group = nullable_strings_group(parent, name, what)) {
    strings.values = group->read_strings("values");
    strings.missing =
        read_mask(*group->array("mask"), static_cast<int64_t>(strings.values.size()), where_of(parent, name));
    return strings;
  }
  strings.values = parent.read_strings(name);
  return strings;
}

// How many strings read_string_values would return, from metadata only.
int64_t string_values_length(const Group& parent, const std::string& name, const std::string& what) {
  if (const std::shared_ptr<const Group> group = nullable_strings_group(parent, name, what)) {
    return group->string_array_length("values");
  }
  return parent.string_array_length(name);
}

// Values of a numeric 1-D array as JSON (integers exact), null where missing.
json numeric_values_json(const Array& array, const std::vector<uint8_t>& missing) {
  require_one_dimension(array, "categories");
  const DType dtype = array.info().dtype;
  const std::vector<uint8_t> bytes = read_whole(array);
  json values = json::array();
  for (int64_t i = 0; i < array.num_rows(); ++i) {
    if (!missing.empty() && missing[i]) {
      values.push_back(nullptr);
      continue;
    }
    switch (dtype) {
      case DType::kBool:
        values.push_back(bytes[i] != 0);
        break;
      case DType::kUInt64:
        values.push_back(reinterpret_cast<const uint64_t*>(bytes.data())[i]);
        break;
      case DType::kFloat32:
        values.push_back(static_cast<double>(reinterpret_cast<const float*>(bytes.data())[i]));
        break;
      case DType::kFloat64:
        values.push_back(reinterpret_cast<const double*>(bytes.data())[i]);
        break;
      default:
        if (!is_integer(dtype)) {
          throw core::Unsupported(concat(array.where(), ": unsupported category dtype ", dtype_name(dtype)));
        }
        values.push_back(integer_at(bytes.data(), dtype, static_cast<size_t>(i)));
    }
  }
  return values;
}

// The categories element of a categorical: a string-array, a numeric or bool
// array, or a nullable-{string-array,integer,boolean} group.
json read_category_values(const Group& parent, const std::string& name) {
  const std::string where = where_of(parent, name);
  if (parent.has_group(name)) {
    auto group = parent.group(name);
    const std::string encoding = encoding_type(group->attributes());
    if (encoding == "nullable-string-array") {
      const StringValues strings = read_string_values(parent, name, "categories");
      json values = json::array();
      for (size_t i = 0; i < strings.values.size(); ++i) {
        strings.is_missing(i) ? values.push_back(nullptr) : values.push_back(strings.values[i]);
      }
      return values;
    }
    if (encoding == "nullable-integer" || encoding == "nullable-boolean") {
      auto values = group->array("values");
      return numeric_values_json(*values, read_mask(*group->array("mask"), values->num_rows(), where));
    }
    throw core::InvalidArgument(concat(where, ": unsupported categories encoding-type '", encoding, "'"));
  }
  if (parent.has_string_array(name)) {
    json values = json::array();
    for (auto& value : parent.read_strings(name)) values.push_back(std::move(value));
    return values;
  }
  if (!parent.has_array(name)) throw ReadError(concat(where, ": no categories there"));
  return numeric_values_json(*parent.array(name), {});
}

// The categories, unique as pandas requires (a repeated one would make two
// codes mean the same value: a corrupt file, which anndata refuses too).
json read_categories(const Group& parent, const std::string& name) {
  json values = read_category_values(parent, name);
  std::set<json> seen;
  for (const json& value : values) {
    if (!value.is_null() && !seen.insert(value).second) {
      throw ReadError(
          concat(where_of(parent, name), ": categories must be unique, ", value.dump(), " appears more than once"));
    }
  }
  return values;
}

// Codes of a categorical as int64: each stored code checked against the
// number of categories; codes of missing (null) categories read as -1.
class CategoryCodes : public Array {
 public:
  CategoryCodes(std::shared_ptr<const Array> codes, const json& categories, std::string column)
      : Array(int64_info(*codes)), codes_(std::move(codes)), column_(std::move(column)) {
    for (const json& category : categories) null_category_.push_back(category.is_null());
  }
  void open_files(std::vector<const File*>& files) const override { codes_->open_files(files); }
  void opened_stamps(FileStamps& stamps) const override { codes_->opened_stamps(stamps); }

 protected:
  void read_raw(const std::vector<Segment>& segments, uint8_t* out, core::ThreadPool& pool) const override {
    const DType dtype = codes_->info().dtype;
    std::vector<uint8_t> stored(static_cast<size_t>(output_rows(segments)) * dtype_size(dtype));
    codes_->read(segments, stored.data(), pool);
    auto* codes = reinterpret_cast<int64_t*>(out);
    const int64_t count = static_cast<int64_t>(null_category_.size());
    for (const Segment& segment : segments) {
      for (int64_t i = 0; i < segment.length; ++i) {
        const int64_t code = integer_at(stored.data(), dtype, static_cast<size_t>(segment.dest + i));
        if (code < -1 || code >= count) {
          throw ReadError(concat(where(), ": category code ", code, " at row ", segment.source + i, " is outside [-1, ",
                                 count, ") (obs column '", column_, "' has ", count, " categories)"));
        }
        codes[segment.dest + i] = code >= 0 && null_category_[code] ? -1 : code;
      }
    }
  }

 private:
  static ArrayInfo int64_info(const Array& codes) {
    ArrayInfo info = codes.info();
    info.dtype = DType::kInt64;
    info.big_endian = false;
    return info;
  }

  std::shared_ptr<const Array> codes_;
  std::string column_;
  std::vector<bool> null_category_;
};

// Values of a nullable-integer / nullable-boolean column with the entries
// the mask marks missing set to 0 / false (whatever the file holds there).
class MaskedValues : public Array {
 public:
  MaskedValues(std::shared_ptr<const Array> values, std::shared_ptr<const Array> mask)
      : Array(native_info(*values)), values_(std::move(values)), mask_(std::move(mask)) {}
  void open_files(std::vector<const File*>& files) const override {
    values_->open_files(files);
    mask_->open_files(files);
  }
  void opened_stamps(FileStamps& stamps) const override {
    values_->opened_stamps(stamps);
    mask_->opened_stamps(stamps);
  }

 protected:
  void read_raw(const std::vector<Segment>& segments, uint8_t* out, core::ThreadPool& pool) const override {
    values_->read(segments, out, pool);
    std::vector<uint8_t> missing(static_cast<size_t>(output_rows(segments)));
    mask_->read(segments, missing.data(), pool);
    const size_t item = row_bytes();
    for (const Segment& segment : segments) {
      for (int64_t row = segment.dest; row < segment.dest + segment.length; ++row) {
        if (missing[row]) std::memset(out + row * item, 0, item);
      }
    }
  }

 private:
  static ArrayInfo native_info(const Array& values) {
    ArrayInfo info = values.info();
    info.big_endian = false;  // values_->read() already returns native order
    return info;
  }

  std::shared_ptr<const Array> values_, mask_;
};

// The decoded chunks of a CSR indptr, kept once read. A block of rows needs a
// few dozen of its entries, but a compressed chunk (annbatch writes indptr in
// the chunks of data, thousands of entries) must be decoded whole: without
// this each block decodes an indptr chunk as large as its data. Decoded
// indptr is small beside the matrix (one entry per row); what all stores of
// the process keep is capped at kIndptrCacheBytes, beyond which chunks are
// decoded on every read as before.
constexpr int64_t kIndptrCacheBytes = int64_t{256} << 20;
std::atomic<int64_t> indptr_cache_bytes{0};

class DecodedChunkCache : public Array {
 public:
  DecodedChunkCache(std::shared_ptr<const Array> inner, int64_t chunk_rows)
      : Array(native_info(*inner)),
        inner_(std::move(inner)),
        chunk_rows_(chunk_rows),
        chunks_(static_cast<size_t>((num_rows() + chunk_rows - 1) / chunk_rows)) {}

  ~DecodedChunkCache() override { indptr_cache_bytes -= held_bytes_; }
  // Chunks served from the cache use no file: the inner array's are checked when it is read.
  void open_files(std::vector<const File*>& files) const override { inner_->open_files(files); }
  void opened_stamps(FileStamps& stamps) const override { inner_->opened_stamps(stamps); }
  bool remote() const override { return inner_->remote(); }

 protected:
  void read_raw(const std::vector<Segment>& segments, uint8_t* out, core::ThreadPool& pool) const override {
    if (inner_->remote()) load_together(segments, pool);
    const size_t row_size = row_bytes();
    std::shared_ptr<const std::vector<uint8_t>> chunk;
    int64_t chunk_index = -1;
    for (const Segment& segment : segments) {
      for (int64_t row = segment.source; row < segment.source + segment.length;) {
        if (row / chunk_rows_ != chunk_index) {
          chunk_index = row / chunk_rows_;
          chunk = decoded(chunk_index, pool);
        }
        const int64_t first = chunk_index * chunk_rows_;
        const int64_t end = std::min(segment.source + segment.length, first + chunk_rows_);
        std::memcpy(out + (segment.dest + row - segment.source) * row_size, chunk->data() + (row - first) * row_size,
                    static_cast<size_t>(end - row) * row_size);
        row = end;
      }
    }
  }

 private:
  static ArrayInfo native_info(const Array& inner) {
    ArrayInfo info = inner.info();
    info.big_endian = false;  // inner_->read() already returns native order
    return info;
  }

  // Behind URLs: the chunks `segments` need and the cache lacks, read in one call (their requests in
  // flight together) instead of one round trip each.
  void load_together(const std::vector<Segment>& segments, core::ThreadPool& pool) const {
    std::vector<int64_t> missing;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const Segment& segment : segments) {
        if (segment.length <= 0) continue;
        for (int64_t index = segment.source / chunk_rows_; index <= (segment.source + segment.length - 1) / chunk_rows_;
             ++index) {
          if (!chunks_[index] && (missing.empty() || missing.back() != index)) missing.push_back(index);
        }
      }
    }
    std::sort(missing.begin(), missing.end());
    missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
    if (missing.size() < 2) return;
    std::vector<Segment> wanted;
    int64_t placed = 0;
    for (int64_t index : missing) {
      const int64_t first = index * chunk_rows_, rows = std::min(chunk_rows_, num_rows() - first);
      wanted.push_back(Segment{first, rows, placed});
      placed += rows;
    }
    std::vector<uint8_t> bytes(static_cast<size_t>(placed) * row_bytes());
    inner_->read(wanted, bytes.data(), pool);
    for (const Segment& part : wanted) {
      const uint8_t* begin = bytes.data() + part.dest * row_bytes();
      keep(part.source / chunk_rows_,
           std::make_shared<std::vector<uint8_t>>(begin, begin + part.length * static_cast<int64_t>(row_bytes())));
    }
  }

  // Keeps a decoded chunk (within kIndptrCacheBytes) and returns the one kept.
  std::shared_ptr<const std::vector<uint8_t>> keep(int64_t index,
                                                   std::shared_ptr<const std::vector<uint8_t>> chunk) const {
    const auto size = static_cast<int64_t>(chunk->size());
    std::lock_guard<std::mutex> lock(mutex_);
    if (chunks_[index]) return chunks_[index];  // another thread decoded it meanwhile
    if (indptr_cache_bytes.fetch_add(size) + size <= kIndptrCacheBytes) {
      chunks_[index] = chunk;
      held_bytes_ += size;
    } else {
      indptr_cache_bytes -= size;
    }
    return chunk;
  }

  std::shared_ptr<const std::vector<uint8_t>> decoded(int64_t index, core::ThreadPool& pool) const {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (chunks_[index]) return chunks_[index];
    }
    const int64_t first = index * chunk_rows_;
    const int64_t rows = std::min(chunk_rows_, num_rows() - first);
    auto chunk = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(rows) * row_bytes());
    inner_->read({Segment{first, rows, 0}}, chunk->data(), pool);
    return keep(index, std::move(chunk));
  }

  std::shared_ptr<const Array> inner_;
  int64_t chunk_rows_;
  mutable std::mutex mutex_;  // guards chunks_ and held_bytes_
  mutable std::vector<std::shared_ptr<const std::vector<uint8_t>>> chunks_;
  mutable int64_t held_bytes_ = 0;
};

// A string column as int64 codes into its sorted unique values (-1: missing).
void encode_strings(const StringValues& strings, const Group& obs, const std::string& name, ObsColumn& column) {
  std::vector<std::string> unique;
  for (size_t i = 0; i < strings.values.size(); ++i) {
    if (!strings.is_missing(i)) unique.push_back(strings.values[i]);
  }
  std::sort(unique.begin(), unique.end());  // bytewise: the code point order of UTF-8, as Python sorts str
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  std::map<std::string, int64_t> code_of;
  for (size_t i = 0; i < unique.size(); ++i) code_of.emplace(unique[i], static_cast<int64_t>(i));
  std::vector<uint8_t> bytes(strings.values.size() * sizeof(int64_t));
  auto* codes = reinterpret_cast<int64_t*>(bytes.data());
  for (size_t i = 0; i < strings.values.size(); ++i) {
    codes[i] = strings.is_missing(i) ? -1 : code_of.at(strings.values[i]);
  }
  ArrayInfo info;
  info.file = obs.file();
  info.path = obs.child_path(name);
  info.dtype = DType::kInt64;
  info.shape = {static_cast<int64_t>(strings.values.size())};
  column.values = std::make_shared<MemoryArray>(std::move(info), std::move(bytes));
  column.categorical = true;
  column.categories = json::array();
  for (auto& value : unique) column.categories.push_back(std::move(value));
}

void require_integer_codes(const Array& codes) {
  require_one_dimension(codes, "categorical codes");
  if (!is_integer(codes.info().dtype)) {
    throw ReadError(
        concat(codes.where(), ": categorical codes must be integers, got ", dtype_name(codes.info().dtype)));
  }
}

bool ordered_attribute(const json& attributes) {
  const auto ordered = attributes.find("ordered");
  if (ordered == attributes.end()) return false;
  if (ordered->is_boolean()) return ordered->get<bool>();
  return ordered->is_number() && ordered->get<double>() != 0;
}

// How Python converts adata.<group>[name] to CSR, for the message refusing a CSC matrix.
std::string layer_conversion(const std::string& group, const std::string& name) {
  const std::string element = concat("adata.", group, "['", name, "']");
  return concat(element, " = ", element, ".tocsr()");
}

}  // namespace

// indptr as read: compressed chunks cached decoded (see DecodedChunkCache),
// anything else (contiguous, one-row chunks) as it is.
std::shared_ptr<const Array> cached_indptr(std::shared_ptr<const Array> indptr) {
  const auto* chunked = dynamic_cast<const ChunkedArray*>(indptr.get());
  if (chunked == nullptr || indptr->info().shape.size() != 1 || chunked->chunk_shape()[0] < 2) return indptr;
  const int64_t chunk_rows = chunked->chunk_shape()[0];
  return std::make_shared<DecodedChunkCache>(std::move(indptr), chunk_rows);
}

AnnDataStore::AnnDataStore(std::shared_ptr<const Group> root) : root_(std::move(root)) {
  if (!root_->has_group("obs") || (!root_->has_array("X") && !root_->has_group("X") && !root_->has_group("layers"))) {
    throw ReadError(concat(root_->where(), ": not an AnnData store (needs obs and X or layers)"));
  }
  if (!root_->has_group("var") && !root_->has_array("X") && !root_->has_group("X")) {
    throw ReadError(concat(root_->where(), ": not an AnnData store (no var)"));
  }
  if (root_->has_array("obs")) {
    throw ReadError(concat(root_->where(),
                           ": obs is a compound dataset (AnnData < 0.7 layout); re-save the file "
                           "with a recent anndata"));
  }
  // Lengths from the indexes' metadata: their names (millions, behind URLs too) are read only if asked for.
  n_obs_ = index_length(*root_->group("obs"));
  n_vars_ = root_->has_group("var") ? index_length(*root_->group("var")) : matrix(std::nullopt).cols;
}

std::vector<int64_t> MatrixData::row_shape() const {
  if (csr) return {cols};
  return std::vector<int64_t>(dense->info().shape.begin() + 1, dense->info().shape.end());
}

std::string AnnDataStore::index_name(const Group& frame) const {
  const json attributes = frame.attributes();
  const auto index = attributes.find("_index");
  const std::string name = index != attributes.end() && index->is_string() ? index->get<std::string>() : "_index";
  if (!frame.has_array(name) && !frame.has_group(name)) {
    throw ReadError(concat(frame.where(), ": dataframe index '", name, "' is missing"));
  }
  return name;
}

int64_t AnnDataStore::index_length(const Group& frame) const {
  return string_values_length(frame, index_name(frame), "the dataframe index");
}

std::vector<std::string> AnnDataStore::index_of(const Group& frame) const {
  StringValues strings = read_string_values(frame, index_name(frame), "the dataframe index");
  for (size_t i = 0; i < strings.values.size(); ++i) {
    if (strings.is_missing(i)) strings.values[i].clear();
  }
  return std::move(strings.values);
}

std::vector<std::string> AnnDataStore::obs_names() const { return index_of(*root_->group("obs")); }
std::vector<std::string> AnnDataStore::var_names() const { return index_of(*root_->group("var")); }

MatrixData AnnDataStore::matrix_in(const Group& parent, const std::string& name, const std::string& conversion) const {
  const std::string where = where_of(parent, name);
  MatrixData matrix;
  if (parent.has_array(name)) {
    const std::string encoding = encoding_type(parent.array_attributes(name));
    if (!encoding.empty() && encoding != "array") {
      throw core::InvalidArgument(
          concat(where, ": unsupported matrix encoding-type '", encoding, "' (expected a dense array or csr_matrix)"));
    }
    if (parent.has_string_array(name)) throw core::InvalidArgument(concat(where, ": is an array of strings"));
    matrix.dense = parent.array(name);
    const auto& shape = matrix.dense->info().shape;
    if (!shape.empty()) matrix.rows = shape[0];
    if (shape.size() >= 2) matrix.cols = shape[1];
  } else if (parent.has_group(name)) {
    auto group = parent.group(name);
    const json attributes = group->attributes();
    const std::string encoding = encoding_type(attributes);
    const auto legacy = attributes.find("h5sparse_format");
    const std::string legacy_format =
        legacy != attributes.end() && legacy->is_string() ? legacy->get<std::string>() : "";
    if (encoding == "csc_matrix" || (encoding.empty() && legacy_format == "csc")) {
      throw core::InvalidArgument(concat(where,
                                         ": is a CSC (column-compressed) matrix (encoding-type 'csc_matrix'); rows "
                                         "are read from CSR: convert with ",
                                         conversion, " and save again"));
    }
    if (encoding != "csr_matrix" && !(encoding.empty() && legacy_format == "csr")) {
      throw core::InvalidArgument(
          concat(where, ": unsupported matrix encoding-type '", encoding, "' (expected a dense array or csr_matrix)"));
    }
    const auto shape = shape_attribute(attributes, encoding == "csr_matrix" ? "shape" : "h5sparse_shape", where);
    matrix.rows = shape[0];
    matrix.cols = shape[1];
    matrix.csr = std::make_shared<CsrMatrix>(cached_indptr(group->array("indptr")), group->array("indices"),
                                             group->array("data"), shape[0], shape[1]);
  } else {
    throw ReadError(concat(where, ": no such matrix"));
  }
  return matrix;
}

void AnnDataStore::check_obs_by_vars(const MatrixData& matrix, const std::string& where) const {
  if (matrix.dense && matrix.dense->info().shape.size() != 2) {
    throw ReadError(concat(where, ": expected a 2-D matrix, got ", matrix.dense->info().shape.size(), " dimensions"));
  }
  if (n_obs_ != 0 && matrix.rows != n_obs_) {
    throw ReadError(concat(where, ": has ", matrix.rows, " rows but obs has ", n_obs_));
  }
  // n_vars_ is set (from var) once the store is open; the constructor asks before, without var.
  if (n_vars_ != 0 && matrix.cols != n_vars_) {
    throw ReadError(concat(where, ": has ", matrix.cols, " columns but var has ", n_vars_, " rows"));
  }
}

MatrixData AnnDataStore::matrix(const std::optional<std::string>& layer) const {
  if (!layer) {
    if (!root_->has_array("X") && !root_->has_group("X")) {
      throw core::InvalidArgument(concat(root_->where(), ": has no X; pass layer= to read one of the layers"));
    }
    MatrixData x = matrix_in(*root_, "X", "adata.X = adata.X.tocsr()");
    check_obs_by_vars(x, where_of(*root_, "X"));
    return x;
  }
  if (!root_->has_group("layers") ||
      !(root_->group("layers")->has_array(*layer) || root_->group("layers")->has_group(*layer))) {
    std::string available;
    if (root_->has_group("layers")) {
      for (const auto& name : root_->group("layers")->children()) available += (available.empty() ? "" : ", ") + name;
    }
    throw core::InvalidArgument(
        concat(root_->where(), ": no layer '", *layer, "' (layers: ", available.empty() ? "none" : available, ")"));
  }
  auto layers = root_->group("layers");
  MatrixData matrix = matrix_in(*layers, *layer, layer_conversion("layers", *layer));
  check_obs_by_vars(matrix, where_of(*layers, *layer));
  return matrix;
}

std::string AnnDataStore::element_path(const std::string& path) const {
  const std::string element = !path.empty() && path[0] == '/' ? path.substr(1) : path;
  const size_t slash = element.find('/');
  const std::string group = element.substr(0, slash);
  const std::string name = slash == std::string::npos ? "" : element.substr(slash + 1);
  const bool per_cell_group = group == "layers" || group == "obsm" || group == "obsp";
  if (element == "X" || element == "raw/X" ||
      (per_cell_group && !name.empty() && name.find('/') == std::string::npos)) {
    return element;
  }
  std::string why;
  if (group == "var" || group == "varm" || group == "varp" || group == "uns" || group == "raw") {
    why = " (var, varm, varp, uns and raw's var and varm have no per-cell rows)";
  } else if (group == "obs") {
    why = " (obs columns are read with obs=)";
  }
  throw core::InvalidArgument(concat(root_->file(), ": fields cannot read element '", path, "'", why,
                                     "; they read X, layers/<name>, obsm/<name>, obsp/<name> or raw/X"));
}

MatrixData AnnDataStore::element(const std::string& path) const {
  const std::string element = element_path(path);
  const size_t slash = element.find('/');
  // The group holding the element, and its name there.
  std::shared_ptr<const Group> parent = root_;
  std::string name = element;
  if (slash != std::string::npos) {
    const std::string group = element.substr(0, slash);
    name = element.substr(slash + 1);
    if (!root_->has_group(group)) {
      throw core::InvalidArgument(
          concat(where_of(*root_, element), ": no such element (the AnnData has no ", group, " group)"));
    }
    parent = root_->group(group);
    if (!parent->has_array(name) && !parent->has_group(name)) {
      std::string available;
      for (const auto& child : parent->children()) {
        if (group != "raw" || child == "X") available += (available.empty() ? "" : ", ") + child;
      }
      throw core::InvalidArgument(concat(where_of(*root_, element), ": no such element (", group, ": ",
                                         available.empty() ? "none" : available, ")"));
    }
  } else if (!root_->has_array(name) && !root_->has_group(name)) {
    throw core::InvalidArgument(concat(where_of(*root_, element), ": no such element (the AnnData has no X)"));
  }
  const std::string where = where_of(*parent, name);
  const std::string group = slash == std::string::npos ? "" : element.substr(0, slash);
  const std::string conversion = group.empty() ? "adata.X = adata.X.tocsr()"
                                 : group == "raw"
                                     ? "adata.raw = anndata.AnnData(adata.raw.X.tocsr(), var=adata.raw.var)"
                                     : layer_conversion(group, name);
  MatrixData matrix = matrix_in(*parent, name, conversion);
  if (matrix.dense && matrix.dense->info().shape.empty()) {
    throw core::InvalidArgument(
        concat(where, ": is a scalar (encoding-type 'array'), not an array with a row per cell"));
  }
  if (matrix.rows != n_obs_) {
    std::string shape;
    for (int64_t extent : matrix.csr ? std::vector<int64_t>{matrix.rows, matrix.cols} : matrix.dense->info().shape) {
      shape += (shape.empty() ? "" : ", ") + std::to_string(extent);
    }
    throw core::InvalidArgument(concat(
        where, ": ", matrix.csr ? "a CSR matrix (encoding-type 'csr_matrix')" : "a dense array (encoding-type 'array')",
        " of shape [", shape, "] whose first dimension is not n_obs (", n_obs_,
        "): fields read elements with one row per cell"));
  }
  if (group.empty() || group == "layers") {
    check_obs_by_vars(matrix, where);
  } else if (group == "obsp" || group == "raw") {
    if (matrix.dense && matrix.dense->info().shape.size() != 2) {
      throw ReadError(concat(where, ": expected a 2-D matrix, got ", matrix.dense->info().shape.size(), " dimensions"));
    }
    // obsp relates cells to cells; raw/X has raw/var's columns.
    const bool raw_var = group == "raw" && parent->has_group("var");
    if (group == "obsp" && matrix.cols != n_obs_) {
      throw ReadError(concat(where, ": has ", matrix.cols, " columns but obs has ", n_obs_, " rows"));
    }
    if (raw_var) {
      const int64_t columns = index_length(*parent->group("var"));
      if (matrix.cols != columns) {
        throw ReadError(concat(where, ": has ", matrix.cols, " columns but raw/var has ", columns, " rows"));
      }
    }
  }
  return matrix;
}

std::vector<std::string> AnnDataStore::obs_columns() const {
  const json attributes = root_->group("obs")->attributes();
  std::vector<std::string> columns;
  const auto order = attributes.find("column-order");
  if (order != attributes.end() && order->is_array()) {
    for (const auto& name : *order) {
      if (name.is_string()) columns.push_back(name.get<std::string>());
    }
  } else if (order != attributes.end() && order->is_string()) {
    columns.push_back(order->get<std::string>());  // a single column stored as a scalar
  }
  return columns;
}

ObsColumn AnnDataStore::obs_column(const std::string& name) const {
  auto obs = root_->group("obs");
  const std::string where = where_of(*obs, name);
  ObsColumn column;
  column.name = name;
  if (obs->has_group(name)) {
    auto group = obs->group(name);
    const json attributes = group->attributes();
    column.encoding = encoding_type(attributes);
    if (column.encoding == "categorical") {
      column.categorical = true;
      column.ordered = ordered_attribute(attributes);
      column.categories = read_categories(*group, "categories");
      auto codes = group->array("codes");
      require_integer_codes(*codes);
      column.values = std::make_shared<CategoryCodes>(codes, column.categories, name);
    } else if (column.encoding == "nullable-integer" || column.encoding == "nullable-boolean") {
      auto values = group->array("values");
      require_one_dimension(*values, "values");
      const DType dtype = values->info().dtype;
      if (column.encoding == "nullable-integer" ? !is_integer(dtype) : dtype != DType::kBool) {
        throw ReadError(concat(values->where(), ": ", column.encoding, " values of dtype ", dtype_name(dtype)));
      }
      column.mask = group->array("mask");
      read_mask(*column.mask, values->num_rows(), where);  // checks its dtype and length
      column.values = std::make_shared<MaskedValues>(values, column.mask);
    } else if (column.encoding == "nullable-string-array") {
      encode_strings(read_string_values(*obs, name, "the column"), *obs, name, column);
    } else {
      throw core::InvalidArgument(concat(where, ": unsupported obs column encoding-type '", column.encoding,
                                         "' (supported: numeric and boolean arrays, categorical, string-array, "
                                         "nullable-string-array, nullable-integer, nullable-boolean)"));
    }
  } else if (obs->has_array(name)) {
    const json attributes = obs->array_attributes(name);
    column.encoding = encoding_type(attributes);
    if (attributes.contains("categories")) {
      // anndata 0.7: codes, with the categories in obs/__categories/<name>
      // (the attribute is a path in zarr stores, an object reference in HDF5).
      const auto& reference = attributes["categories"];
      const std::string location = reference.is_string() ? reference.get<std::string>() : "__categories/" + name;
      if (!obs->has_array(location) && !obs->has_string_array(location)) {
        throw ReadError(concat(where, ": categorical column (anndata 0.7 layout) without its categories at ",
                               obs->child_path(location)));
      }
      column.encoding = "categorical";
      column.categorical = true;
      column.categories = read_categories(*obs, location);
      column.ordered = ordered_attribute(obs->array_attributes(location));
      auto codes = obs->array(name);
      require_integer_codes(*codes);
      column.values = std::make_shared<CategoryCodes>(codes, column.categories, name);
    } else if (obs->has_string_array(name)) {
      if (column.encoding.empty()) column.encoding = "string-array";
      encode_strings(read_string_values(*obs, name, "the column"), *obs, name, column);
    } else if (column.encoding.empty() || column.encoding == "array") {
      column.encoding = "array";
      column.values = obs->array(name);
    } else {
      throw core::InvalidArgument(concat(where, ": unsupported obs column encoding-type '", column.encoding, "'"));
    }
  } else {
    std::string available;
    for (const auto& column_name : obs_columns()) available += (available.empty() ? "" : ", ") + column_name;
    throw core::InvalidArgument(
        concat(where, ": no such obs column (columns: ", available.empty() ? "none" : available, ")"));
  }
  if (column.values->info().shape.size() != 1 || column.values->num_rows() != n_obs_) {
    std::string shape;
    for (int64_t extent : column.values->info().shape) shape += (shape.empty() ? "" : ", ") + std::to_string(extent);
    throw ReadError(concat(where, ": expected ", n_obs_, " values (one per obs row), got shape [", shape, "]"));
  }
  return column;
}

}  // namespace torch_shards::io
