#include "hdf5_array.h"

#include <cstring>
#include <vector>

#include "../core/errors.h"
#include "chunked_array.h"
#include "codecs.h"
#include "contiguous_array.h"
#include "file.h"
#include "hdf5_library.h"

namespace torch_shards::io {

using core::concat;
using core::ReadError;

namespace {

constexpr H5Z_filter_t kBloscFilter = 32001;
constexpr H5Z_filter_t kZstdFilter = 32015;

struct StoredType {
  DType dtype;
  bool big_endian;
};

StoredType stored_type(hid_t type, const std::string& where) {
  const H5T_class_t type_class = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  const bool big_endian = H5Tget_order(type) == H5T_ORDER_BE;
  if (type_class == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    switch (size) {
      case 1:
        return {is_signed ? DType::kInt8 : DType::kUInt8, false};
      case 2:
        return {is_signed ? DType::kInt16 : DType::kUInt16, big_endian};
      case 4:
        return {is_signed ? DType::kInt32 : DType::kUInt32, big_endian};
      case 8:
        return {is_signed ? DType::kInt64 : DType::kUInt64, big_endian};
    }
  } else if (type_class == H5T_FLOAT) {
    switch (size) {
      case 2:
        return {DType::kFloat16, big_endian};
      case 4:
        return {DType::kFloat32, big_endian};
      case 8:
        return {DType::kFloat64, big_endian};
    }
  } else if (type_class == H5T_ENUM) {
    // h5py stores bool as an int8 enum {FALSE: 0, TRUE: 1}; other enums read as their integers.
    Hid base(H5Tget_super(type), H5Tclose);
    char* first = H5Tget_member_name(type, 0);
    const bool is_bool =
        H5Tget_nmembers(type) == 2 && first != nullptr && std::string(first) == "FALSE" && H5Tget_size(base.get()) == 1;
    H5free_memory(first);
    if (is_bool) return {DType::kBool, false};
    return stored_type(base.get(), where);
  } else if (type_class == H5T_COMPOUND && H5Tget_nmembers(type) == 2) {
    // h5py complex numbers: {r, i} of one float type.
    Hid real(H5Tget_member_type(type, 0), H5Tclose);
    Hid imaginary(H5Tget_member_type(type, 1), H5Tclose);
    if (H5Tget_class(real.get()) == H5T_FLOAT && H5Tequal(real.get(), imaginary.get()) > 0 &&
        H5Tget_member_offset(type, 0) == 0) {
      const size_t part = H5Tget_size(real.get());
      if (part == 4) return {DType::kComplex64, H5Tget_order(real.get()) == H5T_ORDER_BE};
      if (part == 8) return {DType::kComplex128, H5Tget_order(real.get()) == H5T_ORDER_BE};
    }
  }
  static const char* kClassNames[] = {"integer",  "float",     "time", "string",          "bitfield", "opaque",
                                      "compound", "reference", "enum", "variable-length", "array"};
  const char* name = type_class >= 0 && type_class < 11 ? kClassNames[type_class] : "unknown";
  throw core::InvalidArgument(concat(where, ": unsupported element type (HDF5 ", name, ", ", size,
                                     " bytes); torch_shards reads numeric and bool datasets"));
}

struct Filter {
  H5Z_filter_t id;
  std::string name;
  std::vector<unsigned> values;
};

std::vector<Filter> dataset_filters(hid_t dcpl) {
  std::vector<Filter> filters;
  const int count = H5Pget_nfilters(dcpl);
  for (int i = 0; i < count; ++i) {
    unsigned flags = 0;
    size_t num_values = 16;
    std::vector<unsigned> values(num_values);
    char name[256] = {0};
    unsigned config = 0;
    const H5Z_filter_t id =
        H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &num_values, values.data(), sizeof(name), name, &config);
    values.resize(std::min<size_t>(num_values, 16));
    filters.push_back(Filter{id, name, values});
  }
  return filters;
}

bool is_compressor(H5Z_filter_t id) { return id == H5Z_FILTER_DEFLATE || id == kBloscFilter || id == kZstdFilter; }

// Pipelines decoded natively: optional shuffle, then at most one compressor.
bool natively_decodable(const std::vector<Filter>& filters) {
  int compressors = 0;
  for (size_t i = 0; i < filters.size(); ++i) {
    if (filters[i].id == H5Z_FILTER_SHUFFLE) {
      if (compressors > 0) return false;  // shuffle after compression: unusual, leave it to HDF5
    } else if (is_compressor(filters[i].id)) {
      ++compressors;
    } else {
      return false;
    }
  }
  return compressors <= 1;
}

std::string describe_filters(const std::vector<Filter>& filters) {
  std::string text;
  for (const Filter& filter : filters) {
    text += (text.empty() ? "" : ", ") + concat(filter.name.empty() ? "filter" : filter.name, " (", filter.id, ")");
  }
  return text.empty() ? "none" : text;
}

// Undoes shuffle and one compressor, honouring the chunk's mask of skipped filters.
class Hdf5FilterDecoder : public ChunkDecoder {
 public:
  Hdf5FilterDecoder(std::vector<Filter> filters, size_t element_size)
      : filters_(std::move(filters)), element_size_(element_size) {}

  bool stores_raw() const override { return filters_.empty(); }

  void decode(std::vector<uint8_t>& encoded, uint8_t* out, size_t out_bytes) const override {
    decode(encoded, out, out_bytes, 0);
  }

  void decode(std::vector<uint8_t>& encoded, uint8_t* out, size_t out_bytes, uint32_t skipped) const override {
    const Filter* compressor = nullptr;
    bool shuffled = false;
    for (size_t i = 0; i < filters_.size(); ++i) {
      if (skipped & (1u << i)) continue;
      if (filters_[i].id == H5Z_FILTER_SHUFFLE) shuffled = true;
      if (is_compressor(filters_[i].id)) compressor = &filters_[i];
    }
    thread_local std::vector<uint8_t> staging;
    uint8_t* target = out;
    if (shuffled) {
      staging.resize(out_bytes);
      target = staging.data();
    }
    if (compressor == nullptr) {
      if (encoded.size() != out_bytes) {
        throw std::runtime_error(concat("stored chunk holds ", encoded.size(), " bytes, expected ", out_bytes));
      }
      std::memcpy(target, encoded.data(), out_bytes);
    } else if (compressor->id == H5Z_FILTER_DEFLATE) {
      codecs::inflate_zlib(encoded.data(), encoded.size(), target, out_bytes);
    } else if (compressor->id == kBloscFilter) {
      codecs::decompress_blosc(encoded.data(), encoded.size(), target, out_bytes);
    } else {
      codecs::decompress_zstd(encoded.data(), encoded.size(), target, out_bytes);
    }
    if (shuffled) codecs::unshuffle(target, out_bytes, element_size_, out);
  }

 private:
  std::vector<Filter> filters_;
  size_t element_size_;
};

// Chunk addresses tabulated at open: reads need no HDF5 call, only pread.
class Hdf5ChunkStore : public ChunkStore {
 public:
  struct Entry {
    haddr_t address = HADDR_UNDEF;
    hsize_t size = 0;
    unsigned skipped_filters = 0;
  };

  Hdf5ChunkStore(std::shared_ptr<const File> file, std::string path, std::vector<int64_t> grid,
                 std::vector<Entry> entries)
      : file_(std::move(file)), path_(std::move(path)), grid_(std::move(grid)), entries_(std::move(entries)) {}

  std::optional<std::vector<uint8_t>> read_chunk(const std::vector<int64_t>& coords) const override {
    const Entry& entry = entries_[linear(coords)];
    if (entry.address == HADDR_UNDEF) return std::nullopt;
    return file_->read_at(static_cast<int64_t>(entry.address), entry.size,
                          concat("dataset ", path_, " ", ChunkStore::describe_chunk(coords)));
  }

  bool can_locate() const override { return true; }

  std::optional<ChunkLocation> locate(const std::vector<int64_t>& coords) const override {
    const Entry& entry = entries_[linear(coords)];
    if (entry.address == HADDR_UNDEF) return std::nullopt;
    return ChunkLocation{file_, static_cast<int64_t>(entry.address), static_cast<int64_t>(entry.size)};
  }

  uint32_t skipped_filters(const std::vector<int64_t>& coords) const override {
    return entries_[linear(coords)].skipped_filters;
  }

  std::string describe_chunk(const std::vector<int64_t>& coords) const override {
    const Entry& entry = entries_[linear(coords)];
    return concat(ChunkStore::describe_chunk(coords), " (", entry.size, " bytes at offset ", entry.address, ")");
  }

 private:
  size_t linear(const std::vector<int64_t>& coords) const {
    size_t index = 0;
    for (size_t d = 0; d < grid_.size(); ++d) index = index * static_cast<size_t>(grid_[d]) + coords[d];
    return index;
  }

  std::shared_ptr<const File> file_;
  std::string path_;
  std::vector<int64_t> grid_;
  std::vector<Entry> entries_;
};

// The in-memory type HDF5 converts into: the element layout torch_shards
// returns (native byte order, dtype_size bytes). Built from our dtype rather
// than H5Tget_native_type, which widens e.g. 16-bit floats to 4 bytes.
Hid memory_type_for(hid_t file_type, DType dtype, const std::string& where) {
  Hid type;
  if (dtype == DType::kComplex64 || dtype == DType::kComplex128) {
    const bool wide = dtype == DType::kComplex128;
    const hid_t part = wide ? H5T_NATIVE_DOUBLE : H5T_NATIVE_FLOAT;
    const size_t part_size = wide ? 8 : 4;
    type = Hid(H5Tcreate(H5T_COMPOUND, 2 * part_size), H5Tclose);
    H5Tinsert(type.get(), "r", 0, part);
    H5Tinsert(type.get(), "i", part_size, part);
  } else {
    type = Hid(H5Tcopy(file_type), H5Tclose);
    if (H5Tget_class(file_type) != H5T_ENUM) H5Tset_order(type.get(), H5Tget_order(H5T_NATIVE_INT));
  }
  if (!type.valid() || H5Tget_size(type.get()) != dtype_size(dtype)) {
    throw ReadError(concat(where, ": cannot build an in-memory HDF5 type for ", dtype_name(dtype)));
  }
  return type;
}

// HDF5's own read path: any layout and any filter the library has.
class Hdf5LibraryArray : public Array {
 public:
  Hdf5LibraryArray(ArrayInfo info, std::string reason) : Array(std::move(info)), reason_(std::move(reason)) {}

 protected:
  void read_raw(const std::vector<Segment>& segments, uint8_t* out, core::ThreadPool&) const override {
    const size_t row_size = row_bytes();
    const std::vector<Span> spans = plan_spans(segments, row_size, 1 << 20, 64 << 20);
    auto lock = hdf5_lock();
    Hid file = open_hdf5_file(info_.file);
    Hid dataset(H5Dopen2(file.get(), info_.path.c_str(), H5P_DEFAULT), H5Dclose);
    if (!dataset.valid()) throw ReadError(concat(where(), ": cannot open dataset: ", hdf5_error_detail()));
    Hid file_type(H5Dget_type(dataset.get()), H5Tclose);
    Hid memory_type = memory_type_for(file_type.get(), info_.dtype, where());
    Hid file_space(H5Dget_space(dataset.get()), H5Sclose);
    const size_t dims = info_.shape.size();
    std::vector<uint8_t> buffer;
    for (const Span& span : spans) {
      std::vector<hsize_t> start(dims, 0), count(info_.shape.begin(), info_.shape.end());
      start[0] = static_cast<hsize_t>(span.begin);
      count[0] = static_cast<hsize_t>(span.end - span.begin);
      H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
      Hid memory_space(H5Screate_simple(static_cast<int>(dims), count.data(), nullptr), H5Sclose);
      buffer.resize(count[0] * row_size);
      if (H5Dread(dataset.get(), memory_type.get(), memory_space.get(), file_space.get(), H5P_DEFAULT, buffer.data()) <
          0) {
        throw ReadError(concat(where(), ": HDF5 could not read rows [", span.begin, ", ", span.end, ") (", reason_,
                               "): ", hdf5_error_detail()));
      }
      for (size_t i = span.first; i < span.last; ++i) {
        const Segment& segment = segments[i];
        std::memcpy(out + segment.dest * row_size, buffer.data() + (segment.source - span.begin) * row_size,
                    static_cast<size_t>(segment.length) * row_size);
      }
    }
  }

 private:
  std::string reason_;
};

std::vector<Hdf5ChunkStore::Entry> tabulate_chunks(hid_t dataset, const std::vector<int64_t>& chunk_shape,
                                                   const std::vector<int64_t>& grid) {
  size_t total = 1;
  for (int64_t g : grid) total *= static_cast<size_t>(g);
  std::vector<Hdf5ChunkStore::Entry> entries(total);
  std::vector<int64_t> coords(grid.size(), 0);
  std::vector<hsize_t> offset(grid.size());
  for (size_t index = 0; index < total; ++index) {
    for (size_t d = 0; d < grid.size(); ++d) offset[d] = static_cast<hsize_t>(coords[d] * chunk_shape[d]);
    Hdf5ChunkStore::Entry& entry = entries[index];
    if (H5Dget_chunk_info_by_coord(dataset, offset.data(), &entry.skipped_filters, &entry.address, &entry.size) < 0) {
      H5Eclear2(H5E_DEFAULT);
      entry.address = HADDR_UNDEF;  // never written: the fill value
    }
    for (size_t d = grid.size(); d-- > 0;) {
      if (++coords[d] < grid[d]) break;
      coords[d] = 0;
    }
  }
  return entries;
}

}  // namespace

std::shared_ptr<const Array> open_hdf5_array(hid_t file_id, const std::string& file, const std::string& dataset_path) {
  const std::string path = dataset_path.empty() || dataset_path[0] != '/' ? "/" + dataset_path : dataset_path;
  const std::string where = file + ":" + path;
  if (!hdf5_path_exists(file_id, path)) throw ReadError(concat(where, ": no such dataset"));
  H5O_info_t object_info;
  if (H5Oget_info_by_name2(file_id, path.c_str(), &object_info, H5O_INFO_BASIC, H5P_DEFAULT) < 0 ||
      object_info.type != H5O_TYPE_DATASET) {
    H5Eclear2(H5E_DEFAULT);
    throw ReadError(concat(where, ": is not a dataset (a group?)"));
  }
  Hid dataset(H5Dopen2(file_id, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dataset.valid()) throw ReadError(concat(where, ": cannot open dataset: ", hdf5_error_detail()));
  Hid type(H5Dget_type(dataset.get()), H5Tclose);
  const StoredType stored = stored_type(type.get(), where);
  Hid space(H5Dget_space(dataset.get()), H5Sclose);
  const int dims = H5Sget_simple_extent_ndims(space.get());
  if (dims < 1)
    throw core::InvalidArgument(concat(where, ": is a scalar (0-d) dataset; rows need at least 1 dimension"));
  std::vector<hsize_t> extent(static_cast<size_t>(dims));
  H5Sget_simple_extent_dims(space.get(), extent.data(), nullptr);

  ArrayInfo info;
  info.file = file;
  info.path = path;
  info.dtype = stored.dtype;
  info.big_endian = stored.big_endian;
  info.shape.assign(extent.begin(), extent.end());

  Hid dcpl(H5Dget_create_plist(dataset.get()), H5Pclose);
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  const auto library_read = [&](const std::string& reason) -> std::shared_ptr<const Array> {
    ArrayInfo native = info;
    native.big_endian = false;  // HDF5 converts to native order
    return std::make_shared<Hdf5LibraryArray>(native, reason);
  };
  if (H5Pget_external_count(dcpl.get()) > 0) return library_read("external storage");

  if (layout == H5D_CONTIGUOUS) {
    const haddr_t offset = H5Dget_offset(dataset.get());
    if (offset == HADDR_UNDEF) {
      H5Eclear2(H5E_DEFAULT);
      return library_read("no storage allocated");
    }
    return std::make_shared<ContiguousArray>(info, std::make_shared<File>(file, File::Access::kMapped),
                                             static_cast<int64_t>(offset));
  }
  if (layout == H5D_CHUNKED) {
    const std::vector<Filter> filters = dataset_filters(dcpl.get());
    if (!natively_decodable(filters)) {
      for (const Filter& filter : filters) {
        if (H5Zfilter_avail(filter.id) <= 0) {
          H5Eclear2(H5E_DEFAULT);
          throw ReadError(concat(where, ": uses HDF5 filter '", filter.name, "' (", filter.id,
                                 "), which this HDF5 library cannot decode: install an HDF5 plugin for it and point "
                                 "HDF5_PLUGIN_PATH at it, or rewrite the dataset with gzip, blosc or zstd"));
        }
      }
      return library_read("filters " + describe_filters(filters));
    }
    std::vector<hsize_t> chunk(static_cast<size_t>(dims));
    H5Pget_chunk(dcpl.get(), dims, chunk.data());
    std::vector<int64_t> chunk_shape(chunk.begin(), chunk.end()), grid;
    for (int d = 0; d < dims; ++d) grid.push_back((info.shape[d] + chunk_shape[d] - 1) / chunk_shape[d]);
    std::vector<uint8_t> fill(dtype_size(info.dtype), 0);
    H5D_fill_value_t fill_status;
    if (H5Pfill_value_defined(dcpl.get(), &fill_status) >= 0 && fill_status != H5D_FILL_VALUE_UNDEFINED) {
      if (H5Pget_fill_value(dcpl.get(), type.get(), fill.data()) < 0) H5Eclear2(H5E_DEFAULT);
    }
    auto entries = tabulate_chunks(dataset.get(), chunk_shape, grid);
    auto store = std::make_shared<Hdf5ChunkStore>(std::make_shared<File>(file, File::Access::kMapped), path, grid,
                                                  std::move(entries));
    auto decoder = std::make_shared<Hdf5FilterDecoder>(filters, dtype_size(info.dtype));
    return std::make_shared<ChunkedArray>(info, chunk_shape, store, decoder, fill);
  }
  return library_read(layout == H5D_COMPACT ? "compact layout" : "virtual layout");
}

std::shared_ptr<const Array> open_hdf5_array(const std::string& file, const std::string& path) {
  auto lock = hdf5_lock();
  Hid file_id = open_hdf5_file(file);
  return open_hdf5_array(file_id.get(), file, path);
}

}  // namespace torch_shards::io
