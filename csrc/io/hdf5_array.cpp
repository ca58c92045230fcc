#include "io/hdf5_array.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "core/errors.h"
#include "io/chunked_array.h"
#include "io/codecs.h"
#include "io/contiguous_array.h"
#include "io/file.h"
#include "io/hdf5_library.h"
#include "io/text.h"

namespace torch_shards::io {

using core::concat;
using core::ReadError;
using hdf5::Datatype;

namespace {

constexpr uint16_t kLzfFilter = 32000;  // h5py's, which anndata's write_h5ad(compression="lzf") uses
constexpr uint16_t kBloscFilter = 32001;
constexpr uint16_t kZstdFilter = 32015;
// HDF5 stores a chunk's size in 32 bits: no chunk is 4 GiB or more.
constexpr uint64_t kMaxChunkBytes = (uint64_t{1} << 32) - 1;
// Chunk lookups at open (one libhdf5 call each) beyond which the chunk
// table is read by index instead of by grid position.
constexpr uint64_t kMaxGridLookups = uint64_t{1} << 22;
constexpr uint64_t kMaxIndexedChunks = 4096;

struct StoredType {
  DType dtype;
  bool big_endian;
};

[[noreturn]] void unsupported_type(const Datatype& type, const std::string& where, const std::string& detail = "") {
  static const char* kClassNames[] = {"integer",  "float",     "time", "string",          "bitfield", "opaque",
                                      "compound", "reference", "enum", "variable-length", "array"};
  const char* name = type.type_class >= 0 && type.type_class <= 10 ? kClassNames[type.type_class] : "unknown";
  throw core::InvalidArgument(concat(where, ": unsupported element type (HDF5 ", name, ", ", type.size, " bytes",
                                     detail.empty() ? "" : "; " + detail,
                                     "); torch_shards reads numeric and bool datasets"));
}

// The element type torch_shards returns for a stored datatype: integers and
// IEEE floats without padding bits, h5py's bool enum, other enums as their
// integers, and h5py's complex compounds {r, i}.
StoredType stored_type(const Datatype& type, const std::string& where) {
  switch (type.type_class) {
    case Datatype::kFixedPoint: {
      if (!type.plain_integer()) {
        unsupported_type(type, where, concat(type.precision, " significant bits at bit offset ", type.bit_offset));
      }
      const bool big = type.big_endian && type.size > 1;
      switch (type.size) {
        case 1:
          return {type.is_signed ? DType::kInt8 : DType::kUInt8, false};
        case 2:
          return {type.is_signed ? DType::kInt16 : DType::kUInt16, big};
        case 4:
          return {type.is_signed ? DType::kInt32 : DType::kUInt32, big};
        default:
          return {type.is_signed ? DType::kInt64 : DType::kUInt64, big};
      }
    }
    case Datatype::kFloat:
      if (!type.ieee_float()) unsupported_type(type, where, "not an IEEE 754 half, single or double");
      return {type.size == 2 ? DType::kFloat16 : type.size == 4 ? DType::kFloat32 : DType::kFloat64, type.big_endian};
    case Datatype::kEnum: {
      // h5py stores bool as an int8 enum {FALSE: 0, TRUE: 1}.
      const bool is_bool = type.members.size() == 2 && type.members[0].name == "FALSE" &&
                           type.members[1].name == "TRUE" && type.size == 1;
      if (is_bool) return {DType::kBool, false};
      return stored_type(*type.base, where);
    }
    case Datatype::kCompound:
      if (type.members.size() == 2) {
        const Datatype& real = *type.members[0].type;
        const Datatype& imaginary = *type.members[1].type;
        const bool same = real.ieee_float() && imaginary.ieee_float() && real.size == imaginary.size &&
                          real.big_endian == imaginary.big_endian;
        if (same && (real.size == 4 || real.size == 8) && type.members[0].offset == 0 &&
            type.members[1].offset == real.size && type.size == 2 * real.size) {
          return {real.size == 4 ? DType::kComplex64 : DType::kComplex128, real.big_endian};
        }
      }
      unsupported_type(type, where);
    default:
      unsupported_type(type, where);
  }
}

bool is_compressor(uint16_t id) {
  return id == H5Z_FILTER_DEFLATE || id == kLzfFilter || id == kBloscFilter || id == kZstdFilter;
}

// Pipelines decoded natively: optional shuffle, then at most one compressor.
bool natively_decodable(const std::vector<hdf5::Filter>& filters) {
  int compressors = 0;
  for (const hdf5::Filter& filter : filters) {
    if (filter.id == H5Z_FILTER_SHUFFLE) {
      if (compressors > 0) return false;  // shuffle after compression: unusual, leave it to HDF5
    } else if (is_compressor(filter.id)) {
      ++compressors;
    } else {
      return false;
    }
  }
  return compressors <= 1;
}

std::string filter_name(const hdf5::Filter& filter) {
  switch (filter.id) {
    case H5Z_FILTER_DEFLATE:
      return "deflate";
    case H5Z_FILTER_SHUFFLE:
      return "shuffle";
    case H5Z_FILTER_FLETCHER32:
      return "fletcher32";
    case H5Z_FILTER_SZIP:
      return "szip";
    case H5Z_FILTER_NBIT:
      return "nbit";
    case H5Z_FILTER_SCALEOFFSET:
      return "scaleoffset";
    case kLzfFilter:
      return "lzf";
  }
  return filter.name.empty() ? "filter" : printable(filter.name, 60);
}

std::string describe_filters(const std::vector<hdf5::Filter>& filters) {
  std::string text;
  for (const hdf5::Filter& filter : filters) {
    text += (text.empty() ? "" : ", ") + concat(filter_name(filter), " (", filter.id, ")");
  }
  return text.empty() ? "none" : text;
}

// The most bytes any encoding natively decoded here stores for `bytes` bytes
// (deflate, lzf, zstd and blosc expand incompressible data by well under 1/16).
uint64_t max_stored_bytes(uint64_t bytes) { return bytes + bytes / 16 + 1024; }

// The most bytes a pipeline that libhdf5 decodes stores for a chunk of
// `bytes` bytes, each filter's bound applied in turn (each bound is at least
// its input and grows with it, so a chunk that skipped filters is bounded
// too); 0 (no bound) when a filter's output is not bounded (plugins).
// libhdf5's encoders: Fletcher-32 appends 4 bytes, szip writes at most its
// input plus a 4-byte header (it fails rather than expand), n-bit at most its
// input, scale-offset its input plus a 21-byte header and 1 byte.
uint64_t max_library_stored_bytes(const std::vector<hdf5::Filter>& filters, uint64_t bytes) {
  for (const hdf5::Filter& filter : filters) {
    if (filter.id == H5Z_FILTER_SHUFFLE || filter.id == H5Z_FILTER_NBIT) continue;
    if (is_compressor(filter.id)) {
      bytes = max_stored_bytes(bytes);
    } else if (filter.id == H5Z_FILTER_FLETCHER32 || filter.id == H5Z_FILTER_SZIP) {
      bytes += 4;
    } else if (filter.id == H5Z_FILTER_SCALEOFFSET) {
      bytes += 22;
    } else {
      return 0;
    }
  }
  return bytes;
}

// The scale-offset filter's parameters for integers, when it is the only
// filter: decoded natively (HDF5 1.10 reads past short chunks and packs
// more bits than an element holds without a check). Its client data:
// scale type, scale factor, elements per chunk, class, size, sign, byte
// order, whether a fill value is defined, then the fill value's bytes.
std::optional<codecs::ScaleOffsetParameters> scaleoffset_parameters(const std::vector<hdf5::Filter>& filters,
                                                                    const Datatype& type, uint64_t chunk_elements,
                                                                    const std::string& where) {
  if (filters.size() != 1 || filters[0].id != H5Z_FILTER_SCALEOFFSET) return std::nullopt;
  const Datatype& integer = type.type_class == Datatype::kEnum ? *type.base : type;
  const std::vector<uint32_t>& values = filters[0].values;
  if (integer.type_class != Datatype::kFixedPoint || values.size() < 8 || values[3] != 0) return std::nullopt;
  const bool consistent = values.size() == 20 && values[0] == 2 && values[2] == chunk_elements &&
                          values[4] == integer.size && values[5] == (integer.is_signed ? 1u : 0u) &&
                          values[6] == (integer.big_endian ? 1u : 0u) && values[7] <= 1;
  if (!consistent) {
    throw ReadError(concat(where,
                           ": its scale-offset filter parameters do not match the dataset (corrupt filter "
                           "pipeline)"));
  }
  codecs::ScaleOffsetParameters parameters;
  parameters.count = static_cast<size_t>(chunk_elements);
  parameters.size = integer.size;
  parameters.big_endian = integer.big_endian;
  parameters.fill_defined = values[7] == 1;
  for (size_t b = 0; b < integer.size; ++b) {
    parameters.fill |= static_cast<uint64_t>((values[8 + b / 4] >> (8 * (b % 4))) & 0xff) << (8 * b);
  }
  return parameters;
}

// Undoes shuffle and one compressor, honouring the chunk's mask of skipped
// filters; or the scale-offset filter alone.
class Hdf5FilterDecoder : public ChunkDecoder {
 public:
  Hdf5FilterDecoder(std::vector<hdf5::Filter> filters, size_t element_size,
                    std::optional<codecs::ScaleOffsetParameters> scaleoffset = std::nullopt)
      : filters_(std::move(filters)), element_size_(element_size), scaleoffset_(scaleoffset) {}

  bool stores_raw() const override { return filters_.empty(); }

  void decode(std::vector<uint8_t>& encoded, uint8_t* out, size_t out_bytes) const override {
    decode(encoded, out, out_bytes, 0);
  }

  void check_encoded(const std::vector<uint8_t>& encoded, size_t out_bytes, uint32_t skipped) const override {
    if (scaleoffset_ && !(skipped & 1)) return;  // decode_scaleoffset checks its chunk before reading it
    const hdf5::Filter* compressor = active_compressor(skipped);
    if (compressor == nullptr) {
      if (encoded.size() != out_bytes) {
        throw std::runtime_error(concat("stored chunk holds ", encoded.size(), " bytes, expected ", out_bytes));
      }
      return;
    }
    codecs::check_decoded_size(codec_of(*compressor), encoded.data(), encoded.size(), out_bytes);
  }

  void decode(std::vector<uint8_t>& encoded, uint8_t* out, size_t out_bytes, uint32_t skipped) const override {
    if (scaleoffset_ && !(skipped & 1)) {
      if (out_bytes != scaleoffset_->count * scaleoffset_->size) {
        throw std::logic_error("scale-offset chunk of the wrong size");
      }
      codecs::decode_scaleoffset(encoded.data(), encoded.size(), out, *scaleoffset_);
      return;
    }
    check_encoded(encoded, out_bytes, skipped);
    const hdf5::Filter* compressor = active_compressor(skipped);
    bool shuffled = false;
    for (size_t i = 0; i < filters_.size(); ++i) {
      if (!(skipped & (1u << i)) && filters_[i].id == H5Z_FILTER_SHUFFLE) shuffled = true;
    }
    thread_local std::vector<uint8_t> staging;
    uint8_t* target = out;
    if (shuffled) {
      staging.resize(out_bytes);
      target = staging.data();
    }
    if (compressor == nullptr) {
      std::memcpy(target, encoded.data(), out_bytes);
    } else if (compressor->id == H5Z_FILTER_DEFLATE) {
      codecs::inflate_zlib(encoded.data(), encoded.size(), target, out_bytes);
    } else if (compressor->id == kBloscFilter) {
      codecs::decompress_blosc(encoded.data(), encoded.size(), target, out_bytes);
    } else if (compressor->id == kLzfFilter) {
      codecs::decompress_lzf(encoded.data(), encoded.size(), target, out_bytes);
    } else {
      codecs::decompress_zstd(encoded.data(), encoded.size(), target, out_bytes);
    }
    if (shuffled) codecs::unshuffle(target, out_bytes, element_size_, out);
  }

 private:
  const hdf5::Filter* active_compressor(uint32_t skipped) const {
    const hdf5::Filter* compressor = nullptr;
    for (size_t i = 0; i < filters_.size(); ++i) {
      if (!(skipped & (1u << i)) && is_compressor(filters_[i].id)) compressor = &filters_[i];
    }
    return compressor;
  }
  static codecs::Codec codec_of(const hdf5::Filter& filter) {
    return filter.id == H5Z_FILTER_DEFLATE ? codecs::Codec::kZlib
           : filter.id == kLzfFilter       ? codecs::Codec::kLzf
           : filter.id == kBloscFilter     ? codecs::Codec::kBlosc
                                           : codecs::Codec::kZstd;
  }

  std::vector<hdf5::Filter> filters_;
  size_t element_size_;
  std::optional<codecs::ScaleOffsetParameters> scaleoffset_;
};

// Where each stored chunk is: (linear grid position, entry), sorted.
struct ChunkEntry {
  int64_t offset = 0;  // absolute, in the file
  int64_t size = 0;
  uint32_t skipped_filters = 0;
};
using ChunkTable = std::vector<std::pair<uint64_t, ChunkEntry>>;

const ChunkEntry* find_chunk(const ChunkTable& table, uint64_t linear) {
  const auto found = std::lower_bound(table.begin(), table.end(), linear,
                                      [](const auto& entry, uint64_t key) { return entry.first < key; });
  return found != table.end() && found->first == linear ? &found->second : nullptr;
}

// Chunk addresses tabulated at open: reads need no HDF5 call, only pread.
class Hdf5ChunkStore : public ChunkStore {
 public:
  Hdf5ChunkStore(std::shared_ptr<const File> file, std::string path, std::vector<int64_t> grid, ChunkTable table)
      : file_(std::move(file)), path_(std::move(path)), grid_(std::move(grid)), table_(std::move(table)) {}

  std::optional<std::vector<uint8_t>> read_chunk(const std::vector<int64_t>& coords) const override {
    const ChunkEntry* entry = find_chunk(table_, linear(coords));
    if (entry == nullptr) return std::nullopt;
    return file_->read_at(entry->offset, static_cast<size_t>(entry->size),
                          concat("dataset ", path_, " ", ChunkStore::describe_chunk(coords)));
  }

  bool can_locate() const override { return true; }
  bool locates_in_kept_files() const override { return !file_->remote(); }

  std::optional<ChunkLocation> locate(const std::vector<int64_t>& coords) const override {
    const ChunkEntry* entry = find_chunk(table_, linear(coords));
    if (entry == nullptr) return std::nullopt;
    return ChunkLocation{file_, entry->offset, entry->size};
  }

  void open_files(std::vector<const File*>& files) const override { files.push_back(file_.get()); }
  void opened_stamps(FileStamps& stamps) const override { stamps[file_->path()] = file_->stamp().digest(); }

  uint32_t skipped_filters(const std::vector<int64_t>& coords) const override {
    const ChunkEntry* entry = find_chunk(table_, linear(coords));
    return entry == nullptr ? 0 : entry->skipped_filters;
  }

  std::string describe_chunk(const std::vector<int64_t>& coords) const override {
    const ChunkEntry* entry = find_chunk(table_, linear(coords));
    if (entry == nullptr) return ChunkStore::describe_chunk(coords) + " (never written)";
    return concat(ChunkStore::describe_chunk(coords), " (", entry->size, " bytes at offset ", entry->offset, ")");
  }

 private:
  uint64_t linear(const std::vector<int64_t>& coords) const {
    uint64_t index = 0;
    for (size_t d = 0; d < grid_.size(); ++d) index = index * static_cast<uint64_t>(grid_[d]) + coords[d];
    return index;
  }

  std::shared_ptr<const File> file_;
  std::string path_;
  std::vector<int64_t> grid_;
  ChunkTable table_;
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

std::string format_offset(const std::vector<hsize_t>& offset) {
  std::string text = "(";
  for (size_t d = 0; d < offset.size(); ++d) text += (d ? ", " : "") + std::to_string(offset[d]);
  return text + ")";
}

// Every stored chunk of a chunked dataset, checked: on the chunk grid,
// inside the file, no position twice, no two overlapping in the file, no
// more bytes than any encoding of a chunk stores (`max_stored`), and exactly
// as many as the chunk index says it holds (a chunk whose key was corrupted
// is in the index but at no grid position). HDF5 1.10 looks chunks up
// without these checks. Without filters, a chunk is its `chunk_bytes` at
// its address whatever size its index entry records, as HDF5 reads it.
ChunkTable tabulate_chunks(hid_t dataset, const std::vector<int64_t>& chunk_shape, const std::vector<int64_t>& grid,
                           const File& file, int64_t base, uint64_t max_stored, bool unfiltered, uint64_t chunk_bytes,
                           const std::string& where) {
  const size_t dims = grid.size();
  uint64_t cells = 1;
  for (int64_t extent : grid) {
    if (extent != 0 && cells > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(extent)) {
      throw ReadError(concat(where, ": its chunk grid has more than 2^64 chunks"));
    }
    cells *= static_cast<uint64_t>(extent);
  }
  hsize_t stored = 0;
  Hid space(H5Dget_space(dataset), H5Sclose);  // HDF5 1.10 does not take H5S_ALL here
  if (!space.valid() || H5Dget_num_chunks(dataset, space.get(), &stored) < 0) {
    throw ReadError(concat(where, ": cannot count its chunks: ", hdf5_error_detail()));
  }
  if (stored > cells) {
    throw ReadError(concat(where, ": its chunk index holds ", stored, " chunks but the chunk grid has ", cells,
                           " positions (corrupt chunk index)"));
  }
  ChunkTable table;
  const auto add = [&](const std::vector<hsize_t>& offset, unsigned mask, haddr_t address, hsize_t size) {
    if (unfiltered) size = chunk_bytes;
    uint64_t linear = 0;
    for (size_t d = 0; d < dims; ++d) {
      const uint64_t extent = static_cast<uint64_t>(chunk_shape[d]);
      if (offset[d] % extent != 0 || offset[d] / extent >= static_cast<uint64_t>(grid[d])) {
        throw ReadError(concat(where, ": a chunk at ", format_offset(offset),
                               " is not on the chunk grid of the dataset's shape (corrupt chunk index)"));
      }
      linear = linear * static_cast<uint64_t>(grid[d]) + offset[d] / extent;
    }
    const uint64_t file_size = static_cast<uint64_t>(file.size());
    if (address == HADDR_UNDEF || address > file_size || static_cast<uint64_t>(base) > file_size - address ||
        size > file_size - address - static_cast<uint64_t>(base)) {
      throw ReadError(concat(where, ": chunk ", format_offset(offset), " claims ", size, " bytes at address ", address,
                             ", outside the file's ", file_size, " bytes (corrupt chunk index)"));
    }
    if (max_stored != 0 && size > max_stored) {
      throw ReadError(concat(where, ": chunk ", format_offset(offset), " claims ", size,
                             " stored bytes, more than any encoding of its ", chunk_bytes, " bytes holds (at most ",
                             max_stored, "; corrupt chunk index)"));
    }
    table.emplace_back(linear, ChunkEntry{static_cast<int64_t>(address) + base, static_cast<int64_t>(size), mask});
  };
  std::vector<hsize_t> offset(dims);
  // Each lookup by index walks the index: only for few chunks.
  const auto list_index = [&] {
    for (hsize_t i = 0; i < stored; ++i) {
      unsigned mask = 0;
      haddr_t address = HADDR_UNDEF;
      hsize_t size = 0;
      if (H5Dget_chunk_info(dataset, space.get(), i, offset.data(), &mask, &address, &size) < 0) {
        throw ReadError(concat(where, ": cannot read chunk ", i, " of its index: ", hdf5_error_detail()));
      }
      add(offset, mask, address, size);
    }
  };
  if (cells <= kMaxGridLookups) {
    std::vector<int64_t> coords(dims, 0);
    for (uint64_t cell = 0; cell < cells && table.size() < stored; ++cell) {
      for (size_t d = 0; d < dims; ++d) offset[d] = static_cast<hsize_t>(coords[d] * chunk_shape[d]);
      unsigned mask = 0;
      haddr_t address = HADDR_UNDEF;
      hsize_t size = 0;
      if (H5Dget_chunk_info_by_coord(dataset, offset.data(), &mask, &address, &size) < 0) {
        H5Eclear2(H5E_DEFAULT);
      } else if (address != HADDR_UNDEF) {
        add(offset, mask, address, size);
      }
      for (size_t d = dims; d-- > 0;) {
        if (++coords[d] < grid[d]) break;
        coords[d] = 0;
      }
    }
    if (table.size() != stored && stored <= kMaxIndexedChunks) {
      // Some entries are at no grid position: list the index to name one.
      table.clear();
      list_index();
    }
  } else if (stored <= kMaxIndexedChunks) {
    list_index();  // a huge, sparse grid
  } else {
    throw ReadError(concat(where, ": a chunk grid of ", cells, " positions with ", stored,
                           " stored chunks is too large to tabulate with this HDF5 library"));
  }
  std::sort(table.begin(), table.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < table.size(); ++i) {
    if (table[i].first == table[i - 1].first) {
      uint64_t rest = table[i].first;
      std::vector<hsize_t> position(dims);
      for (size_t d = dims; d-- > 0; rest /= static_cast<uint64_t>(grid[d])) {
        position[d] = static_cast<hsize_t>(rest % static_cast<uint64_t>(grid[d]) * chunk_shape[d]);
      }
      throw ReadError(
          concat(where, ": two chunks at the same grid position ", format_offset(position), " (corrupt chunk index)"));
    }
  }
  if (table.size() != stored) {
    throw ReadError(
        concat(where, ": its chunk index holds ", stored, " chunks, ", table.size(),
               " of them at positions of the chunk grid (corrupt chunk index: a chunk's coordinates are corrupt)"));
  }
  std::vector<const ChunkEntry*> by_offset;
  for (const auto& [linear, entry] : table) by_offset.push_back(&entry);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const ChunkEntry* a, const ChunkEntry* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i - 1]->offset + by_offset[i - 1]->size > by_offset[i]->offset) {
      throw ReadError(concat(where, ": two of its chunks overlap in the file (at offsets ", by_offset[i - 1]->offset,
                             " and ", by_offset[i]->offset, "; corrupt chunk index)"));
    }
  }
  return table;
}

// Grid and chunk shape of a chunked layout, checked against the dataspace.
struct ChunkGeometry {
  std::vector<int64_t> chunk_shape, grid;
  uint64_t chunk_bytes = 0;
};

ChunkGeometry chunk_geometry(const Hdf5DatasetHeader& header, const std::string& where) {
  const std::vector<uint64_t>& chunk = header.layout.chunk;
  const std::vector<uint64_t>& dims = header.space.dims;
  if (chunk.size() != dims.size()) {
    throw ReadError(concat(where, ": chunks of ", chunk.size(), " dimensions for a dataset of ", dims.size()));
  }
  ChunkGeometry geometry;
  geometry.chunk_bytes = header.type.size;
  for (size_t d = 0; d < dims.size(); ++d) {
    // HDF5 creates no chunk longer than a fixed (not extendible) dimension.
    const uint64_t limit = header.space.max_dims.empty() ? dims[d] : header.space.max_dims[d];
    if (chunk[d] == 0 || (limit != ~uint64_t{0} && chunk[d] > std::max<uint64_t>(limit, 1))) {
      throw ReadError(concat(where, ": chunk dimension ", d, " is ", chunk[d], " for a dimension of at most ", limit,
                             " (corrupt layout)"));
    }
    if (chunk[d] > kMaxChunkBytes / geometry.chunk_bytes) {
      throw ReadError(concat(where, ": chunks of 4 GiB or more (corrupt layout; HDF5's limit is 4 GiB)"));
    }
    geometry.chunk_bytes *= chunk[d];
    geometry.chunk_shape.push_back(static_cast<int64_t>(chunk[d]));
    geometry.grid.push_back(static_cast<int64_t>(dims[d] / chunk[d] + (dims[d] % chunk[d] != 0)));
  }
  return geometry;
}

ArrayInfo array_info(const std::string& file, const std::string& path, const Hdf5DatasetHeader& header,
                     const StoredType& stored) {
  ArrayInfo info;
  info.file = file;
  info.path = path;
  info.dtype = stored.dtype;
  info.big_endian = stored.big_endian;
  for (uint64_t dim : header.space.dims) {
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw ReadError(concat(file, ":", path, ": dimension of ", dim, " (corrupt dataspace)"));
    }
    info.shape.push_back(static_cast<int64_t>(dim));
  }
  return info;
}

}  // namespace

Hdf5NativeFile open_hdf5_native(const std::string& path) {
  Hdf5NativeFile native;
  native.file = std::make_shared<const File>(path, File::Access::kMetadata);
  try {
    native.format = hdf5::read_format_info(*native.file);
  } catch (const std::runtime_error& error) {
    throw ReadError(concat(path, ": corrupt superblock: ", error.what()));
  }
  return native;
}

Hdf5DatasetHeader read_hdf5_dataset_header(const Hdf5NativeFile& native, uint64_t address, const std::string& where) {
  std::vector<hdf5::Message> messages;
  try {
    messages = hdf5::read_object_header(*native.file, native.format, address);
  } catch (const std::runtime_error& error) {
    throw ReadError(concat(where, ": corrupt object header: ", error.what()));
  }
  Hdf5DatasetHeader header;
  const hdf5::Message* datatype = nullptr;
  const hdf5::Message* dataspace = nullptr;
  const hdf5::Message* layout = nullptr;
  const hdf5::Message* fill = nullptr;
  const hdf5::Message* old_fill = nullptr;
  const hdf5::Message* pipeline = nullptr;
  for (const hdf5::Message& message : messages) {
    const auto keep = [&](const hdf5::Message*& slot, const char* what) {
      if (slot != nullptr) throw ReadError(concat(where, ": its object header holds two ", what, " messages"));
      slot = &message;
    };
    switch (message.type) {
      case hdf5::kDatatypeMessage:
        keep(datatype, "datatype");
        break;
      case hdf5::kDataspaceMessage:
        keep(dataspace, "dataspace");
        break;
      case hdf5::kLayoutMessage:
        keep(layout, "layout");
        break;
      case hdf5::kFillValueMessage:
        keep(fill, "fill value");
        break;
      case hdf5::kOldFillValueMessage:
        keep(old_fill, "old fill value");
        break;
      case hdf5::kFilterPipelineMessage:
        keep(pipeline, "filter pipeline");
        break;
      case 0x0007:  // external data files
        header.external = true;
        break;
      default:
        break;
    }
  }
  if (datatype == nullptr || dataspace == nullptr || layout == nullptr) {
    throw ReadError(concat(where, ": its object header lacks a ",
                           datatype == nullptr    ? "datatype"
                           : dataspace == nullptr ? "dataspace"
                                                  : "layout",
                           " message (corrupt, or not a dataset)"));
  }
  for (const hdf5::Message* message : {datatype, dataspace}) {
    if (message->flags & 2) {
      throw ReadError(concat(where, ": a shared (committed) ", message == datatype ? "datatype" : "dataspace",
                             ", which torch_shards does not read"));
    }
  }
  try {
    header.type = hdf5::decode_datatype(datatype->data, native.format);
  } catch (const std::runtime_error& error) {
    throw ReadError(concat(where, ": corrupt datatype: ", error.what()));
  }
  try {
    header.space = hdf5::decode_dataspace(dataspace->data, native.format);
    header.layout = hdf5::decode_layout(layout->data, native.format);
    if (pipeline != nullptr) header.filters = hdf5::decode_filter_pipeline(pipeline->data);
    if (fill != nullptr || old_fill != nullptr)
      header.fill = hdf5::decode_fill_value(fill != nullptr ? *fill : *old_fill);
  } catch (const std::runtime_error& error) {
    throw ReadError(concat(where, ": corrupt dataset header: ", error.what()));
  }
  if (!header.fill.empty() && header.fill.size() != header.type.size) {
    throw ReadError(concat(where, ": its fill value holds ", header.fill.size(), " bytes for elements of ",
                           header.type.size, " (corrupt fill value)"));
  }
  if (header.layout.kind == hdf5::Layout::kCompact) {
    const uint64_t elements = header.space.elements();
    if (elements > header.layout.compact.size() / header.type.size ||
        elements * header.type.size != header.layout.compact.size()) {
      throw ReadError(concat(where, ": its compact data holds ", header.layout.compact.size(), " bytes for ", elements,
                             " elements of ", header.type.size, " bytes (corrupt layout)"));
    }
  }
  return header;
}

std::shared_ptr<const Array> open_hdf5_array(hid_t file_id, const std::string& file, const std::string& dataset_path) {
  const std::string path = dataset_path.empty() || dataset_path[0] != '/' ? "/" + dataset_path : dataset_path;
  const std::string where = file + ":" + path;
  const H5O_type_t object_type = hdf5_object_type(file_id, path);
  if (object_type == H5O_TYPE_UNKNOWN) throw ReadError(concat(where, ": no such dataset"));
  if (object_type != H5O_TYPE_DATASET) throw ReadError(concat(where, ": is not a dataset (a group?)"));
  const Hdf5NativeFile native = open_hdf5_native(file);
  const Hdf5DatasetHeader header = read_hdf5_dataset_header(native, hdf5_object_address(file_id, path, where), where);
  const StoredType stored = stored_type(header.type, where);
  if (header.space.kind != hdf5::Dataspace::kSimple || header.space.dims.empty()) {
    throw core::InvalidArgument(concat(where, ": is a scalar (0-d) dataset; rows need at least 1 dimension"));
  }
  const ArrayInfo info = array_info(file, path, header, stored);
  const auto library_read = [&](const std::string& reason) -> std::shared_ptr<const Array> {
    ArrayInfo native_order = info;
    native_order.big_endian = false;  // HDF5 converts to native order
    return std::make_shared<Hdf5LibraryArray>(native_order, reason);
  };
  if (header.external) return library_read("external storage");

  if (header.layout.kind == hdf5::Layout::kContiguous) {
    if (header.layout.address == hdf5::kUndefinedAddress) return library_read("no storage allocated");
    // The layout's stored size is not used: like HDF5, the data is the
    // dataspace's elements at the address, which ContiguousArray checks lie
    // in the file.
    const uint64_t base = static_cast<uint64_t>(native.format.base);
    if (header.layout.address > std::numeric_limits<uint64_t>::max() / 2 - base) {
      throw ReadError(concat(where, ": data address ", header.layout.address, " (corrupt layout)"));
    }
    return std::make_shared<ContiguousArray>(info, native.file, static_cast<int64_t>(header.layout.address + base));
  }
  if (header.layout.kind == hdf5::Layout::kChunked) {
    const std::vector<hdf5::Filter>& filters = header.filters;
    // Behind a URL, the chunk index's nodes fetched a level at a time before libhdf5 walks them.
    hdf5::read_ahead_chunk_btree(*native.file, native.format, header.layout.address, header.space.dims.size() + 1);
    Hid dataset(H5Dopen2(file_id, path.c_str(), H5P_DEFAULT), H5Dclose);
    if (!dataset.valid()) throw ReadError(concat(where, ": cannot open dataset: ", hdf5_error_detail()));
    Hdf5DatasetHeader chunked = header;
    if (chunked.layout.chunk.empty()) {  // layout messages before version 3: ask the library
      Hid dcpl(H5Dget_create_plist(dataset.get()), H5Pclose);
      std::vector<hsize_t> chunk(header.space.dims.size());
      if (H5Pget_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()) != static_cast<int>(chunk.size())) {
        throw ReadError(concat(where, ": cannot read its chunk shape: ", hdf5_error_detail()));
      }
      chunked.layout.chunk.assign(chunk.begin(), chunk.end());
    }
    const ChunkGeometry geometry = chunk_geometry(chunked, where);
    const auto scaleoffset =
        scaleoffset_parameters(filters, header.type, geometry.chunk_bytes / header.type.size, where);
    if (!natively_decodable(filters) && !scaleoffset) {
      for (const hdf5::Filter& filter : filters) {
        if (H5Zfilter_avail(filter.id) <= 0) {
          H5Eclear2(H5E_DEFAULT);
          throw core::Unsupported(
              concat(where, ": uses HDF5 filter '", filter_name(filter), "' (", filter.id,
                     "), which this HDF5 library cannot decode: install an HDF5 plugin for it and point "
                     "HDF5_PLUGIN_PATH at it, or rewrite the dataset with gzip, lzf, blosc or zstd"));
        }
      }
      // libhdf5 1.10 reads a chunk whose index entry is corrupt as never
      // written (fill values): the index is checked here as for the
      // datasets decoded natively, before any row is read.
      tabulate_chunks(dataset.get(), geometry.chunk_shape, geometry.grid, *native.file, native.format.base,
                      max_library_stored_bytes(filters, geometry.chunk_bytes), filters.empty(), geometry.chunk_bytes,
                      where);
      return library_read("filters " + describe_filters(filters));
    }
    const uint64_t max_stored = max_stored_bytes(geometry.chunk_bytes);
    ChunkTable table = tabulate_chunks(dataset.get(), geometry.chunk_shape, geometry.grid, *native.file,
                                       native.format.base, max_stored, filters.empty(), geometry.chunk_bytes, where);
    auto store = std::make_shared<Hdf5ChunkStore>(native.file, path, geometry.grid, std::move(table));
    auto decoder = std::make_shared<Hdf5FilterDecoder>(filters, dtype_size(info.dtype), scaleoffset);
    return std::make_shared<ChunkedArray>(info, geometry.chunk_shape, store, decoder, header.fill);
  }
  return library_read(header.layout.kind == hdf5::Layout::kCompact ? "compact layout" : "virtual layout");
}

std::shared_ptr<const Array> open_hdf5_array(const std::string& file, const std::string& path) {
  auto lock = hdf5_lock();
  Hid file_id = open_hdf5_file(file);
  return open_hdf5_array(file_id.get(), file, path);
}

std::vector<uint8_t> read_hdf5_elements(hid_t file_id, const Hdf5NativeFile& native, const std::string& path,
                                        const Hdf5DatasetHeader& header, const std::string& where) {
  const uint64_t elements = header.space.elements();
  const uint64_t size = header.type.size;
  if (elements != 0 && size > static_cast<uint64_t>(native.file->size()) / elements &&
      header.layout.kind != hdf5::Layout::kChunked) {
    throw ReadError(concat(where, ": ", elements, " elements of ", size, " bytes cannot fit in the file's ",
                           native.file->size(), " bytes (corrupt dataspace)"));
  }
  switch (header.layout.kind) {
    case hdf5::Layout::kCompact:
      return header.layout.compact;  // its size was checked with the header
    case hdf5::Layout::kContiguous: {
      if (elements == 0) return {};
      if (header.layout.address == hdf5::kUndefinedAddress) {
        throw ReadError(concat(where, ": its data was never written"));
      }
      const uint64_t base = static_cast<uint64_t>(native.format.base);
      const uint64_t file_size = static_cast<uint64_t>(native.file->size());
      if (header.layout.address > file_size || base > file_size - header.layout.address) {
        throw ReadError(concat(where, ": data address ", header.layout.address, " is past the end of the file"));
      }
      return native.file->read_at(static_cast<int64_t>(base + header.layout.address),
                                  static_cast<size_t>(elements * size), where + " data");
    }
    case hdf5::Layout::kChunked:
      break;
    default:
      throw ReadError(concat(where, ": a virtual dataset, which torch_shards does not read here"));
  }
  if (header.space.dims.size() != 1) {
    throw ReadError(concat(where, ": expected a 1-D dataset, this one has ", header.space.dims.size(), " dimensions"));
  }
  if (!natively_decodable(header.filters)) {
    throw core::Unsupported(concat(where, ": its filters (", describe_filters(header.filters),
                                   ") are not ones torch_shards decodes for string arrays (shuffle, then one of "
                                   "deflate, lzf, blosc, zstd): rewrite it with gzip, lzf, blosc or zstd"));
  }
  const ChunkGeometry geometry = chunk_geometry(header, where);
  hdf5::read_ahead_chunk_btree(*native.file, native.format, header.layout.address, header.space.dims.size() + 1);
  Hid dataset(H5Dopen2(file_id, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dataset.valid()) throw ReadError(concat(where, ": cannot open dataset: ", hdf5_error_detail()));
  const ChunkTable table =
      tabulate_chunks(dataset.get(), geometry.chunk_shape, geometry.grid, *native.file, native.format.base,
                      max_stored_bytes(geometry.chunk_bytes), header.filters.empty(), geometry.chunk_bytes, where);
  if (table.size() != static_cast<uint64_t>(geometry.grid[0])) {
    throw ReadError(concat(where, ": ", static_cast<uint64_t>(geometry.grid[0]) - table.size(), " of its ",
                           geometry.grid[0], " chunks were never written (a string array is written whole)"));
  }
  // Every chunk is stored; each is checked against the size its encoding
  // records (or can reach) before memory is allocated for it.
  const Hdf5FilterDecoder decoder(header.filters, static_cast<size_t>(size));
  std::vector<uint8_t> out;
  std::vector<uint8_t> decoded;
  for (const auto& [linear, entry] : table) {
    std::vector<uint8_t> encoded =
        native.file->read_at(entry.offset, static_cast<size_t>(entry.size), concat(where, " chunk ", linear));
    try {
      decoder.check_encoded(encoded, static_cast<size_t>(geometry.chunk_bytes), entry.skipped_filters);
      decoded.resize(static_cast<size_t>(geometry.chunk_bytes));
      decoder.decode(encoded, decoded.data(), decoded.size(), entry.skipped_filters);
    } catch (const ReadError&) {
      throw;
    } catch (const std::exception& error) {
      throw ReadError(concat(where, ": chunk (", linear, ",): ", error.what()));
    }
    const uint64_t first = linear * static_cast<uint64_t>(geometry.chunk_shape[0]);
    const uint64_t count = std::min<uint64_t>(static_cast<uint64_t>(geometry.chunk_shape[0]), elements - first);
    out.insert(out.end(), decoded.begin(), decoded.begin() + static_cast<ptrdiff_t>(count * size));
  }
  return out;
}

}  // namespace torch_shards::io
