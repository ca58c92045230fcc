// zarr v2 and v3 reading: every store here is written to a temporary
// directory by the test itself (JSON and chunk files, compressed with zlib,
// zstd and c-blosc directly), then read back and compared element by element.
// Build once with -fsanitize=address,undefined.
#include <blosc.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/thread_pool.h"
#include "encoders.h"
#include "io/array.h"
#include "io/text.h"
#include "io/zarr/array.h"
#include "io/zarr/group.h"
#include "temp_dir.h"

namespace torch_shards::io {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;
using Shape = std::vector<int64_t>;
using json = nlohmann::json;

// ---------------------------------------------------------------------------
// Files

using testing_support::blosc_compress;
using testing_support::gzip_compress;
using testing_support::TempDir;
using testing_support::write_file;
using testing_support::zlib_compress;
using testing_support::zstd_compress;

void write_text(const std::string& path, const std::string& text) { write_file(path, Bytes(text.begin(), text.end())); }

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

template <typename T>
Bytes to_bytes(const std::vector<T>& values) {
  Bytes bytes(values.size() * sizeof(T));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// ---------------------------------------------------------------------------
// Encoders (the real libraries)

// Bitwise reference CRC-32C (Castagnoli, reflected), independent of codecs.cpp.
uint32_t reference_crc32c(const Bytes& data) {
  uint32_t crc = 0xffffffffu;
  for (uint8_t byte : data) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

Bytes append_crc32c(Bytes data) {
  const uint32_t crc = reference_crc32c(data);
  for (int i = 0; i < 4; ++i) data.push_back(static_cast<uint8_t>(crc >> (8 * i)));
  return data;
}

Bytes byteswapped(Bytes data, size_t unit) {
  for (size_t i = 0; i + unit <= data.size(); i += unit) std::reverse(data.begin() + i, data.begin() + i + unit);
  return data;
}

using Encoder = std::function<Bytes(const Bytes&)>;
const Encoder kRaw = [](const Bytes& in) { return in; };

// ---------------------------------------------------------------------------
// Chunking

int64_t product(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

Shape grid_of(const Shape& shape, const Shape& chunks) {
  Shape grid(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) grid[d] = (shape[d] + chunks[d] - 1) / chunks[d];
  return grid;
}

void for_each_index(const Shape& extent, const std::function<void(const Shape&)>& visit) {
  if (product(extent) == 0) return;
  Shape index(extent.size(), 0);
  for (;;) {
    visit(index);
    size_t d = extent.size();
    while (d > 0) {
      --d;
      if (++index[d] < extent[d]) break;
      index[d] = 0;
      if (d == 0) return;
    }
    if (extent.empty()) return;
  }
}

// The full chunk at `coords` (C order), edge chunks padded with `pad`.
Bytes chunk_of(const Bytes& array, const Shape& shape, const Shape& chunks, const Shape& coords, size_t item,
               uint8_t pad = 0xAB) {
  Bytes chunk(static_cast<size_t>(product(chunks)) * item, pad);
  int64_t position = 0;
  for_each_index(chunks, [&](const Shape& local) {
    int64_t offset = 0;
    bool inside = true;
    for (size_t d = 0; d < shape.size(); ++d) {
      const int64_t global = coords[d] * chunks[d] + local[d];
      inside = inside && global < shape[d];
      offset = offset * shape[d] + global;
    }
    if (inside) std::memcpy(chunk.data() + position * item, array.data() + offset * item, item);
    ++position;
  });
  return chunk;
}

// What zarr's transpose codec stores: encoded axis k is decoded axis order[k].
Bytes transpose_encode(const Bytes& chunk, const Shape& chunks, const Shape& order, size_t item) {
  Shape encoded_shape(chunks.size());
  for (size_t k = 0; k < chunks.size(); ++k) encoded_shape[k] = chunks[order[k]];
  Bytes out(chunk.size());
  int64_t position = 0;
  for_each_index(encoded_shape, [&](const Shape& encoded_index) {
    Shape decoded_index(chunks.size());
    for (size_t k = 0; k < chunks.size(); ++k) decoded_index[order[k]] = encoded_index[k];
    int64_t offset = 0;
    for (size_t d = 0; d < chunks.size(); ++d) offset = offset * chunks[d] + decoded_index[d];
    std::memcpy(out.data() + position * item, chunk.data() + offset * item, item);
    ++position;
  });
  return out;
}

Shape reversed_axes(size_t dims) {
  Shape order(dims);
  for (size_t d = 0; d < dims; ++d) order[d] = static_cast<int64_t>(dims - 1 - d);
  return order;
}

std::string v2_key(const Shape& coords, char separator) {
  std::string key;
  for (size_t d = 0; d < coords.size(); ++d) key += (d ? std::string(1, separator) : "") + std::to_string(coords[d]);
  return key;
}

std::string v3_key(const Shape& coords, char separator = '/') {
  std::string key = "c";
  for (int64_t c : coords) key += separator + std::to_string(c);
  return key;
}

using KeyFn = std::function<std::string(const Shape&)>;
using SkipFn = std::function<bool(const Shape&)>;

// One file per chunk, each the encoded full chunk.
void write_chunks(const std::string& dir, const Bytes& array, const Shape& shape, const Shape& chunks, size_t item,
                  const KeyFn& key, const Encoder& encode, const SkipFn& skip = nullptr) {
  for_each_index(grid_of(shape, chunks), [&](const Shape& coords) {
    if (skip && skip(coords)) return;
    write_file(dir + "/" + key(coords), encode(chunk_of(array, shape, chunks, coords, item)));
  });
}

struct ShardOptions {
  bool index_at_start = false;
  bool index_crc32c = true;
  SkipFn skip_inner;  // inner chunks (global inner coordinates) never written
  SkipFn skip_shard;  // shards never written
  char separator = '/';
};

// v3 shards: inner chunks encoded by `encode`, laid out in reverse order (the
// index must be followed, not assumed), index at the end or the start.
void write_shards(const std::string& dir, const Bytes& array, const Shape& shape, const Shape& shard_shape,
                  const Shape& inner_shape, size_t item, const Encoder& encode, const ShardOptions& options) {
  Shape per_shard(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) per_shard[d] = shard_shape[d] / inner_shape[d];
  const int64_t inner_count = product(per_shard);
  const size_t index_bytes = static_cast<size_t>(inner_count) * 16 + (options.index_crc32c ? 4 : 0);
  for_each_index(grid_of(shape, shard_shape), [&](const Shape& shard) {
    if (options.skip_shard && options.skip_shard(shard)) return;
    std::vector<Bytes> encoded;
    std::vector<Shape> globals;
    for_each_index(per_shard, [&](const Shape& local) {
      Shape global(shape.size());
      for (size_t d = 0; d < shape.size(); ++d) global[d] = shard[d] * per_shard[d] + local[d];
      globals.push_back(global);
      bool beyond = false;
      for (size_t d = 0; d < shape.size(); ++d) beyond = beyond || global[d] * inner_shape[d] >= shape[d];
      if (beyond || (options.skip_inner && options.skip_inner(global))) {
        encoded.emplace_back();
      } else {
        encoded.push_back(encode(chunk_of(array, shape, inner_shape, global, item)));
      }
    });
    std::vector<uint64_t> entries(static_cast<size_t>(inner_count) * 2, ~uint64_t{0});
    Bytes data;
    const uint64_t base = options.index_at_start ? index_bytes : 0;
    for (int64_t i = inner_count - 1; i >= 0; --i) {
      if (encoded[i].empty()) continue;
      entries[2 * i] = base + data.size();
      entries[2 * i + 1] = encoded[i].size();
      data.insert(data.end(), encoded[i].begin(), encoded[i].end());
    }
    Bytes index(static_cast<size_t>(inner_count) * 16);
    for (size_t e = 0; e < entries.size(); ++e) {
      for (int b = 0; b < 8; ++b) index[e * 8 + b] = static_cast<uint8_t>(entries[e] >> (8 * b));
    }
    if (options.index_crc32c) index = append_crc32c(index);
    Bytes shard_bytes = options.index_at_start ? index : data;
    const Bytes& tail = options.index_at_start ? data : index;
    shard_bytes.insert(shard_bytes.end(), tail.begin(), tail.end());
    write_file(dir + "/" + v3_key(shard, options.separator), shard_bytes);
  });
}

// ---------------------------------------------------------------------------
// Metadata

json v2_metadata(const Shape& shape, const Shape& chunks, const std::string& dtype, const json& compressor = nullptr,
                 const std::string& order = "C") {
  return json{{"zarr_format", 2},         {"shape", shape},  {"chunks", chunks}, {"dtype", dtype},
              {"compressor", compressor}, {"fill_value", 0}, {"order", order},   {"filters", nullptr}};
}

json v3_metadata(const Shape& shape, const Shape& chunks, const std::string& data_type, const json& codecs) {
  return json{{"zarr_format", 3},
              {"node_type", "array"},
              {"shape", shape},
              {"data_type", data_type},
              {"chunk_grid", {{"name", "regular"}, {"configuration", {{"chunk_shape", chunks}}}}},
              {"chunk_key_encoding", {{"name", "default"}, {"configuration", {{"separator", "/"}}}}},
              {"fill_value", 0},
              {"codecs", codecs},
              {"attributes", json::object()}};
}

json bytes_codec(const std::string& endian = "little") {
  return json{{"name", "bytes"}, {"configuration", {{"endian", endian}}}};
}

json sharding_codec(const Shape& inner, const json& inner_codecs, bool index_at_start, bool index_crc32c = true) {
  json index_codecs = json::array({bytes_codec()});
  if (index_crc32c) index_codecs.push_back(json{{"name", "crc32c"}});
  return json{{"name", "sharding_indexed"},
              {"configuration",
               {{"chunk_shape", inner},
                {"codecs", inner_codecs},
                {"index_codecs", index_codecs},
                {"index_location", index_at_start ? "start" : "end"}}}};
}

void write_json(const std::string& path, const json& value) { write_text(path, value.dump(2)); }

// ---------------------------------------------------------------------------
// Expected data and reading

template <typename T>
std::vector<T> sample_values(int64_t count, uint64_t seed = 7) {
  std::mt19937_64 random(seed);
  std::vector<T> values(static_cast<size_t>(count));
  for (auto& value : values) {
    if constexpr (std::is_floating_point_v<T>) {
      value = static_cast<T>(std::uniform_real_distribution<double>(-1000, 1000)(random));
    } else {
      value = static_cast<T>(random());
    }
  }
  return values;
}

template <typename T>
std::vector<T> read_all(const Array& array) {
  core::ThreadPool pool(3);
  const Bytes bytes = array.read_range(0, array.num_rows(), pool);
  std::vector<T> values(bytes.size() / sizeof(T));
  std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

// Bit-exact comparison (NaN == NaN with the same bits).
template <typename T>
void expect_same(const std::vector<T>& actual, const std::vector<T>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(std::memcmp(&actual[i], &expected[i], sizeof(T)), 0)
        << "element " << i << ": " << +actual[i] << " vs " << +expected[i];
  }
}

// Reads rows (with duplicates) into scattered destinations via Segments and
// compares every element with `expected`.
template <typename T>
void expect_scattered_reads(const Array& array, const std::vector<T>& expected, uint64_t seed) {
  const int64_t rows = array.num_rows();
  const int64_t row_elements = array.row_elements();
  std::mt19937_64 random(seed);
  for (int trial = 0; trial < 5; ++trial) {
    const int64_t count = 1 + static_cast<int64_t>(random() % static_cast<uint64_t>(2 * rows));
    std::vector<int64_t> sources(count), dests(count);
    for (auto& row : sources) row = static_cast<int64_t>(random() % static_cast<uint64_t>(rows));
    if (trial == 0) std::fill(sources.begin(), sources.end(), rows / 2);  // one row many times
    std::iota(dests.begin(), dests.end(), 0);
    std::shuffle(dests.begin(), dests.end(), random);
    const std::vector<Segment> segments = segments_for_rows(sources, dests);
    std::vector<T> out(static_cast<size_t>(count * row_elements));
    core::ThreadPool pool(trial % 3);
    array.read(segments, out.data(), pool);
    for (int64_t i = 0; i < count; ++i) {
      for (int64_t e = 0; e < row_elements; ++e) {
        const T& got = out[dests[i] * row_elements + e];
        const T& want = expected[sources[i] * row_elements + e];
        ASSERT_EQ(std::memcmp(&got, &want, sizeof(T)), 0) << "row " << sources[i] << " element " << e;
      }
    }
  }
}

// Reads the rows as blocks of consecutive rows (1 to 3 chunks long, some
// starting mid-chunk) delivered in shuffled block order, the way block
// strategies fetch: whole chunks then land in one piece in the output.
template <typename T>
void expect_block_reads(const Array& array, int64_t chunk_rows, const std::vector<T>& expected, uint64_t seed) {
  const int64_t rows = array.num_rows();
  const int64_t row_elements = array.row_elements();
  std::mt19937_64 random(seed);
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<std::pair<int64_t, int64_t>> blocks;  // [begin, end)
    for (int64_t begin = trial % 2 ? static_cast<int64_t>(random() % chunk_rows) : 0; begin < rows;) {
      const int64_t end = std::min(rows, begin + chunk_rows * (1 + static_cast<int64_t>(random() % 3)));
      blocks.emplace_back(begin, end);
      begin = end;
    }
    std::shuffle(blocks.begin(), blocks.end(), random);
    std::vector<Segment> segments;
    int64_t count = 0;
    for (const auto& [begin, end] : blocks) {
      segments.push_back(Segment{begin, end - begin, count});
      count += end - begin;
    }
    std::sort(segments.begin(), segments.end(), [](const Segment& a, const Segment& b) { return a.source < b.source; });
    std::vector<T> out(static_cast<size_t>(count * row_elements));
    core::ThreadPool pool(trial % 3);
    array.read(segments, out.data(), pool);
    for (const Segment& segment : segments) {
      for (int64_t i = 0; i < segment.length * row_elements; ++i) {
        const T& got = out[segment.dest * row_elements + i];
        const T& want = expected[segment.source * row_elements + i];
        ASSERT_EQ(std::memcmp(&got, &want, sizeof(T)), 0) << "rows from " << segment.source << " element " << i;
      }
    }
  }
}

// Runs `action`, expecting a ReadError whose message names the store and the path.
template <typename Action>
void expect_read_error(Action&& action, const std::string& store, const std::string& path,
                       const std::string& also = "") {
  try {
    action();
    FAIL() << "no ReadError";
  } catch (const core::ReadError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(store), std::string::npos) << message;
    EXPECT_NE(message.find(path), std::string::npos) << message;
    if (!also.empty()) {
      EXPECT_NE(message.find(also), std::string::npos) << message;
    }
  }
}

// ---------------------------------------------------------------------------
// zarr v2

TEST(ZarrV2, COrderUncompressedWithEdgeChunks) {
  TempDir store;
  const Shape shape{7, 5}, chunks{3, 2};
  const auto values = sample_values<float>(product(shape));
  const std::string dir = store.path() + "/X/data";
  write_json(dir + "/.zarray", v2_metadata(shape, chunks, "<f4"));
  write_chunks(
      dir, to_bytes(values), shape, chunks, 4, [](const Shape& c) { return v2_key(c, '.'); }, kRaw);
  const auto array = open_zarr_array(store.path(), "/X/data");
  EXPECT_EQ(array->info().file, store.path());
  EXPECT_EQ(array->info().path, "/X/data");
  EXPECT_EQ(array->info().dtype, DType::kFloat32);
  EXPECT_EQ(array->info().shape, shape);
  EXPECT_FALSE(array->info().big_endian);
  expect_same(read_all<float>(*array), values);
  expect_scattered_reads(*array, values, 1);
  // Paths without the leading slash, or with a trailing one, name the same array.
  expect_same(read_all<float>(*open_zarr_array(store.path(), "X/data/")), values);
}

TEST(ZarrV2, FortranOrder3D) {
  TempDir store;
  const Shape shape{5, 4, 3}, chunks{2, 3, 2};
  const auto values = sample_values<int32_t>(product(shape));
  write_json(store.path() + "/.zarray", v2_metadata(shape, chunks, "<i4", {{"id", "zlib"}, {"level", 1}}, "F"));
  write_chunks(
      store.path(), to_bytes(values), shape, chunks, 4, [](const Shape& c) { return v2_key(c, '.'); },
      [&](const Bytes& chunk) { return zlib_compress(transpose_encode(chunk, chunks, reversed_axes(3), 4)); });
  const auto array = open_zarr_array(store.path(), "/");
  EXPECT_EQ(array->info().path, "/");
  expect_same(read_all<int32_t>(*array), values);
  expect_scattered_reads(*array, values, 2);
}

TEST(ZarrV2, BigEndianTypes) {
  TempDir store;
  const Shape shape{10, 3}, chunks{4, 2};
  const auto doubles = sample_values<double>(product(shape));
  const auto shorts = sample_values<int16_t>(product(shape));
  write_json(store.path() + "/d/.zarray", v2_metadata(shape, chunks, ">f8"));
  write_chunks(
      store.path() + "/d", to_bytes(doubles), shape, chunks, 8, [](const Shape& c) { return v2_key(c, '.'); },
      [](const Bytes& chunk) { return byteswapped(chunk, 8); });
  write_json(store.path() + "/s/.zarray", v2_metadata(shape, chunks, ">i2", {{"id", "zstd"}, {"level", 1}}, "F"));
  write_chunks(
      store.path() + "/s", to_bytes(shorts), shape, chunks, 2, [](const Shape& c) { return v2_key(c, '.'); },
      [&](const Bytes& chunk) {
        return zstd_compress(byteswapped(transpose_encode(chunk, chunks, reversed_axes(2), 2), 2));
      });
  const auto d = open_zarr_array(store.path(), "/d");
  EXPECT_TRUE(d->info().big_endian);
  expect_same(read_all<double>(*d), doubles);
  expect_scattered_reads(*d, doubles, 3);
  expect_same(read_all<int16_t>(*open_zarr_array(store.path(), "/s")), shorts);
}

TEST(ZarrV2, MissingChunksReadAsFillValue) {
  TempDir store;
  const Shape shape{9, 4}, chunks{3, 3};
  const auto values = sample_values<float>(product(shape));
  const auto missing = [](const Shape& c) { return (c[0] == 1 && c[1] == 0) || c[0] == 2; };
  struct Case {
    json fill;
    std::string dtype;
    float expected;
  };
  const Case cases[] = {{"NaN", "<f4", NAN},
                        {"Infinity", "<f4", INFINITY},
                        {"-Infinity", ">f4", -INFINITY},
                        {2.5, "<f4", 2.5f},
                        {nullptr, "<f4", 0.0f}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fill.dump() + " " + c.dtype);
    json metadata = v2_metadata(shape, chunks, c.dtype);
    metadata["fill_value"] = c.fill;
    fs::remove_all(store.path() + "/a");
    write_json(store.path() + "/a/.zarray", metadata);
    const bool swap = c.dtype[0] == '>';
    write_chunks(
        store.path() + "/a", to_bytes(values), shape, chunks, 4, [](const Shape& x) { return v2_key(x, '.'); },
        [&](const Bytes& chunk) { return swap ? byteswapped(chunk, 4) : chunk; }, missing);
    std::vector<float> expected = values;
    for (int64_t r = 0; r < shape[0]; ++r) {
      for (int64_t col = 0; col < shape[1]; ++col) {
        if (missing({r / chunks[0], col / chunks[1]})) expected[r * shape[1] + col] = c.expected;
      }
    }
    const auto array = open_zarr_array(store.path(), "/a");
    const auto actual = read_all<float>(*array);
    ASSERT_EQ(actual.size(), expected.size());
    for (size_t i = 0; i < actual.size(); ++i) {
      if (std::isnan(expected[i])) {
        EXPECT_TRUE(std::isnan(actual[i])) << i;
      } else {
        EXPECT_EQ(actual[i], expected[i]) << i;
      }
    }
  }
}

TEST(ZarrV2, IntegerAndBoolFillValues) {
  TempDir store;
  const Shape shape{6}, chunks{4};
  json metadata = v2_metadata(shape, chunks, "<i8");
  metadata["fill_value"] = -7;
  write_json(store.path() + "/i/.zarray", metadata);
  write_file(store.path() + "/i/0", to_bytes(std::vector<int64_t>{1, 2, 3, 4}));
  expect_same(read_all<int64_t>(*open_zarr_array(store.path(), "/i")), std::vector<int64_t>{1, 2, 3, 4, -7, -7});

  metadata = v2_metadata(shape, chunks, "|b1");
  metadata["fill_value"] = true;
  write_json(store.path() + "/b/.zarray", metadata);
  write_file(store.path() + "/b/0", Bytes{0, 1, 2, 0});  // nonzero bytes read as 1
  const auto b = open_zarr_array(store.path(), "/b");
  EXPECT_EQ(b->info().dtype, DType::kBool);
  expect_same(read_all<uint8_t>(*b), std::vector<uint8_t>{0, 1, 1, 0, 1, 1});
}

TEST(ZarrV2, SlashDimensionSeparator) {
  TempDir store;
  const Shape shape{6, 5}, chunks{4, 2};
  const auto values = sample_values<uint16_t>(product(shape));
  json metadata = v2_metadata(shape, chunks, "<u2", {{"id", "gzip"}, {"level", 5}});
  metadata["dimension_separator"] = "/";
  write_json(store.path() + "/.zarray", metadata);
  write_chunks(
      store.path(), to_bytes(values), shape, chunks, 2, [](const Shape& c) { return v2_key(c, '/'); }, gzip_compress);
  EXPECT_TRUE(fs::exists(store.path() + "/1/2"));
  expect_same(read_all<uint16_t>(*open_zarr_array(store.path(), "/")), values);
}

TEST(ZarrV2, EveryCompressor) {
  const Shape shape{13, 6}, chunks{5, 4};
  const auto values = sample_values<double>(product(shape));
  struct Case {
    std::string name;
    json compressor;
    Encoder encode;
  };
  const std::vector<Case> cases = {
      {"none", nullptr, kRaw},
      {"blosc-lz4",
       {{"id", "blosc"}, {"cname", "lz4"}, {"clevel", 5}, {"shuffle", 1}, {"blocksize", 0}},
       [](const Bytes& in) { return blosc_compress(in, 8, BLOSC_SHUFFLE, "lz4"); }},
      {"blosc-zstd-bitshuffle",
       {{"id", "blosc"}, {"cname", "zstd"}, {"clevel", 5}, {"shuffle", 2}, {"blocksize", 0}},
       [](const Bytes& in) { return blosc_compress(in, 8, BLOSC_BITSHUFFLE, "zstd"); }},
      {"blosc-blosclz-noshuffle",
       {{"id", "blosc"}, {"cname", "blosclz"}, {"clevel", 5}, {"shuffle", 0}},
       [](const Bytes& in) { return blosc_compress(in, 8, BLOSC_NOSHUFFLE, "blosclz"); }},
      {"zstd", {{"id", "zstd"}, {"level", 3}}, zstd_compress},
      {"zlib", {{"id", "zlib"}, {"level", 6}}, zlib_compress},
      {"gzip", {{"id", "gzip"}, {"level", 6}}, gzip_compress},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TempDir store;
    write_json(store.path() + "/.zarray", v2_metadata(shape, chunks, "<f8", c.compressor));
    write_chunks(
        store.path(), to_bytes(values), shape, chunks, 8, [](const Shape& x) { return v2_key(x, '.'); }, c.encode);
    const auto array = open_zarr_array(store.path(), "/");
    expect_same(read_all<double>(*array), values);
    expect_scattered_reads(*array, values, 4);
  }
}

TEST(ZarrV2, ThreeDimensionsSplitEverywhere) {
  TempDir store;
  const Shape shape{11, 7, 5}, chunks{4, 3, 2};
  const auto values = sample_values<int64_t>(product(shape));
  write_json(store.path() + "/.zarray",
             v2_metadata(shape, chunks, "<i8", {{"id", "blosc"}, {"cname", "lz4"}, {"clevel", 5}, {"shuffle", 1}}));
  write_chunks(
      store.path(), to_bytes(values), shape, chunks, 8, [](const Shape& c) { return v2_key(c, '.'); },
      [](const Bytes& in) { return blosc_compress(in, 8, BLOSC_SHUFFLE, "lz4"); });
  const auto array = open_zarr_array(store.path(), "/");
  EXPECT_EQ(array->row_elements(), 35);
  expect_same(read_all<int64_t>(*array), values);
  expect_scattered_reads(*array, values, 5);
}

TEST(ZarrV2, ChunksLargerThanTheArray) {
  TempDir store;
  const Shape shape{3, 2}, chunks{10, 10};
  const auto values = sample_values<int32_t>(product(shape));
  write_json(store.path() + "/.zarray", v2_metadata(shape, chunks, "<i4"));
  write_chunks(
      store.path(), to_bytes(values), shape, chunks, 4, [](const Shape& c) { return v2_key(c, '.'); }, kRaw);
  expect_same(read_all<int32_t>(*open_zarr_array(store.path(), "/")), values);
}

// ---------------------------------------------------------------------------
// zarr v3

TEST(ZarrV3, DefaultKeyEncodingBothSeparators) {
  const Shape shape{9, 5}, chunks{4, 2};
  const auto values = sample_values<float>(product(shape));
  for (char separator : {'/', '.'}) {
    SCOPED_TRACE(separator);
    TempDir store;
    json metadata = v3_metadata(shape, chunks, "float32", json::array({bytes_codec()}));
    metadata["chunk_key_encoding"]["configuration"]["separator"] = std::string(1, separator);
    write_json(store.path() + "/a/zarr.json", metadata);
    write_chunks(
        store.path() + "/a", to_bytes(values), shape, chunks, 4, [&](const Shape& c) { return v3_key(c, separator); },
        kRaw);
    EXPECT_TRUE(is_zarr_array(store.path() + "/a"));
    const auto array = open_zarr_array(store.path(), "/a");
    expect_same(read_all<float>(*array), values);
    expect_scattered_reads(*array, values, 6);
  }
}

TEST(ZarrV3, V2KeyEncodingBothSeparators) {
  const Shape shape{9, 5}, chunks{4, 2};
  const auto values = sample_values<int32_t>(product(shape));
  for (char separator : {'.', '/'}) {
    SCOPED_TRACE(separator);
    TempDir store;
    json metadata = v3_metadata(shape, chunks, "int32", json::array({bytes_codec()}));
    metadata["chunk_key_encoding"] = {{"name", "v2"}};
    if (separator == '/') metadata["chunk_key_encoding"]["configuration"] = {{"separator", "/"}};
    write_json(store.path() + "/zarr.json", metadata);
    write_chunks(
        store.path(), to_bytes(values), shape, chunks, 4, [&](const Shape& c) { return v2_key(c, separator); }, kRaw);
    expect_same(read_all<int32_t>(*open_zarr_array(store.path(), "/")), values);
  }
}

TEST(ZarrV3, BigEndianBytesCodec) {
  TempDir store;
  const Shape shape{9, 4}, chunks{4, 3};
  const auto values = sample_values<double>(product(shape));
  write_json(store.path() + "/zarr.json",
             v3_metadata(shape, chunks, "float64", json::array({bytes_codec("big"), {{"name", "zstd"}}})));
  write_chunks(
      store.path(), to_bytes(values), shape, chunks, 8, [](const Shape& c) { return v3_key(c); },
      [](const Bytes& chunk) { return zstd_compress(byteswapped(chunk, 8)); });
  const auto array = open_zarr_array(store.path(), "/");
  EXPECT_TRUE(array->info().big_endian);
  expect_same(read_all<double>(*array), values);
  expect_scattered_reads(*array, values, 7);
}

TEST(ZarrV3, ComplexBigEndianSwapsEachPart) {
  TempDir store;
  const Shape shape{5}, chunks{2};
  const auto values = sample_values<float>(10);  // 5 complex64 as (re, im) pairs
  write_json(store.path() + "/zarr.json", v3_metadata(shape, chunks, "complex64", json::array({bytes_codec("big")})));
  write_chunks(
      store.path(), to_bytes(values), shape, chunks, 8, [](const Shape& c) { return v3_key(c); },
      [](const Bytes& chunk) { return byteswapped(chunk, 4); });
  expect_same(read_all<float>(*open_zarr_array(store.path(), "/")), values);
}

TEST(ZarrV3, TransposeCodecs) {
  TempDir store;
  const Shape shape{7, 5, 6}, chunks{3, 4, 5};
  const auto values = sample_values<uint32_t>(product(shape));
  const Shape order{2, 0, 1};
  json codecs = json::array({{{"name", "transpose"}, {"configuration", {{"order", order}}}},
                             bytes_codec(),
                             {{"name", "gzip"}, {"configuration", {{"level", 5}}}}});
  write_json(store.path() + "/one/zarr.json", v3_metadata(shape, chunks, "uint32", codecs));
  write_chunks(
      store.path() + "/one", to_bytes(values), shape, chunks, 4, [](const Shape& c) { return v3_key(c); },
      [&](const Bytes& chunk) { return gzip_compress(transpose_encode(chunk, chunks, order, 4)); });
  const auto one = open_zarr_array(store.path(), "/one");
  expect_same(read_all<uint32_t>(*one), values);
  expect_scattered_reads(*one, values, 8);

  // Two transposes compose: the second permutes the first's output.
  const Shape first{1, 0, 2}, second{2, 0, 1};
  const Shape after_first{chunks[1], chunks[0], chunks[2]};
  codecs = json::array({{{"name", "transpose"}, {"configuration", {{"order", first}}}},
                        {{"name", "transpose"}, {"configuration", {{"order", second}}}},
                        bytes_codec()});
  write_json(store.path() + "/two/zarr.json", v3_metadata(shape, chunks, "uint32", codecs));
  write_chunks(
      store.path() + "/two", to_bytes(values), shape, chunks, 4, [](const Shape& c) { return v3_key(c); },
      [&](const Bytes& chunk) {
        return transpose_encode(transpose_encode(chunk, chunks, first, 4), after_first, second, 4);
      });
  expect_same(read_all<uint32_t>(*open_zarr_array(store.path(), "/two")), values);
}

TEST(ZarrV3, BytesToBytesChains) {
  const Shape shape{10, 3}, chunks{4, 2};
  const auto values = sample_values<int16_t>(product(shape));
  const json crc = {{"name", "crc32c"}};
  const json gzip = {{"name", "gzip"}, {"configuration", {{"level", 5}}}};
  const json zstd = {{"name", "zstd"}, {"configuration", {{"level", 0}, {"checksum", false}}}};
  const json blosc = {
      {"name", "blosc"},
      {"configuration", {{"cname", "lz4"}, {"clevel", 5}, {"shuffle", "shuffle"}, {"typesize", 2}, {"blocksize", 0}}}};
  const auto blosc_encode = [](const Bytes& in) { return blosc_compress(in, 2, BLOSC_SHUFFLE, "lz4"); };
  struct Case {
    std::string name;
    json codecs;
    Encoder encode;
  };
  const std::vector<Case> cases = {
      {"crc32c", {bytes_codec(), crc}, append_crc32c},
      {"gzip", {bytes_codec(), gzip}, gzip_compress},
      {"zstd+crc32c", {bytes_codec(), zstd, crc}, [](const Bytes& in) { return append_crc32c(zstd_compress(in)); }},
      {"blosc", {bytes_codec(), blosc}, blosc_encode},
      {"crc32c+gzip", {bytes_codec(), crc, gzip}, [](const Bytes& in) { return gzip_compress(append_crc32c(in)); }},
      // Stacked compressors: the inner one's size comes from the outer frame's header.
      {"blosc+gzip", {bytes_codec(), blosc, gzip}, [&](const Bytes& in) { return gzip_compress(blosc_encode(in)); }},
      {"gzip+zstd+crc32c",
       {bytes_codec(), gzip, zstd, crc},
       [](const Bytes& in) { return append_crc32c(zstd_compress(gzip_compress(in))); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TempDir store;
    write_json(store.path() + "/zarr.json", v3_metadata(shape, chunks, "int16", c.codecs));
    write_chunks(
        store.path(), to_bytes(values), shape, chunks, 2, [](const Shape& x) { return v3_key(x); }, c.encode);
    expect_same(read_all<int16_t>(*open_zarr_array(store.path(), "/")), values);
  }
}

TEST(ZarrV3, FillValues) {
  TempDir store;
  const Shape shape{3}, chunks{2};
  const auto fill_of = [&](const std::string& name, const std::string& data_type, const json& fill) {
    json metadata = v3_metadata(shape, chunks, data_type, json::array({bytes_codec()}));
    metadata["fill_value"] = fill;
    write_json(store.path() + "/" + name + "/zarr.json", metadata);
    core::ThreadPool pool(0);
    return open_zarr_array(store.path(), "/" + name)->read_range(2, 3, pool);
  };
  const auto bits32 = [](const Bytes& bytes) {
    uint32_t bits;
    std::memcpy(&bits, bytes.data(), 4);
    return bits;
  };
  EXPECT_EQ(bits32(fill_of("hex", "float32", "0x7fc00001")), 0x7fc00001u);
  EXPECT_EQ(bits32(fill_of("nan", "float32", "NaN")), 0x7fc00000u);
  EXPECT_EQ(bits32(fill_of("inf", "float32", "-Infinity")), 0xff800000u);
  EXPECT_EQ(bits32(fill_of("u32", "uint32", 4000000000u)), 4000000000u);
  EXPECT_EQ(fill_of("f16", "float16", 1.5), (Bytes{0x00, 0x3e}));
  EXPECT_EQ(fill_of("f16small", "float16", 5.960464477539063e-08), (Bytes{0x01, 0x00}));  // smallest subnormal
  EXPECT_EQ(fill_of("f16big", "float16", 70000.0), (Bytes{0x00, 0x7c}));                  // overflows to infinity
  EXPECT_EQ(fill_of("bf16", "bfloat16", -2.0), (Bytes{0x00, 0xc0}));
  EXPECT_EQ(fill_of("bool", "bool", true), (Bytes{1}));
  EXPECT_EQ(fill_of("i8", "int8", -3), (Bytes{0xfd}));
  const Bytes complex = fill_of("c", "complex64", json::array({1.0, "-Infinity"}));
  std::vector<float> parts(2);
  std::memcpy(parts.data(), complex.data(), 8);
  EXPECT_EQ(parts[0], 1.0f);
  EXPECT_EQ(parts[1], -INFINITY);
  expect_read_error([&] { fill_of("bad", "int32", "abc"); }, store.path(), "/bad", "fill_value");
}

TEST(ZarrV3, ShardingIndexAtEndAndStart) {
  const Shape shape{22, 9}, shard{8, 6}, inner{4, 3};
  const auto values = sample_values<float>(product(shape));
  const json inner_codecs = json::array({bytes_codec(), {{"name", "zstd"}}, {{"name", "crc32c"}}});
  const auto encode = [](const Bytes& in) { return append_crc32c(zstd_compress(in)); };
  for (bool at_start : {false, true}) {
    for (bool index_crc : {true, false}) {
      SCOPED_TRACE(std::string(at_start ? "start" : "end") + (index_crc ? " crc" : ""));
      TempDir store;
      write_json(store.path() + "/s/zarr.json",
                 v3_metadata(shape, shard, "float32",
                             json::array({sharding_codec(inner, inner_codecs, at_start, index_crc)})));
      ShardOptions options;
      options.index_at_start = at_start;
      options.index_crc32c = index_crc;
      write_shards(store.path() + "/s", to_bytes(values), shape, shard, inner, 4, encode, options);
      const auto array = open_zarr_array(store.path(), "/s");
      expect_same(read_all<float>(*array), values);
      expect_scattered_reads(*array, values, 9);
    }
  }
}

// annbatch's layout: 1-D arrays, blosc-lz4 inner chunks in shards. Reads of
// whole chunks decode straight into the output; partial and missing chunks
// (fill value) go through the decode buffer; both paths in one read.
TEST(ZarrV3, ShardedBlockReadsOfWholeAndPartialChunks) {
  const Shape shape{1000}, shard{400}, inner{50};
  const auto values = sample_values<float>(product(shape));
  const json inner_codecs =
      json::array({bytes_codec(),
                   {{"name", "blosc"},
                    {"configuration",
                     {{"typesize", 4}, {"cname", "lz4"}, {"clevel", 3}, {"shuffle", "shuffle"}, {"blocksize", 0}}}}});
  TempDir store;
  json metadata = v3_metadata(shape, shard, "float32", json::array({sharding_codec(inner, inner_codecs, false)}));
  metadata["fill_value"] = -2.5;
  write_json(store.path() + "/zarr.json", metadata);
  ShardOptions options;
  options.skip_inner = [](const Shape& c) { return c[0] == 3 || c[0] == 12; };
  write_shards(
      store.path(), to_bytes(values), shape, shard, inner, 4,
      [](const Bytes& in) { return blosc_compress(in, 4, BLOSC_SHUFFLE, "lz4"); }, options);
  std::vector<float> expected = values;
  for (int64_t r = 0; r < shape[0]; ++r) {
    if (r / 50 == 3 || r / 50 == 12) expected[r] = -2.5f;
  }
  const auto array = open_zarr_array(store.path(), "/");
  expect_same(read_all<float>(*array), expected);
  expect_block_reads(*array, 50, expected, 11);
  expect_scattered_reads(*array, expected, 12);
}

// A read that needs part of a blosc-lz4 chunk decodes it whole the first
// time (lz4 has no checksum: a stream decoding to exactly its length is
// c-blosc's only check), then trusts it and decodes only what later reads
// need. A chunk damaged past the rows read is refused on every read.
TEST(ZarrV3, PartialChunkReadsCheckEachChunkWholeFirst) {
  const Shape shape{8000}, shard{4000}, inner{2000};
  // In each chunk, values in [1, 2) then in [1, 4): the exponent byte's lz4
  // stream is one match, then many short sequences (where the damage goes).
  std::vector<float> values(8000);
  std::mt19937_64 random(3);
  for (size_t i = 0; i < values.size(); ++i) {
    const float scale = i % 2000 >= 1000 && random() % 2 ? 2.0f : 1.0f;
    values[i] = (1.0f + static_cast<float>(random() % (1 << 20)) / (1 << 20)) * scale;
  }
  const Bytes bytes = to_bytes(values);
  const json inner_codecs =
      json::array({bytes_codec(),
                   {{"name", "blosc"},
                    {"configuration",
                     {{"typesize", 4}, {"cname", "lz4"}, {"clevel", 5}, {"shuffle", "shuffle"}, {"blocksize", 0}}}}});
  TempDir store;
  write_json(store.path() + "/zarr.json",
             v3_metadata(shape, shard, "float32", json::array({sharding_codec(inner, inner_codecs, false)})));
  bool damaged = false;
  blosc_set_splitmode(BLOSC_ALWAYS_SPLIT);  // annbatch's frames: a stream per byte plane
  write_shards(
      store.path(), bytes, shape, shard, inner, 4,
      [&](const Bytes& in) {
        Bytes frame = blosc_compress(in, 4, BLOSC_SHUFFLE, "lz4");
        if (!std::equal(in.begin(), in.end(), bytes.begin() + 2 * 2000 * 4)) return frame;  // chunk 2 only
        Bytes out(in.size());
        for (size_t at = frame.size() - 1; at > frame.size() - 64; --at) {  // the last stream's tail
          frame[at] ^= 0x40;
          if (blosc_decompress_ctx(frame.data(), out.data(), out.size(), 1) < 0) {
            damaged = true;
            break;
          }
          frame[at] ^= 0x40;
        }
        return frame;
      },
      ShardOptions{});
  blosc_set_splitmode(BLOSC_FORWARD_COMPAT_SPLIT);
  ASSERT_TRUE(damaged);
  const auto array = open_zarr_array(store.path(), "/");
  core::ThreadPool pool(1);
  std::vector<float> out(100);
  for (int read = 0; read < 3; ++read) {  // chunk 0 checked by the first read, trusted after
    for (const int64_t chunk : {0, 1, 3}) {
      std::fill(out.begin(), out.end(), 0.0f);
      array->read({Segment{chunk * 2000 + 10 * read, 100, 0}}, out.data(), pool);
      ASSERT_TRUE(std::equal(out.begin(), out.end(), values.begin() + chunk * 2000 + 10 * read)) << chunk;
    }
    expect_read_error(
        [&] {
          array->read({Segment{4000 + read, 100, 0}}, out.data(), pool);
        },
        store.path(), "/", "chunk (2,)");
  }
}

// Whole rows per chunk in two dimensions (the chunk spans every column).
TEST(ZarrV2, BlockReadsOfWholeRowChunks) {
  const Shape shape{97, 6}, chunks{8, 6};
  const auto values = sample_values<int32_t>(product(shape));
  TempDir store;
  write_json(store.path() + "/.zarray",
             v2_metadata(shape, chunks, "<i4",
                         {{"id", "blosc"}, {"cname", "lz4"}, {"clevel", 5}, {"shuffle", 1}, {"blocksize", 0}}));
  write_chunks(
      store.path(), to_bytes(values), shape, chunks, 4, [](const Shape& x) { return v2_key(x, '.'); },
      [](const Bytes& in) { return blosc_compress(in, 4, BLOSC_SHUFFLE, "lz4"); });
  const auto array = open_zarr_array(store.path(), "/");
  expect_block_reads(*array, 8, values, 13);
}

TEST(ZarrV3, ShardingMissingInnerChunksAndShards) {
  TempDir store;
  const Shape shape{16, 6}, shard{8, 6}, inner{4, 3};
  const auto values = sample_values<int32_t>(product(shape));
  json metadata =
      v3_metadata(shape, shard, "int32", json::array({sharding_codec(inner, json::array({bytes_codec()}), false)}));
  metadata["fill_value"] = -1;
  write_json(store.path() + "/zarr.json", metadata);
  ShardOptions options;
  options.skip_inner = [](const Shape& c) { return c[0] == 0 && c[1] == 1; };  // inner chunk (0, 1)
  options.skip_shard = [](const Shape& s) { return s[0] == 1; };               // the second shard: rows 8..15
  write_shards(store.path(), to_bytes(values), shape, shard, inner, 4, kRaw, options);
  std::vector<int32_t> expected = values;
  for (int64_t r = 0; r < shape[0]; ++r) {
    for (int64_t c = 0; c < shape[1]; ++c) {
      if (r >= 8 || (r < 4 && c >= 3)) expected[r * shape[1] + c] = -1;
    }
  }
  const auto array = open_zarr_array(store.path(), "/");
  expect_same(read_all<int32_t>(*array), expected);
  expect_scattered_reads(*array, expected, 10);
}

TEST(ZarrV3, Sharded3DWithEdgeShardsAndInnerTranspose) {
  TempDir store;
  const Shape shape{13, 7, 5}, shard{6, 4, 4}, inner{3, 2, 2};
  const auto values = sample_values<uint16_t>(product(shape));
  const Shape order{1, 2, 0};
  const json inner_codecs = json::array({{{"name", "transpose"}, {"configuration", {{"order", order}}}},
                                         bytes_codec("big"),
                                         {{"name", "gzip"}, {"configuration", {{"level", 1}}}}});
  json metadata = v3_metadata(shape, shard, "uint16", json::array({sharding_codec(inner, inner_codecs, true)}));
  metadata["chunk_key_encoding"]["configuration"]["separator"] = ".";
  write_json(store.path() + "/zarr.json", metadata);
  ShardOptions options;
  options.index_at_start = true;
  options.separator = '.';
  write_shards(
      store.path(), to_bytes(values), shape, shard, inner, 2,
      [&](const Bytes& chunk) { return gzip_compress(byteswapped(transpose_encode(chunk, inner, order, 2), 2)); },
      options);
  const auto array = open_zarr_array(store.path(), "/");
  EXPECT_TRUE(array->info().big_endian);
  expect_same(read_all<uint16_t>(*array), values);
  expect_scattered_reads(*array, values, 11);
}

TEST(ZarrV3, ConcurrentReadsShareShardIndexes) {
  TempDir store;
  const Shape shape{64, 2}, shard{16, 2}, inner{1, 2};
  const auto values = sample_values<double>(product(shape));
  write_json(
      store.path() + "/zarr.json",
      v3_metadata(shape, shard, "float64", json::array({sharding_codec(inner, json::array({bytes_codec()}), false)})));
  write_shards(store.path(), to_bytes(values), shape, shard, inner, 8, kRaw, ShardOptions{});
  const auto array = open_zarr_array(store.path(), "/");
  core::ThreadPool pool(8);
  for (int repeat = 0; repeat < 3; ++repeat) {
    const Bytes bytes = array->read_range(0, shape[0], pool);
    std::vector<double> actual(values.size());
    std::memcpy(actual.data(), bytes.data(), bytes.size());
    expect_same(actual, values);
  }
}

// ---------------------------------------------------------------------------
// Errors

TEST(ZarrV3, ForkedChildReadsShardsThroughItsOwnIndexCache) {
  TempDir store;
  const std::string s = store.path();
  const Shape shape{16}, shard{8}, inner{2};
  const auto values = sample_values<int32_t>(16);
  write_json(s + "/zarr.json", v3_metadata(shape, shard, "int32",
                                           json::array({sharding_codec(inner, json::array({bytes_codec()}), false)})));
  write_shards(s, to_bytes(values), shape, shard, inner, 4, kRaw, ShardOptions{});
  const auto array = open_zarr_array(s, "/");
  ASSERT_EQ(read_all<int32_t>(*array), values);  // the parent's cache holds both shard indexes
  const pid_t child = fork();
  if (child == 0) {
    alarm(10);
    _exit(read_all<int32_t>(*array) == values ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_EQ(read_all<int32_t>(*array), values);
}

TEST(ZarrErrors, Metadata) {
  TempDir store;
  const std::string s = store.path();
  const auto open = [&](const std::string& path) { return [&, path] { open_zarr_array(s, path); }; };

  write_text(s + "/badjson/.zarray", "{\"shape\": [3], ");
  expect_read_error(open("/badjson"), s, "/badjson", "JSON");

  expect_read_error(open("/nothing"), s, "/nothing");

  write_json(s + "/nocodec/zarr.json",
             v3_metadata({4}, {2}, "int32", json::array({bytes_codec(), {{"name", "lz77-from-mars"}}})));
  expect_read_error(open("/nocodec"), s, "/nocodec", "lz77-from-mars");

  write_json(s + "/noaa/zarr.json",
             v3_metadata({4}, {2}, "int32", json::array({{{"name", "bitround"}}, bytes_codec()})));
  expect_read_error(open("/noaa"), s, "/noaa", "bitround");

  write_json(s + "/nocompressor/.zarray", v2_metadata({4}, {2}, "<i4", {{"id", "lz4"}}));
  expect_read_error(open("/nocompressor"), s, "/nocompressor", "lz4");

  json filtered = v2_metadata({4}, {2}, "<i4");
  filtered["filters"] = json::array({{{"id", "delta"}, {"dtype", "<i4"}}});
  write_json(s + "/filtered/.zarray", filtered);
  expect_read_error(open("/filtered"), s, "/filtered", "unsupported zarr filter 'delta'");

  write_json(s + "/dtype/.zarray", v2_metadata({4}, {2}, "<M8[ns]"));
  expect_read_error(open("/dtype"), s, "/dtype", "M8");

  write_json(s + "/v3dtype/zarr.json", v3_metadata({4}, {2}, "float8", json::array({bytes_codec()})));
  expect_read_error(open("/v3dtype"), s, "/v3dtype", "float8");

  write_json(s + "/noshape/.zarray", json{{"chunks", {2}}, {"dtype", "<i4"}});
  expect_read_error(open("/noshape"), s, "/noshape", "shape");

  write_json(s + "/mismatch/.zarray", v2_metadata({4, 4}, {2}, "<i4"));
  expect_read_error(open("/mismatch"), s, "/mismatch");

  write_json(s + "/twobytes/zarr.json", v3_metadata({4}, {2}, "int32", json::array({bytes_codec(), bytes_codec()})));
  expect_read_error(open("/twobytes"), s, "/twobytes");

  write_json(s + "/group/zarr.json", json{{"zarr_format", 3}, {"node_type", "group"}});
  expect_read_error(open("/group"), s, "/group", "not a zarr array");

  write_json(s + "/badshard/zarr.json",
             v3_metadata({8}, {6}, "int32", json::array({sharding_codec({4}, json::array({bytes_codec()}), false)})));
  expect_read_error(open("/badshard"), s, "/badshard", "multiple");

  write_json(s + "/strings/zarr.json", v3_metadata({4}, {2}, "string", json::array({{{"name", "vlen-utf8"}}})));
  expect_read_error(open("/strings"), s, "/strings", "string");

  write_json(s + "/scalar/.zarray", v2_metadata({}, {}, "<i4"));
  EXPECT_THROW(open_zarr_array(s, "/scalar"), core::InvalidArgument);
  EXPECT_THROW(open_zarr_array(s, "/a/../b"), core::InvalidArgument);
}

TEST(ZarrErrors, CorruptChunks) {
  TempDir store;
  const std::string s = store.path();
  const Shape shape{8}, chunks{4};
  const auto values = sample_values<int32_t>(8);
  const auto read = [&](const std::string& path) {
    return [&, path] { read_all<int32_t>(*open_zarr_array(s, path)); };
  };

  write_json(s + "/short/.zarray", v2_metadata(shape, chunks, "<i4"));
  write_chunks(
      s + "/short", to_bytes(values), shape, chunks, 4, [](const Shape& c) { return v2_key(c, '.'); },
      [](const Bytes& in) { return Bytes(in.begin(), in.end() - 3); },
      [](const Shape& c) { return c[0] == 0; });  // only chunk (1,) is on disk
  expect_read_error(read("/short"), s, "/short", "chunk (1,) (1): stored chunk holds 13 bytes, expected 16");

  write_json(s + "/zstd/.zarray", v2_metadata(shape, chunks, "<i4", {{"id", "zstd"}}));
  write_chunks(
      s + "/zstd", to_bytes(values), shape, chunks, 4, [](const Shape& c) { return v2_key(c, '.'); },
      [](const Bytes& in) {
        Bytes out = zstd_compress(in);
        out.resize(out.size() / 2);
        return out;
      });
  expect_read_error(read("/zstd"), s, "/zstd");

  write_json(s + "/blosc/.zarray", v2_metadata(shape, chunks, "<i4", {{"id", "blosc"}}));
  write_chunks(
      s + "/blosc", to_bytes(values), shape, chunks, 4, [](const Shape& c) { return v2_key(c, '.'); },
      [](const Bytes&) {
        return Bytes{2, 1, 0x11, 4};
      });
  expect_read_error(read("/blosc"), s, "/blosc");

  write_json(s + "/crc/zarr.json", v3_metadata(shape, chunks, "int32", {bytes_codec(), {{"name", "crc32c"}}}));
  write_chunks(
      s + "/crc", to_bytes(values), shape, chunks, 4, [](const Shape& c) { return v3_key(c); },
      [](const Bytes& in) {
        Bytes out = append_crc32c(in);
        out[2] ^= 0x40;
        return out;
      });
  expect_read_error(read("/crc"), s, "/crc", "crc32c");

  // A compressed chunk that decodes to the wrong size.
  write_json(s + "/size/zarr.json", v3_metadata(shape, chunks, "int32", {bytes_codec(), {{"name", "gzip"}}}));
  write_chunks(
      s + "/size", to_bytes(values), shape, chunks, 4, [](const Shape& c) { return v3_key(c); },
      [](const Bytes& in) { return gzip_compress(Bytes(in.begin(), in.end() - 4)); });
  expect_read_error(read("/size"), s, "/size");
}

TEST(ZarrErrors, CorruptShards) {
  TempDir store;
  const std::string s = store.path();
  const Shape shape{8}, shard{8}, inner{2};
  const auto values = sample_values<int32_t>(8);
  const auto read = [&](const std::string& path) {
    return [&, path] { read_all<int32_t>(*open_zarr_array(s, path)); };
  };
  const auto make = [&](const std::string& name, bool crc) {
    write_json(s + "/" + name + "/zarr.json",
               v3_metadata(shape, shard, "int32",
                           json::array({sharding_codec(inner, json::array({bytes_codec()}), false, crc)})));
    ShardOptions options;
    options.index_crc32c = crc;
    write_shards(s + "/" + name, to_bytes(values), shape, shard, inner, 4, kRaw, options);
    return s + "/" + name + "/c/0";
  };

  // Index entry 1's offset pushed past the end of the file (no index crc to catch it first).
  std::string file = make("past", false);
  Bytes bytes = read_file(file);
  const size_t index_start = bytes.size() - 4 * 16;
  bytes[index_start + 16 + 6] = 0x01;  // offset += 2^48
  write_file(file, bytes);
  expect_read_error(read("/past"), s, "/past", "of shard c/0: shard index entry 1");

  // nbytes running past the end.
  file = make("long", false);
  bytes = read_file(file);
  bytes[bytes.size() - 4 * 16 + 8] = 0xff;
  write_file(file, bytes);
  expect_read_error(read("/long"), s, "/long", "outside");

  // Index checksum mismatch.
  file = make("indexcrc", true);
  bytes = read_file(file);
  bytes[bytes.size() - 10] ^= 1;
  write_file(file, bytes);
  expect_read_error(read("/indexcrc"), s, "/indexcrc", "crc32c");

  // Shard shorter than its index.
  file = make("tiny", true);
  write_file(file, Bytes(10, 0));
  expect_read_error(read("/tiny"), s, "/tiny", "truncated");

  // An inner chunk of the wrong size.
  file = make("inner", false);
  bytes = read_file(file);
  bytes[bytes.size() - 4 * 16 + 8] -= 1;  // entry 0's nbytes one short
  write_file(file, bytes);
  expect_read_error(read("/inner"), s, "/inner", "inner chunk (0,)");

  // One coordinate missing (only offset set to the marker) is corrupt, not missing.
  file = make("half", false);
  bytes = read_file(file);
  std::fill_n(bytes.end() - 4 * 16, 8, 0xff);
  write_file(file, bytes);
  expect_read_error(read("/half"), s, "/half", "outside");
}

Bytes vlen_encode(const std::vector<std::string>& items);

// Sizes, shapes and types read from metadata: checked against the zarr
// specification and against each other before anything is allocated.
TEST(ZarrErrors, MetadataTypesAndSizesAreCheckedBeforeUse) {
  TempDir store;
  const std::string s = store.path();
  const auto open = [&](const std::string& path) { return [&, path] { open_zarr_array(s, path); }; };

  // The transpose order is a list of axes (zarr-python refuses the draft's "F" too), and a permutation.
  for (const json& order : {json("F"), json("C"), json::array({0, 0}), json::array({1}), json::array({0, 2})}) {
    write_json(
        s + "/transpose/zarr.json",
        v3_metadata({4, 2}, {2, 2}, "int32",
                    json::array({{{"name", "transpose"}, {"configuration", {{"order", order}}}}, bytes_codec()})));
    expect_read_error(open("/transpose"), s, "/transpose", "transpose order");
  }
  // Shapes of 2^63 bytes or more, and integers past int64.
  write_json(s + "/wide/zarr.json",
             v3_metadata({std::numeric_limits<int64_t>::max()}, {8}, "int32", json::array({bytes_codec()})));
  expect_read_error(open("/wide"), s, "/wide", "2^63");
  json unsigned_shape = v2_metadata({4}, {2}, "<i4");
  unsigned_shape["shape"] = json::array({uint64_t{1} << 63});
  write_json(s + "/unsigned/.zarray", unsigned_shape);
  expect_read_error(open("/unsigned"), s, "/unsigned", "above 2^63 - 1");
  // Fixed-length strings: digits only.
  for (const char* dtype : {"<U3abc", "<U-5", "|S0", "<U99999999999"}) {
    write_json(s + "/fixed/.zarray", v2_metadata({4}, {2}, dtype));
    expect_read_error([&] { read_zarr_strings(s, "/fixed"); }, s, "/fixed", "dtype");
  }
  // fill_value is required (in v2 it may be null): without it, missing chunks have no value.
  json no_fill = v2_metadata({4}, {2}, "<i4");
  no_fill.erase("fill_value");
  write_json(s + "/nofill/.zarray", no_fill);
  expect_read_error(open("/nofill"), s, "/nofill", "missing \"fill_value\"");
  json v3_no_fill = v3_metadata({4}, {2}, "int32", json::array({bytes_codec()}));
  v3_no_fill.erase("fill_value");
  write_json(s + "/v3nofill/zarr.json", v3_no_fill);
  expect_read_error(open("/v3nofill"), s, "/v3nofill", "missing \"fill_value\"");
  // Metadata that is not UTF-8: the message escapes the bytes.
  write_text(s + "/binary/.zarray", "{\"shape\": [4], \"chunks\": [2], \"dtype\": \"<i4\xff\xfe\"}");
  try {
    open_zarr_array(s, "/binary");
    FAIL() << "no ReadError";
  } catch (const core::ReadError& error) {
    EXPECT_TRUE(is_valid_utf8(error.what())) << error.what();
    EXPECT_NE(std::string(error.what()).find("\\x"), std::string::npos) << error.what();
  }
}

TEST(ZarrErrors, HugeDeclaredSizesFailBeforeAllocating) {
  TempDir store;
  const std::string s = store.path();
  core::ThreadPool pool(0);
  // The largest 1-D uint8 array: the chunk grid must not overflow, missing chunks read as the fill value.
  json huge = v3_metadata({std::numeric_limits<int64_t>::max()}, {8}, "uint8", json::array({bytes_codec()}));
  huge["fill_value"] = 3;
  write_json(s + "/huge/zarr.json", huge);
  const auto array = open_zarr_array(s, "/huge");
  std::vector<uint8_t> tail(8);
  const int64_t last = std::numeric_limits<int64_t>::max() - 8;
  array->read({Segment{last, 8, 0}}, tail.data(), pool);
  EXPECT_EQ(tail, std::vector<uint8_t>(8, 3));

  // Chunks claiming 2^40 elements, a chunk that records its true size: refused
  // before a 4 TiB buffer exists (under AddressSanitizer that allocation would abort).
  const std::vector<int32_t> values = sample_values<int32_t>(4);
  write_json(s + "/bigchunk/.zarray", v2_metadata({4}, {int64_t{1} << 40}, "<i4", {{"id", "zstd"}}));
  write_file(s + "/bigchunk/0", zstd_compress(to_bytes(values)));
  expect_read_error([&] { read_all<int32_t>(*open_zarr_array(s, "/bigchunk")); }, s, "/bigchunk", "chunk (0,)");
  write_json(s + "/bigblosc/.zarray", v2_metadata({4}, {int64_t{1} << 40}, "<i4", {{"id", "blosc"}}));
  write_file(s + "/bigblosc/0", blosc_compress(to_bytes(values), 4, 1, "lz4"));
  expect_read_error([&] { read_all<int32_t>(*open_zarr_array(s, "/bigblosc")); }, s, "/bigblosc", "chunk (0,)");

  // A shard of 2^40 inner chunks: its index cannot be in a small file.
  write_json(s + "/shard/zarr.json",
             v3_metadata({8}, {int64_t{1} << 40}, "int32",
                         json::array({sharding_codec({1}, json::array({bytes_codec()}), false)})));
  write_file(s + "/shard/c/0", Bytes(64, 0));
  expect_read_error([&] { read_all<int32_t>(*open_zarr_array(s, "/shard")); }, s, "/shard", "index");

  // A string array claiming 2^62 strings in chunks of 4: refused from its shape.
  write_json(s + "/names/zarr.json",
             v3_metadata({int64_t{1} << 62}, {4}, "string", json::array({{{"name", "vlen-utf8"}}})));
  expect_read_error([&] { read_zarr_strings(s, "/names"); }, s, "/names", "corrupt shape");
  // A blosc string chunk whose header claims 2 GiB from a few bytes.
  write_json(s + "/blosc_names/.zarray", [] {
    json meta = v2_metadata({3}, {3}, "|O", {{"id", "blosc"}});
    meta["filters"] = json::array({{{"id", "vlen-utf8"}}});
    return meta;
  }());
  Bytes lying = blosc_compress(vlen_encode({"a", "b", "c"}), 1, 0, "lz4");
  lying[4] = 0, lying[5] = 0, lying[6] = 0, lying[7] = 0x80;  // nbytes = 2^31
  write_file(s + "/blosc_names/0", lying);
  expect_read_error([&] { read_zarr_strings(s, "/blosc_names"); }, s, "/blosc_names", "blosc");
}

TEST(ZarrErrors, RowsOutsideTheArray) {
  TempDir store;
  write_json(store.path() + "/.zarray", v2_metadata({4}, {2}, "<i4"));
  const auto array = open_zarr_array(store.path(), "/");
  core::ThreadPool pool(0);
  std::vector<int32_t> out(4);
  EXPECT_THROW(array->read({Segment{3, 2, 0}}, out.data(), pool), core::InvalidArgument);
}

// ---------------------------------------------------------------------------
// Strings

Bytes vlen_encode(const std::vector<std::string>& items) {
  Bytes out;
  const auto put32 = [&](uint32_t value) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
  };
  put32(static_cast<uint32_t>(items.size()));
  for (const std::string& item : items) {
    put32(static_cast<uint32_t>(item.size()));
    out.insert(out.end(), item.begin(), item.end());
  }
  return out;
}

Bytes utf32_encode(const std::vector<uint32_t>& code_points, size_t length) {
  Bytes out(length * 4, 0);
  for (size_t i = 0; i < code_points.size(); ++i) {
    for (int b = 0; b < 4; ++b) out[i * 4 + b] = static_cast<uint8_t>(code_points[i] >> (8 * b));
  }
  return out;
}

const std::vector<std::string> kWords = {"alpha", "", "γάμμα", "delta-δ", "ε", "zeta 🦓", "eta"};

TEST(ZarrStrings, V2VariableLength) {
  TempDir store;
  const std::string s = store.path();
  write_json(s + "/.zgroup", json{{"zarr_format", 2}});
  for (const std::string compression : {"none", "zstd", "blosc", "gzip"}) {
    SCOPED_TRACE(compression);
    json metadata = v2_metadata({7}, {3}, "|O");
    metadata["filters"] = json::array({{{"id", "vlen-utf8"}}});
    metadata["fill_value"] = "";
    Encoder encode = kRaw;
    if (compression == "zstd") {
      metadata["compressor"] = {{"id", "zstd"}, {"level", 0}};
      encode = zstd_compress;
    } else if (compression == "blosc") {
      metadata["compressor"] = {{"id", "blosc"}, {"cname", "lz4"}, {"shuffle", 1}};
      encode = [](const Bytes& in) { return blosc_compress(in, 1, BLOSC_SHUFFLE, "lz4"); };
    } else if (compression == "gzip") {
      metadata["compressor"] = {{"id", "gzip"}};
      encode = gzip_compress;
    }
    const std::string dir = s + "/" + compression;
    write_json(dir + "/.zarray", metadata);
    for (int chunk = 0; chunk < 3; ++chunk) {
      std::vector<std::string> items;
      for (int i = chunk * 3; i < chunk * 3 + 3; ++i) items.push_back(i < 7 ? kWords[i] : "");
      write_file(dir + "/" + std::to_string(chunk), encode(vlen_encode(items)));
    }
    EXPECT_EQ(open_zarr_group(s)->read_strings(compression), kWords);
  }
  // A missing chunk reads as the fill value.
  json metadata = v2_metadata({5}, {2}, "|O");
  metadata["filters"] = json::array({{{"id", "vlen-utf8"}}});
  metadata["fill_value"] = "?";
  write_json(s + "/gaps/.zarray", metadata);
  write_file(s + "/gaps/0", vlen_encode({"a", "b"}));
  write_file(s + "/gaps/2", vlen_encode({"e", "f"}));
  EXPECT_EQ(read_zarr_strings(s, "/gaps"), (std::vector<std::string>{"a", "b", "?", "?", "e"}));
  // Wrong item count and truncation are read errors.
  write_file(s + "/gaps/0", vlen_encode({"a"}));
  expect_read_error([&] { read_zarr_strings(s, "/gaps"); }, s, "/gaps", "holds 1 items");
  Bytes truncated = vlen_encode({"abc", "def"});
  truncated.pop_back();
  write_file(s + "/gaps/0", truncated);
  expect_read_error([&] { read_zarr_strings(s, "/gaps"); }, s, "/gaps", "truncated");
}

TEST(ZarrStrings, V2FixedLength) {
  TempDir store;
  const std::string s = store.path();
  write_json(s + "/u/.zarray", v2_metadata({3}, {2}, "<U4", {{"id", "zlib"}}));
  Bytes chunk0 = utf32_encode({'a', 'b', 'c', 'd'}, 4);
  const Bytes second = utf32_encode({0x3b3, 0x1f993}, 4);
  chunk0.insert(chunk0.end(), second.begin(), second.end());
  write_file(s + "/u/0", zlib_compress(chunk0));
  Bytes chunk1 = utf32_encode({'x'}, 4);
  chunk1.resize(32, 0);
  write_file(s + "/u/1", zlib_compress(chunk1));
  EXPECT_EQ(read_zarr_strings(s, "/u"), (std::vector<std::string>{"abcd", "γ🦓", "x"}));

  write_json(s + "/ub/.zarray", v2_metadata({2}, {2}, ">U2"));
  write_file(s + "/ub/0", byteswapped(utf32_encode({'h', 'i', 'z'}, 4), 4));
  EXPECT_EQ(read_zarr_strings(s, "/ub"), (std::vector<std::string>{"hi", "z"}));

  write_json(s + "/b/.zarray", v2_metadata({3}, {3}, "|S3"));
  write_file(s + "/b/0", Bytes{'a', 0, 0, 'b', 'c', 'd', 'e', 0, 'f'});
  EXPECT_EQ(read_zarr_strings(s, "/b"), (std::vector<std::string>{"a", "bcd", std::string("e\0f", 3)}));

  write_json(s + "/n/.zarray", v2_metadata({3}, {3}, "<i4"));
  expect_read_error([&] { read_zarr_strings(s, "/n"); }, s, "/n", "not a string array");
  write_json(s + "/u2d/.zarray", v2_metadata({3, 2}, {3, 2}, "<U2"));
  expect_read_error([&] { read_zarr_strings(s, "/u2d"); }, s, "/u2d", "1-D");
  write_file(s + "/bad/0", utf32_encode({0x110000}, 2));
  write_json(s + "/bad/.zarray", v2_metadata({1}, {1}, "<U2"));
  expect_read_error([&] { read_zarr_strings(s, "/bad"); }, s, "/bad", "code point");
}

TEST(ZarrStrings, V3) {
  TempDir store;
  const std::string s = store.path();
  json metadata = v3_metadata({7}, {4}, "string", json::array({{{"name", "vlen-utf8"}}, {{"name", "zstd"}}}));
  metadata["fill_value"] = "";
  write_json(s + "/v/zarr.json", metadata);
  write_file(s + "/v/c/0", zstd_compress(vlen_encode({kWords.begin(), kWords.begin() + 4})));
  write_file(s + "/v/c/1", zstd_compress(vlen_encode({kWords[4], kWords[5], kWords[6], ""})));
  EXPECT_EQ(read_zarr_strings(s, "/v"), kWords);

  // Sharded, with a missing inner chunk.
  metadata = v3_metadata({5}, {4}, "string",
                         json::array({sharding_codec({2}, json::array({{{"name", "vlen-utf8"}}}), false)}));
  metadata["fill_value"] = "-";
  write_json(s + "/sharded/zarr.json", metadata);
  const Bytes a = vlen_encode({"p", "q"}), c = vlen_encode({"t", ""});
  Bytes shard0 = a;
  std::vector<uint64_t> entries = {0, a.size(), ~uint64_t{0}, ~uint64_t{0}};
  Bytes index;
  for (uint64_t e : entries) {
    for (int b = 0; b < 8; ++b) index.push_back(static_cast<uint8_t>(e >> (8 * b)));
  }
  index = append_crc32c(index);
  shard0.insert(shard0.end(), index.begin(), index.end());
  write_file(s + "/sharded/c/0", shard0);
  Bytes shard1 = c;
  index.clear();
  entries = {0, c.size(), ~uint64_t{0}, ~uint64_t{0}};
  for (uint64_t e : entries) {
    for (int b = 0; b < 8; ++b) index.push_back(static_cast<uint8_t>(e >> (8 * b)));
  }
  index = append_crc32c(index);
  shard1.insert(shard1.end(), index.begin(), index.end());
  write_file(s + "/sharded/c/1", shard1);
  EXPECT_EQ(read_zarr_strings(s, "/sharded"), (std::vector<std::string>{"p", "q", "-", "-", "t"}));

  // fixed_length_utf32 and null_terminated_bytes, as zarr-python 3 writes them.
  metadata = v3_metadata({2}, {2}, "", json::array({bytes_codec(), {{"name", "gzip"}}}));
  metadata["data_type"] = {{"name", "fixed_length_utf32"}, {"configuration", {{"length_bytes", 12}}}};
  write_json(s + "/u/zarr.json", metadata);
  Bytes utf32 = utf32_encode({'o', 'n', 'e'}, 3);
  const Bytes two = utf32_encode({0xe9}, 3);
  utf32.insert(utf32.end(), two.begin(), two.end());
  write_file(s + "/u/c/0", gzip_compress(utf32));
  EXPECT_EQ(read_zarr_strings(s, "/u"), (std::vector<std::string>{"one", "é"}));

  metadata = v3_metadata({3}, {2}, "", json::array({{{"name", "bytes"}}}));
  metadata["data_type"] = {{"name", "null_terminated_bytes"}, {"configuration", {{"length_bytes", 2}}}};
  write_json(s + "/b/zarr.json", metadata);
  write_file(s + "/b/c/0", Bytes{'a', 'b', 'c', 0});
  EXPECT_EQ(read_zarr_strings(s, "/b"), (std::vector<std::string>{"ab", "c", ""}));

  write_json(s + "/mismatch/zarr.json", v3_metadata({3}, {2}, "string", json::array({bytes_codec()})));
  expect_read_error([&] { read_zarr_strings(s, "/mismatch"); }, s, "/mismatch", "array->bytes");
}

// AnnData writes scalar strings (uns values) as 0-d arrays: one string.
TEST(ZarrStrings, ZeroDimensional) {
  TempDir store;
  const std::string s = store.path();
  json metadata = v2_metadata({}, {}, "|O", {{"id", "zstd"}});
  metadata["filters"] = json::array({{{"id", "vlen-utf8"}}});
  write_json(s + "/v2/.zarray", metadata);
  write_file(s + "/v2/0", zstd_compress(vlen_encode({"hello"})));
  EXPECT_EQ(read_zarr_strings(s, "/v2"), std::vector<std::string>{"hello"});

  write_json(s + "/v3/zarr.json", v3_metadata({}, {}, "string", json::array({{{"name", "vlen-utf8"}}})));
  write_file(s + "/v3/c", vlen_encode({"wörld"}));
  EXPECT_EQ(read_zarr_strings(s, "/v3"), std::vector<std::string>{"wörld"});

  write_json(s + "/missing/zarr.json", v3_metadata({}, {}, "string", json::array({{{"name", "vlen-utf8"}}})));
  EXPECT_EQ(read_zarr_strings(s, "/missing"), std::vector<std::string>{""});
}

// zlib and gzip record no decoded size, which variable-length chunks need:
// inflated into a buffer that grows as the stream goes; a damaged stream is
// still an error naming the chunk.
TEST(ZarrStrings, ZlibAndGzipChunksInflateAsFarAsTheyGo) {
  TempDir store;
  const std::string s = store.path();
  std::vector<std::string> names;
  for (int i = 0; i < 5000; ++i) names.push_back("cell_" + std::to_string(i * 7919));
  const std::vector<std::string> first(names.begin(), names.begin() + 3000);
  std::vector<std::string> second(names.begin() + 3000, names.end());
  second.resize(3000);  // an edge chunk is stored whole
  for (const std::string codec : {"zlib", "gzip"}) {
    json metadata = v2_metadata({5000}, {3000}, "|O", {{"id", codec}, {"level", 5}});
    metadata["filters"] = json::array({{{"id", "vlen-utf8"}}});
    write_json(s + "/" + codec + "/.zarray", metadata);
    const auto pack = [&](const std::vector<std::string>& part) {
      return codec == "zlib" ? zlib_compress(vlen_encode(part)) : gzip_compress(vlen_encode(part));
    };
    write_file(s + "/" + codec + "/0", pack(first));
    write_file(s + "/" + codec + "/1", pack(second));
    EXPECT_EQ(read_zarr_strings(s, "/" + codec), names) << codec;
    std::vector<uint8_t> truncated = pack(second);
    truncated.resize(truncated.size() / 2);
    write_file(s + "/" + codec + "/1", truncated);
    expect_read_error([&] { read_zarr_strings(s, "/" + codec); }, s, "/" + codec, "stream is truncated");
  }
}

// Stores this reader refuses, with a message saying why.
TEST(ZarrStrings, UnsupportedLayouts) {
  TempDir store;
  const std::string s = store.path();
  // Compression of whole shards would need every shard read whole.
  write_json(s + "/outer/zarr.json",
             v3_metadata({4}, {4}, "int32",
                         json::array({sharding_codec({2}, json::array({bytes_codec()}), false), {{"name", "zstd"}}})));
  expect_read_error([&] { open_zarr_array(s, "/outer"); }, s, "/outer", "'zstd' after sharding_indexed");
}

// ---------------------------------------------------------------------------
// Groups

TEST(ZarrGroup, V2ChildrenAndAttributes) {
  TempDir store;
  const std::string s = store.path();
  write_json(s + "/.zgroup", json{{"zarr_format", 2}});
  write_text(s + "/.zattrs", R"({"encoding-type": "anndata", "encoding-version": "0.1.0", "nan": NaN})");
  write_json(s + "/obs/.zgroup", json{{"zarr_format", 2}});
  write_json(s + "/obs/.zattrs", json{{"_index", "cell"}, {"column-order", {"a", "b"}}});
  write_json(s + "/obs/cell/.zarray", v2_metadata({2}, {2}, "|S1"));
  write_file(s + "/obs/cell/0", Bytes{'x', 'y'});
  write_json(s + "/X/.zarray", v2_metadata({2, 2}, {1, 2}, "<f4"));
  write_json(s + "/X/.zattrs", json{{"unit", "counts"}});
  fs::create_directories(s + "/not_zarr");
  fs::create_directories(s + "/.hidden");
  write_json(s + "/.hidden/.zgroup", json{{"zarr_format", 2}});
  write_text(s + "/file.txt", "x");

  const auto root = open_zarr_group(s);
  EXPECT_EQ(root->file(), s);
  EXPECT_EQ(root->path(), "/");
  EXPECT_EQ(root->children(), (std::vector<std::string>{"X", "obs"}));
  EXPECT_TRUE(root->has_group("obs"));
  EXPECT_FALSE(root->has_array("obs"));
  EXPECT_TRUE(root->has_array("X"));
  EXPECT_FALSE(root->has_group("X"));
  EXPECT_FALSE(root->has_array("not_zarr"));
  EXPECT_TRUE(root->has_array("obs/cell"));

  const nlohmann::json attributes = root->attributes();
  EXPECT_EQ(attributes["encoding-type"], "anndata");
  EXPECT_TRUE(std::isnan(attributes["nan"].get<double>()));
  EXPECT_EQ(root->array_attributes("X")["unit"], "counts");

  EXPECT_EQ(root->group("obs/")->path(), "/obs");
  const auto obs = root->group("obs");
  EXPECT_EQ(obs->path(), "/obs");
  EXPECT_EQ(obs->children(), (std::vector<std::string>{"cell"}));
  EXPECT_EQ(obs->attributes()["_index"], "cell");
  EXPECT_EQ(obs->array_attributes("cell"), nlohmann::json::object());
  EXPECT_EQ(obs->read_strings("cell"), (std::vector<std::string>{"x", "y"}));
  expect_read_error([&] { obs->array("cell"); }, s, "/obs/cell", "string type");  // strings are not numeric
}

TEST(ZarrGroup, V3ChildrenAndAttributes) {
  TempDir store;
  const std::string s = store.path();
  write_json(s + "/zarr.json", json{{"zarr_format", 3}, {"node_type", "group"}, {"attributes", {{"k", 1}}}});
  write_json(s + "/layers/zarr.json", json{{"zarr_format", 3}, {"node_type", "group"}});
  json metadata = v3_metadata({3}, {3}, "int8", json::array({bytes_codec()}));
  metadata["attributes"] = {{"role", "data"}};
  write_json(s + "/layers/counts/zarr.json", metadata);
  write_file(s + "/layers/counts/c/0", Bytes{1, 2, 3});
  const auto root = open_zarr_group(s, "/");
  EXPECT_EQ(root->children(), (std::vector<std::string>{"layers"}));
  EXPECT_EQ(root->attributes(), (nlohmann::json{{"k", 1}}));
  const auto layers = root->group("layers");
  EXPECT_EQ(layers->attributes(), nlohmann::json::object());
  EXPECT_EQ(layers->array_attributes("counts"), (nlohmann::json{{"role", "data"}}));
  expect_same(read_all<int8_t>(*layers->array("counts")), std::vector<int8_t>{1, 2, 3});
  EXPECT_TRUE(is_zarr_group(s + "/layers"));
  EXPECT_FALSE(is_zarr_array(s + "/layers"));
  EXPECT_TRUE(is_zarr_array(s + "/layers/counts"));
}

TEST(ZarrGroup, MissingChildren) {
  TempDir store;
  const std::string s = store.path();
  write_json(s + "/.zgroup", json{{"zarr_format", 2}});
  write_json(s + "/g/.zgroup", json{{"zarr_format", 2}});
  const auto g = open_zarr_group(s, "g");
  expect_read_error([&] { g->array("nope"); }, s, "/g/nope", "no such array");
  expect_read_error([&] { g->group("nope"); }, s, "/g/nope", "no such group");
  expect_read_error([&] { g->read_strings("nope"); }, s, "/g/nope", "no such array");
  expect_read_error([&] { g->array_attributes("nope"); }, s, "/g/nope", "no such array");
  expect_read_error([&] { open_zarr_group(s, "/nope"); }, s, "/nope", "not a zarr group");
  EXPECT_THROW(g->has_array(".."), core::InvalidArgument);
  write_text(s + "/g/.zattrs", "[1, 2");
  expect_read_error([&] { g->attributes(); }, s, "/g", "JSON");
}

}  // namespace
}  // namespace torch_shards::io
