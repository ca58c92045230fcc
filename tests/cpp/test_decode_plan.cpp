// The GPU decode plan (csrc/io/decode_plan, issue 49) run by its CPU
// executor: bit for bit what the reader (open_zarr_array + read) gives, for
// every codec, shuffle and dtype zarr arrays are written with here and in
// tests/data, v2, v3 and v3 shards, partial last chunks, chunks never written
// and random rows; codec chains the device cannot decode become host chunks;
// and the nvCOMP loader's error on a machine without nvCOMP.
#include <blosc.h>
#include <gtest/gtest.h>
#include <lz4.h>
#include <stdlib.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/thread_pool.h"
#include "encoders.h"
#include "io/array.h"
#include "io/decode_plan/cpu_executor.h"
#include "io/decode_plan/decode_plan.h"
#include "io/decode_plan/nvcomp_library.h"
#include "io/decode_plan/stream_checks.h"
#include "io/zarr/array.h"
#include "temp_dir.h"

namespace torch_shards::io::decode_plan {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;
using Shape = std::vector<int64_t>;
using json = nlohmann::json;

using testing_support::blosc_compress;
using testing_support::gzip_compress;
using testing_support::TempDir;
using testing_support::write_file;
using testing_support::zlib_compress;
using testing_support::zstd_compress;

void write_json(const std::string& path, const json& value) {
  const std::string text = value.dump(2);
  write_file(path, Bytes(text.begin(), text.end()));
}

// ---------------------------------------------------------------------------
// Encoders: the real libraries.

struct Codec {
  std::string name;  // for messages
  json v2;           // .zarray "compressor" (null: none)
  json v3;           // bytes->bytes codecs after "bytes"
  std::function<Bytes(const Bytes&)> encode;
};

// Two zstd frames, each recording its size.
Bytes zstd_two_frames(const Bytes& in) {
  const size_t half = in.size() / 2;
  Bytes out = zstd_compress(Bytes(in.begin(), in.begin() + half));
  const Bytes second = zstd_compress(Bytes(in.begin() + half, in.end()));
  out.insert(out.end(), second.begin(), second.end());
  return out;
}

Bytes append_crc32c(Bytes data) {
  uint32_t crc = 0xffffffffu;
  for (uint8_t byte : data) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  crc = ~crc;
  for (int i = 0; i < 4; ++i) data.push_back(static_cast<uint8_t>(crc >> (8 * i)));
  return data;
}

const char* shuffle_name(int shuffle) {
  return shuffle == BLOSC_SHUFFLE ? "shuffle" : shuffle == BLOSC_BITSHUFFLE ? "bitshuffle" : "noshuffle";
}

// clevel 1 makes blocks of 64 KiB of larger chunks (c-blosc 1.21 ignores a blocksize asked for), 5 one block.
Codec blosc(const char* cname, int shuffle, size_t typesize, int clevel = 5) {
  json config{{"cname", cname}, {"clevel", clevel}, {"shuffle", shuffle}, {"blocksize", 0}};
  json v3_config{{"cname", cname},
                 {"clevel", clevel},
                 {"shuffle", shuffle_name(shuffle)},
                 {"typesize", typesize},
                 {"blocksize", 0}};
  json v2 = config;
  v2["id"] = "blosc";
  return Codec{std::string("blosc ") + cname + " " + shuffle_name(shuffle) + " clevel " + std::to_string(clevel), v2,
               json::array({json{{"name", "blosc"}, {"configuration", v3_config}}}),
               [=](const Bytes& in) { return blosc_compress(in, typesize, shuffle, cname, clevel); }};
}

// Every codec the device path plans, for elements of `typesize` bytes.
std::vector<Codec> device_codecs(size_t typesize) {
  std::vector<Codec> codecs{
      Codec{"none", nullptr, json::array(), [](const Bytes& in) { return in; }},
      Codec{"zstd", json{{"id", "zstd"}, {"level", 3}}, json::array({json{{"name", "zstd"}}}), zstd_compress},
      Codec{"zlib", json{{"id", "zlib"}, {"level", 6}}, json::array(), zlib_compress},
      Codec{"gzip", json{{"id", "gzip"}, {"level", 6}}, json::array({json{{"name", "gzip"}}}), gzip_compress},
  };
  codecs[2].v3 = nullptr;  // zlib is v2 only
  for (const char* cname : {"lz4", "lz4hc", "zstd", "zlib"}) {
    for (int shuffle : {BLOSC_NOSHUFFLE, BLOSC_SHUFFLE, BLOSC_BITSHUFFLE}) {
      codecs.push_back(blosc(cname, shuffle, typesize));
    }
  }
  return codecs;
}

// ---------------------------------------------------------------------------
// Arrays

int64_t product(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
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
  }
}

Shape grid_of(const Shape& shape, const Shape& chunks) {
  Shape grid(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) grid[d] = (shape[d] + chunks[d] - 1) / chunks[d];
  return grid;
}

// The full chunk at `coords` (C order), edge chunks padded with bytes the reader must not deliver.
Bytes chunk_of(const Bytes& array, const Shape& shape, const Shape& chunks, const Shape& coords, size_t item) {
  Bytes chunk(static_cast<size_t>(product(chunks)) * item, 0xAB);
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

std::string key(const Shape& coords, bool v3) {
  std::string key = v3 ? "c" : "";
  for (size_t d = 0; d < coords.size(); ++d) key += (v3 ? "/" : d ? "." : "") + std::to_string(coords[d]);
  return key;
}

Bytes random_bytes(size_t size, uint64_t seed, bool smooth) {
  std::mt19937_64 random(seed);
  Bytes bytes(size);
  // Smooth data (small values in wide elements) compresses, as real data does; random bytes do not.
  for (size_t i = 0; i < size; ++i)
    bytes[i] = static_cast<uint8_t>(smooth ? (i % 7 == 0 ? random() % 5 : 0) : random());
  return bytes;
}

enum class Layout { kV2, kV3, kSharded };

const char* layout_name(Layout layout) {
  return layout == Layout::kV2 ? "v2" : layout == Layout::kV3 ? "v3" : "v3 sharded";
}

struct Fixture {
  std::string dtype_v2, dtype_v3;
  size_t item = 4;
  Shape shape, chunks;                     // chunks: of the grid (inner chunks when sharded)
  Shape shard_chunks;                      // inner chunks per shard (sharded)
  std::function<bool(const Shape&)> skip;  // chunks never written
};

// Writes `values` as the array `name` of the store and returns nothing; the skipped chunks read as fill value 0.
void write_array(const std::string& store, const std::string& name, const Fixture& f, const Codec& codec, Layout layout,
                 const Bytes& values, bool crc32c = false) {
  const std::string dir = store + "/" + name;
  if (layout == Layout::kV2) {
    write_json(dir + "/.zarray", json{{"zarr_format", 2},
                                      {"shape", f.shape},
                                      {"chunks", f.chunks},
                                      {"dtype", f.dtype_v2},
                                      {"compressor", codec.v2},
                                      {"fill_value", 0},
                                      {"order", "C"},
                                      {"filters", nullptr}});
  }
  json codecs = json::array({json{{"name", "bytes"}, {"configuration", {{"endian", "little"}}}}});
  for (const json& c : codec.v3) codecs.push_back(c);
  if (crc32c) codecs.push_back(json{{"name", "crc32c"}});
  Shape grid_chunks = f.chunks;
  if (layout == Layout::kSharded) {
    for (size_t d = 0; d < f.shape.size(); ++d) grid_chunks[d] = f.chunks[d] * f.shard_chunks[d];
    codecs = json::array({json{
        {"name", "sharding_indexed"},
        {"configuration",
         {{"chunk_shape", f.chunks},
          {"codecs", codecs},
          {"index_codecs",
           json::array({json{{"name", "bytes"}, {"configuration", {{"endian", "little"}}}}, json{{"name", "crc32c"}}})},
          {"index_location", "end"}}}}});
  }
  if (layout != Layout::kV2) {
    write_json(dir + "/zarr.json",
               json{{"zarr_format", 3},
                    {"node_type", "array"},
                    {"shape", f.shape},
                    {"data_type", f.dtype_v3},
                    {"chunk_grid", {{"name", "regular"}, {"configuration", {{"chunk_shape", grid_chunks}}}}},
                    {"chunk_key_encoding", {{"name", "default"}, {"configuration", {{"separator", "/"}}}}},
                    {"fill_value", 0},
                    {"codecs", codecs},
                    {"attributes", json::object()}});
  }
  const auto encode = [&](const Shape& coords) {
    const Bytes encoded = codec.encode(chunk_of(values, f.shape, f.chunks, coords, f.item));
    return crc32c ? append_crc32c(encoded) : encoded;
  };
  if (layout != Layout::kSharded) {
    for_each_index(grid_of(f.shape, f.chunks), [&](const Shape& coords) {
      if (!f.skip || !f.skip(coords)) write_file(dir + "/" + key(coords, layout == Layout::kV3), encode(coords));
    });
    return;
  }
  // Shards: inner chunks in order, the index (offset, size per inner chunk; all ones for none) at the end.
  const int64_t per_shard = product(f.shard_chunks);
  for_each_index(grid_of(f.shape, grid_chunks), [&](const Shape& shard) {
    Bytes data;
    std::vector<uint64_t> entries(static_cast<size_t>(per_shard) * 2, ~uint64_t{0});
    int64_t i = 0;
    for_each_index(f.shard_chunks, [&](const Shape& local) {
      Shape global(f.shape.size());
      bool beyond = false;
      for (size_t d = 0; d < f.shape.size(); ++d) {
        global[d] = shard[d] * f.shard_chunks[d] + local[d];
        beyond = beyond || global[d] * f.chunks[d] >= f.shape[d];
      }
      if (!beyond && (!f.skip || !f.skip(global))) {
        const Bytes encoded = encode(global);
        entries[2 * i] = data.size();
        entries[2 * i + 1] = encoded.size();
        data.insert(data.end(), encoded.begin(), encoded.end());
      }
      ++i;
    });
    Bytes index(entries.size() * 8);
    for (size_t e = 0; e < entries.size(); ++e) {
      for (int b = 0; b < 8; ++b) index[e * 8 + b] = static_cast<uint8_t>(entries[e] >> (8 * b));
    }
    index = append_crc32c(index);
    data.insert(data.end(), index.begin(), index.end());
    write_file(dir + "/" + key(shard, true), data);
  });
}

// Random rows (with repeats), in a random order, into consecutive output rows.
std::vector<Segment> random_segments(int64_t rows, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::vector<int64_t> wanted(static_cast<size_t>(rows / 3 + 2));
  for (int64_t& row : wanted) row = static_cast<int64_t>(random() % static_cast<uint64_t>(rows));
  std::vector<int64_t> dests(wanted.size());
  std::iota(dests.begin(), dests.end(), 0);
  return segments_for_rows(wanted, dests);
}

// Plan + CPU executor against the reader, for every row, a block of rows and random rows.
DecodePlan expect_same_as_reader(const std::string& store, const std::string& path, const std::string& what) {
  core::ThreadPool pool(2);
  const std::shared_ptr<const Array> array = open_zarr_array(store, path);
  DecodePlanner planner = DecodePlanner::open(store, path);
  planner.trust_unverified(true);  // every codec the device decodes; the default's rule is tested below
  const int64_t rows = array->num_rows();
  DecodePlan last;
  const std::vector<std::vector<Segment>> reads{
      {Segment{0, rows, 0}},
      {Segment{rows / 3, std::max<int64_t>(1, rows / 4), 2}, Segment{rows - 1, 1, 0}},
      random_segments(rows, rows),
  };
  for (const std::vector<Segment>& segments : reads) {
    int64_t out_rows = 0;
    for (const Segment& s : segments) out_rows = std::max(out_rows, s.dest + s.length);
    Bytes expected(static_cast<size_t>(out_rows) * array->row_bytes(), 0x5A), actual = expected;
    array->read(segments, expected.data(), pool);
    DecodePlan plan = planner.plan(segments, pool);
    EXPECT_EQ(plan.output_bytes, expected.size()) << what;
    execute_on_cpu(plan, actual.data());
    EXPECT_TRUE(actual == expected) << what << ": " << segments.size() << " segments";
    if (actual != expected) break;
    last = std::move(plan);
  }
  return last;
}

struct DType {
  std::string v2, v3;
  size_t item;
};

const std::vector<DType> kDTypes{{"|u1", "uint8", 1},    {"<i2", "int16", 2}, {"<f4", "float32", 4},
                                 {"<f8", "float64", 8},  {"<i8", "int64", 8}, {"|b1", "bool", 1},
                                 {"<c8", "complex64", 8}};

// ---------------------------------------------------------------------------
// The matrix

TEST(DecodePlan, EveryCodecShuffleDTypeAndLayoutMatchesTheReader) {
  TempDir store;
  int arrays = 0;
  for (const DType& dtype : kDTypes) {
    for (Layout layout : {Layout::kV2, Layout::kV3, Layout::kSharded}) {
      // 2-D, columns split, partial last chunks both ways, one chunk never written.
      Fixture f{dtype.v2,
                dtype.v3,
                dtype.item,
                {203, 11},
                {40, 8},
                {2, 1},
                [](const Shape& c) {
                  return c[0] == 2 && c[1] == 1; }};
      const Bytes values = random_bytes(static_cast<size_t>(product(f.shape)) * f.item, arrays, arrays % 2 == 0);
      Bytes stored = values;
      if (dtype.v3 == "bool") {
        for (uint8_t& b : stored) b &= 1;
      }
      for (const Codec& codec : device_codecs(dtype.item)) {
        if (layout == Layout::kV2 ? codec.v2.is_null() && codec.name != "none" : codec.v3.is_null()) continue;
        const std::string name = "a" + std::to_string(arrays++);
        const std::string what = dtype.v3 + " " + layout_name(layout) + " " + codec.name;
        write_array(store.path(), name, f, codec, layout, stored, layout != Layout::kV2 && arrays % 3 == 0);
        const DecodePlan plan = expect_same_as_reader(store.path(), "/" + name, what);
        if (HasFailure()) return;
        EXPECT_TRUE(plan.all_on_device()) << what << ": " << plan.fallback_reason();
        EXPECT_GT(std::count_if(plan.chunks.begin(), plan.chunks.end(),
                                [](const PlannedChunk& c) { return c.kind == ChunkKind::kDevice; }),
                  4)
            << what;
        EXPECT_TRUE(std::any_of(plan.chunks.begin(), plan.chunks.end(), [](const PlannedChunk& c) {
          return c.kind == ChunkKind::kFill;
        })) << what;
      }
    }
  }
  EXPECT_GT(arrays, 300);
}

// 1-D arrays (a CSR matrix's data and indices), many chunks, shuffled blosc
// blocks of every shape: split streams, short last blocks, element counts
// that are not a multiple of 8 (bit shuffle leaves those bytes as they are).
TEST(DecodePlan, OneDimensionalArraysAsCsrDataAndIndices) {
  TempDir store;
  int arrays = 0;
  for (const DType& dtype : kDTypes) {
    for (int64_t chunk : {int64_t{100}, int64_t{333}, int64_t{20003}}) {
      for (Layout layout : {Layout::kV2, Layout::kSharded}) {
        Fixture f{dtype.v2, dtype.v3, dtype.item, {30001}, {chunk}, {3}, nullptr};
        Bytes values = random_bytes(static_cast<size_t>(30001) * f.item, arrays, true);
        if (dtype.v3 == "bool") {
          for (uint8_t& b : values) b &= 1;
        }
        for (const char* cname : {"lz4", "zstd"}) {
          for (int shuffle : {BLOSC_SHUFFLE, BLOSC_BITSHUFFLE}) {
            {
              const int clevel = chunk == 20003 ? 1 : 5;  // large chunks: blocks of 64 KiB, a short last one
              const Codec codec = blosc(cname, shuffle, dtype.item, clevel);
              const std::string name = "b" + std::to_string(arrays++);
              write_array(store.path(), name, f, codec, layout, values);
              const std::string what = dtype.v3 + " chunks of " + std::to_string(chunk) + " " + codec.name;
              const DecodePlan plan = expect_same_as_reader(store.path(), "/" + name, what);
              if (HasFailure()) return;
              EXPECT_TRUE(plan.all_on_device()) << what;
            }
          }
        }
      }
    }
  }
}

TEST(DecodePlan, PiecesAreTheStreamsOfBloscBlocks) {
  TempDir store;
  Fixture f{"<f4", "float32", 4, {25000}, {25000}, {1}, nullptr};
  const Bytes values = random_bytes(100000, 3, true);
  // Blocks of 64 KiB: one whole block (4 streams: byte planes of 16384 elements) and a short one (one stream).
  write_array(store.path(), "split", f, blosc("lz4", BLOSC_SHUFFLE, 4, 1), Layout::kV2, values);
  const DecodePlan plan = expect_same_as_reader(store.path(), "/split", "split");
  ASSERT_EQ(plan.chunks.size(), 1u);
  ASSERT_EQ(plan.pieces.size(), 5u);
  EXPECT_EQ(plan.unshuffles.size(), 2u);
  for (const Piece& piece : plan.pieces) {
    EXPECT_TRUE(piece.to_scratch);
    EXPECT_TRUE(piece.codec == PieceCodec::kLz4 || piece.codec == PieceCodec::kCopy);
  }
  EXPECT_EQ(plan.pieces[0].output_size, 16384u);
  EXPECT_EQ(plan.pieces[3].output_offset, 3u * 16384);
  EXPECT_EQ(plan.pieces[4].output_size, 100000u - 65536);
  for (const Unshuffle& step : plan.unshuffles) {
    EXPECT_EQ(step.kind, Shuffle::kByte);
    EXPECT_EQ(step.typesize, 4u);
  }
  EXPECT_EQ(plan.unshuffles[1].staging_offset, 65536u);
  EXPECT_EQ(plan.scratch_bytes, 100000u);
  EXPECT_EQ(plan.staging_bytes, 100000u);

  write_array(store.path(), "gzip", f, Codec{"gzip", json{{"id", "gzip"}}, json::array(), gzip_compress}, Layout::kV2,
              values);
  const DecodePlan gzip = expect_same_as_reader(store.path(), "/gzip", "gzip");
  ASSERT_EQ(gzip.pieces.size(), 1u);
  EXPECT_EQ(gzip.pieces[0].codec, PieceCodec::kDeflate);
  EXPECT_EQ(gzip.pieces[0].check, PieceCheck::kCrc32);

  write_array(store.path(), "zstd2", f, Codec{"zstd", json{{"id", "zstd"}}, json::array(), zstd_two_frames},
              Layout::kV2, values);
  const DecodePlan zstd = expect_same_as_reader(store.path(), "/zstd2", "two zstd frames");
  ASSERT_EQ(zstd.pieces.size(), 2u);
  EXPECT_EQ(zstd.pieces[0].output_size + zstd.pieces[1].output_size, 100000u);
}

TEST(DecodePlan, BigEndianAndRowsOfManyColumnChunks) {
  TempDir store;
  for (const char* dtype : {">f4", ">i8", ">c8"}) {
    const size_t item = dtype[2] == '4' ? 4 : 8;
    Fixture f{dtype, "", item, {57, 5, 9}, {10, 2, 4}, {}, nullptr};
    const std::string name = std::string("be") + dtype[1];
    write_array(store.path(), name, f, blosc("zstd", BLOSC_SHUFFLE, item), Layout::kV2,
                random_bytes(57 * 45 * item, 11, false));
    const DecodePlan plan = expect_same_as_reader(store.path(), "/" + name, dtype);
    EXPECT_EQ(plan.byteswap_unit, std::string(dtype) == ">i8" ? 8u : 4u);
  }
}

// ---------------------------------------------------------------------------
// What the device does not decode: host chunks (the reader's own decoder), never wrong bytes.

TEST(DecodePlan, ChainsTheDeviceCannotDecodeFallBackToTheHost) {
  TempDir store;
  Fixture f{"<i4", "int32", 4, {900, 6}, {250, 4}, {2, 1}, nullptr};
  const Bytes values = random_bytes(900 * 6 * 4, 5, true);

  write_array(store.path(), "blosclz", f, blosc("blosclz", BLOSC_SHUFFLE, 4), Layout::kV2, values);
  DecodePlan plan = expect_same_as_reader(store.path(), "/blosclz", "blosclz");
  EXPECT_FALSE(plan.all_on_device());
  EXPECT_NE(plan.fallback_reason().find("blosclz"), std::string::npos) << plan.fallback_reason();

  // Fortran order: a transpose.
  write_array(store.path(), "fortran", f, blosc("lz4", BLOSC_SHUFFLE, 4), Layout::kV2, values);
  json zarray = json::parse(std::ifstream(store.path() + "/fortran/.zarray"));
  zarray["order"] = "F";
  write_json(store.path() + "/fortran/.zarray", zarray);
  // (The chunks hold C order; re-encode them as F order: transposed chunk bytes.)
  for_each_index(grid_of(f.shape, f.chunks), [&](const Shape& coords) {
    const Bytes chunk = chunk_of(values, f.shape, f.chunks, coords, 4);
    Bytes transposed(chunk.size());
    for (int64_t r = 0; r < 250; ++r) {
      for (int64_t c = 0; c < 4; ++c) std::memcpy(&transposed[(c * 250 + r) * 4], &chunk[(r * 4 + c) * 4], 4);
    }
    write_file(store.path() + "/fortran/" + key(coords, false), blosc_compress(transposed, 4, BLOSC_SHUFFLE, "lz4"));
  });
  plan = expect_same_as_reader(store.path(), "/fortran", "fortran order");
  EXPECT_FALSE(plan.all_on_device());
  EXPECT_NE(plan.fallback_reason().find("transpose"), std::string::npos) << plan.fallback_reason();
  EXPECT_TRUE(plan.pieces.empty());

  // Two compressors (blosc, then gzip).
  Codec two{
      "blosc+gzip", nullptr,
      json::array({json{{"name", "blosc"},
                        {"configuration",
                         {{"cname", "lz4"}, {"clevel", 5}, {"shuffle", "shuffle"}, {"typesize", 4}, {"blocksize", 0}}}},
                   json{{"name", "gzip"}}}),
      [](const Bytes& in) { return gzip_compress(blosc_compress(in, 4, BLOSC_SHUFFLE, "lz4")); }};
  write_array(store.path(), "two", f, two, Layout::kSharded, values);
  plan = expect_same_as_reader(store.path(), "/two", "two compressors");
  EXPECT_FALSE(plan.all_on_device());
  EXPECT_NE(plan.fallback_reason().find("two compressors"), std::string::npos) << plan.fallback_reason();

  // A zstd stream of two frames, one without its size: the host splits it as it goes.
  Codec unsized{"zstd unsized", json{{"id", "zstd"}}, json::array(), [](const Bytes& in) {
                  ZSTD_CCtx* context = ZSTD_createCCtx();
                  ZSTD_CCtx_setParameter(context, ZSTD_c_contentSizeFlag, 0);
                  Bytes out(ZSTD_compressBound(in.size()) * 2 + 64);
                  const size_t half = in.size() / 2;
                  size_t a = ZSTD_compress2(context, out.data(), out.size(), in.data(), half);
                  size_t b =
                      ZSTD_compress2(context, out.data() + a, out.size() - a, in.data() + half, in.size() - half);
                  ZSTD_freeCCtx(context);
                  out.resize(a + b);
                  return out;
                }};
  write_array(store.path(), "unsized", f, unsized, Layout::kV2, values);
  plan = expect_same_as_reader(store.path(), "/unsized", "unsized zstd frames");
  EXPECT_FALSE(plan.all_on_device());
}

TEST(DecodePlan, CorruptChunksAreErrorsNamingTheChunk) {
  TempDir store;
  Fixture f{"<f4", "float32", 4, {100}, {50}, {1}, nullptr};
  write_array(store.path(), "bad", f, blosc("lz4", BLOSC_SHUFFLE, 4), Layout::kV3, random_bytes(400, 1, true),
              /*crc32c=*/true);
  // Flip a byte of the second chunk's compressed data: its crc32c no longer matches.
  const std::string chunk = store.path() + "/bad/c/1";
  std::fstream file(chunk, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(20);
  file.put('\x7f');
  file.close();
  core::ThreadPool pool(1);
  const DecodePlanner planner = DecodePlanner::open(store.path(), "/bad");
  EXPECT_NO_THROW(planner.plan({Segment{0, 50, 0}}, pool));
  try {
    planner.plan({Segment{0, 100, 0}}, pool);
    FAIL() << "no error";
  } catch (const core::ReadError& error) {
    EXPECT_NE(std::string(error.what()).find("crc32c"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("/bad"), std::string::npos) << error.what();
  }
}

// A chunk whose lz4 stream fails the host's check is decoded by the host (which then names it), never
// handed to the device.
TEST(DecodePlan, MalformedStreamsAreLeftToTheHost) {
  TempDir store;
  Fixture f{"<f4", "float32", 4, {100}, {50}, {1}, nullptr};
  write_array(store.path(), "bad", f, blosc("lz4", BLOSC_NOSHUFFLE, 4), Layout::kV3, random_bytes(400, 1, true));
  const std::string chunk = store.path() + "/bad/c/1";
  std::fstream file(chunk, std::ios::in | std::ios::out | std::ios::binary);
  // The first lz4 token, after blosc's 16-byte header, the block's start (4 bytes) and its stream's size (4):
  // a literal run longer than the stream.
  file.seekp(24);
  file.put('\xf0');
  file.put('\xff');
  file.put('\xff');
  file.close();
  core::ThreadPool pool(1);
  const DecodePlan plan = DecodePlanner::open(store.path(), "/bad").plan({Segment{0, 100, 0}}, pool);
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].kind, ChunkKind::kDevice);
  EXPECT_EQ(plan.chunks[1].kind, ChunkKind::kHost);
  EXPECT_NE(plan.chunks[1].host_reason.find("a malformed lz4 stream"), std::string::npos) << plan.chunks[1].host_reason;
  for (const Piece& piece : plan.pieces) EXPECT_EQ(piece.chunk, 0u);
  Bytes out(plan.output_bytes);
  EXPECT_THROW(execute_on_cpu(plan, out.data()), core::ReadError);
}

// By default zstd and deflate streams reach the device only under a crc32c checked on the host.
TEST(DecodePlan, UncheckedZstdAndDeflateAreTheHostsUnlessTrusted) {
  TempDir store;
  Fixture f{"<f4", "float32", 4, {100}, {50}, {1}, nullptr};
  const Bytes values = random_bytes(400, 3, true);
  const Codec zstd{"zstd", json{{"id", "zstd"}, {"level", 3}}, json::array({json{{"name", "zstd"}}}), zstd_compress};
  write_array(store.path(), "plain", f, zstd, Layout::kV3, values);
  write_array(store.path(), "checked", f, zstd, Layout::kV3, values, /*crc32c=*/true);
  write_array(store.path(), "lz4", f, blosc("lz4", BLOSC_SHUFFLE, 4), Layout::kV3, values);
  core::ThreadPool pool(2);
  const auto plan_of = [&](const std::string& name, bool trust) {
    DecodePlanner planner = DecodePlanner::open(store.path(), "/" + name);
    planner.trust_unverified(trust);
    return planner.plan({Segment{0, 100, 0}}, pool);
  };
  const DecodePlan plain = plan_of("plain", false);
  EXPECT_FALSE(plain.all_on_device());
  EXPECT_NE(plain.fallback_reason().find("zstd streams without a checksum"), std::string::npos)
      << plain.fallback_reason();
  EXPECT_TRUE(plan_of("plain", true).all_on_device());
  EXPECT_TRUE(plan_of("checked", false).all_on_device());
  EXPECT_TRUE(plan_of("lz4", false).all_on_device());
}

TEST(StreamChecks, Lz4BlocksThatDecodeWithinBoundsPassAndOthersSayWhy) {
  const Bytes data = random_bytes(100000, 7, true);
  Bytes block(static_cast<size_t>(LZ4_compressBound(static_cast<int>(data.size()))));
  block.resize(static_cast<size_t>(
      LZ4_compress_default(reinterpret_cast<const char*>(data.data()), reinterpret_cast<char*>(block.data()),
                           static_cast<int>(data.size()), static_cast<int>(block.size()))));
  ASSERT_GT(block.size(), 0u);
  EXPECT_EQ(check_lz4_block(block.data(), block.size(), data.size()), "");
  EXPECT_NE(check_lz4_block(block.data(), block.size(), data.size() + 1).find("decodes to"), std::string::npos);
  EXPECT_NE(check_lz4_block(block.data(), block.size(), data.size() - 1), "");
  EXPECT_NE(check_lz4_block(block.data(), block.size() - 1, data.size()), "");
  Bytes bad = block;
  bad[0] = 0xf0;  // a literal run of 15 + 255 + 255 + ... bytes
  for (size_t i = 1; i < 40 && i < bad.size(); ++i) bad[i] = 0xff;
  EXPECT_NE(check_lz4_block(bad.data(), bad.size(), data.size()), "");
  const uint8_t far_match[] = {0x10, 'a', 0x09, 0x00, 0x50, 'a', 'b', 'c', 'd', 'e'};  // offset 9 after 1 byte
  EXPECT_NE(check_lz4_block(far_match, sizeof far_match, 10).find("reaches before the start"), std::string::npos);
  EXPECT_EQ(check_lz4_block(nullptr, 0, 0).empty(), false);  // even an empty block has its last token
}

TEST(StreamChecks, Lz4BlocksThatPassDecodeToTheirSizeWhateverTheDamage) {
  // Blocks of mostly zeros, damaged by a few overwritten bytes, cut short, or given the wrong size: every
  // block the check passes decodes (LZ4's own safe decoder) to exactly its size, and one that does not
  // decode so is refused with a reason.
  std::mt19937 rng(11);
  int passed = 0, refused = 0;
  for (int b = 0; b < 60; ++b) {
    const size_t n = 1 + rng() % 5000;
    Bytes data(n);
    for (uint8_t& x : data) x = rng() % 100 < 70 ? 0 : static_cast<uint8_t>(rng());
    Bytes compressed(static_cast<size_t>(LZ4_compressBound(static_cast<int>(n))));
    compressed.resize(static_cast<size_t>(
        LZ4_compress_default(reinterpret_cast<const char*>(data.data()), reinterpret_cast<char*>(compressed.data()),
                             static_cast<int>(n), static_cast<int>(compressed.size()))));
    for (int m = 0; m < 100; ++m) {
      Bytes block = compressed;
      for (int e = 0, edits = m == 0 ? 0 : 1 + static_cast<int>(rng() % 3); e < edits; ++e) {
        block[rng() % block.size()] = static_cast<uint8_t>(rng());
      }
      if (m % 7 == 3 && block.size() > 1) block.resize(block.size() - 1 - rng() % (block.size() - 1));
      const size_t size = m % 11 == 5 ? n + rng() % 5 - 2 : n;
      Bytes out(size + 64);
      const int decoded =
          LZ4_decompress_safe(reinterpret_cast<const char*>(block.data()), reinterpret_cast<char*>(out.data()),
                              static_cast<int>(block.size()), static_cast<int>(size));
      const std::string problem = check_lz4_block(block.data(), block.size(), size);
      if (problem.empty()) {
        ++passed;
        EXPECT_EQ(decoded, static_cast<int>(size)) << "block " << b << " damage " << m;
      } else {
        ++refused;
      }
      if (decoded != static_cast<int>(size)) {
        EXPECT_NE(problem, "") << "block " << b << " damage " << m;
      }
    }
  }
  EXPECT_GT(passed, 60);
  EXPECT_GT(refused, 600);
}

TEST(StreamChecks, ZstdFramesWhoseBlocksFitPassAndOthersSayWhy) {
  const Bytes data = random_bytes(300000, 9, true);  // three blocks and more
  const Bytes frame = zstd_compress(data);
  EXPECT_EQ(check_zstd_frame(frame.data(), frame.size(), data.size()), "");
  EXPECT_NE(check_zstd_frame(frame.data(), frame.size(), data.size() - 1).find("records"), std::string::npos);
  EXPECT_NE(check_zstd_frame(frame.data(), frame.size() - 1, data.size()), "");
  Bytes longer = frame;
  longer.push_back(0);
  EXPECT_NE(check_zstd_frame(longer.data(), longer.size(), data.size()).find("takes"), std::string::npos);
  Bytes reserved = frame;
  reserved[4] |= 0x08;
  EXPECT_NE(check_zstd_frame(reserved.data(), reserved.size(), data.size()).find("reserved bit"), std::string::npos);
  Bytes overwritten = frame;  // what the GPU test overwrote: block headers among the rest
  std::fill(overwritten.begin() + static_cast<std::ptrdiff_t>(frame.size() / 3), overwritten.end() - 8, 0xff);
  EXPECT_NE(check_zstd_frame(overwritten.data(), overwritten.size(), data.size()), "");
  EXPECT_NE(check_zstd_frame(data.data(), 100, data.size()).find("not a zstd frame"), std::string::npos);
}

// ---------------------------------------------------------------------------
// The committed fixtures: every zarr array of every AnnData and annbatch version there.

TEST(DecodePlan, CommittedFixturesMatchTheReader) {
  int arrays = 0;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(TORCH_SHARDS_TEST_DATA "/anndata")) {
    const std::string name = entry.path().filename().string();
    if (name != ".zarray" && name != "zarr.json") continue;
    const fs::path dir = entry.path().parent_path();
    fs::path store = dir;
    while (store.has_parent_path() && store.extension() != ".zarr") store = store.parent_path();
    if (store.extension() != ".zarr") continue;
    const std::string path = "/" + fs::relative(dir, store).string();
    std::shared_ptr<const Array> array;
    try {
      if (path == "/." || !is_zarr_array(dir.string()) || is_zarr_string_array(store.string(), path)) continue;
      array = open_zarr_array(store.string(), path);
    } catch (const std::exception&) {
      continue;  // groups, 0-d arrays
    }
    if (array->num_rows() == 0) continue;
    expect_same_as_reader(store.string(), path, store.string() + ":" + path);
    if (HasFailure()) return;
    ++arrays;
  }
  EXPECT_GT(arrays, 20);
}

// ---------------------------------------------------------------------------

TEST(BitUnshuffle, InvertsBitshuffle) {
  for (size_t typesize : {1, 2, 4, 8}) {
    for (size_t elements : {8, 64, 100, 256}) {
      const Bytes values = random_bytes(typesize * elements, typesize * 1000 + elements, false);
      // c-blosc's bitshuffle of one block (a single one: blocksize = all of it), stored when it does not compress.
      const Bytes frame = blosc_compress(values, typesize, BLOSC_BITSHUFFLE, "lz4");
      Bytes decoded(values.size());
      ASSERT_EQ(blosc_decompress_ctx(frame.data(), decoded.data(), decoded.size(), 1), static_cast<int>(values.size()));
      ASSERT_EQ(decoded, values);
      // The shuffled bytes themselves: bit j*8+k of the planes, element by element.
      const size_t n = elements - elements % 8;
      Bytes shuffled(values.size(), 0);
      for (size_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < typesize; ++j) {
          for (size_t k = 0; k < 8; ++k) {
            const int bit = (values[i * typesize + j] >> k) & 1;
            shuffled[(8 * j + k) * (n / 8) + i / 8] |= static_cast<uint8_t>(bit << (i % 8));
          }
        }
      }
      std::memcpy(shuffled.data() + n * typesize, values.data() + n * typesize, values.size() - n * typesize);
      Bytes out(values.size());
      bit_unshuffle(shuffled.data(), shuffled.size(), typesize, out.data());
      EXPECT_EQ(out, values) << typesize << " x " << elements;
    }
  }
}

TEST(NvcompLibrary, MissingLibraryNamesTheWheel) {
  TempDir site;
  // A wheel's folder holding a file that is not a library: tried, and named in the error.
  write_file(site.path() + "/nvidia/libnvcomp/lib64/libnvcomp.so.6", Bytes{1, 2, 3});
  const char* before = std::getenv("TORCH_SHARDS_NVCOMP_LIBRARY");
  const std::string saved = before ? before : "";
  ::unsetenv("TORCH_SHARDS_NVCOMP_LIBRARY");
  const std::vector<std::string> candidates = nvcomp_candidates({site.path(), site.path() + "/nowhere"});
  ASSERT_GE(candidates.size(), 4u);
  EXPECT_EQ(candidates[0], site.path() + "/nvidia/libnvcomp/lib64/libnvcomp.so.6");
  EXPECT_EQ(candidates.back(), "libnvcomp.so");
  try {
    load_nvcomp({site.path()});
    GTEST_SKIP() << "nvCOMP is installed here";
  } catch (const NvcompNotFound& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("pip install nvidia-libnvcomp-cu13"), std::string::npos) << message;
    EXPECT_NE(message.find("nvidia-libnvcomp-cu12"), std::string::npos) << message;
    EXPECT_NE(message.find("torch_shards[gpu]"), std::string::npos) << message;
    EXPECT_NE(message.find(site.path() + "/nvidia/libnvcomp/lib64/libnvcomp.so.6"), std::string::npos) << message;
  }
  ::setenv("TORCH_SHARDS_NVCOMP_LIBRARY", "/no/such/libnvcomp.so.6", 1);
  EXPECT_EQ(nvcomp_candidates({})[0], "/no/such/libnvcomp.so.6");
  EXPECT_THROW(load_nvcomp({}), NvcompNotFound);
  if (before) ::setenv("TORCH_SHARDS_NVCOMP_LIBRARY", saved.c_str(), 1);
}

// With TORCH_SHARDS_TEST_NVCOMP_SITE set to a site-packages folder holding nvidia-libnvcomp-cu13 (or -cu12),
// the wheel's library loads (no GPU needed) and has every decompressor.
TEST(NvcompLibrary, LoadsTheWheelWhereGiven) {
  const char* site = std::getenv("TORCH_SHARDS_TEST_NVCOMP_SITE");
  if (!site || !*site) GTEST_SKIP() << "TORCH_SHARDS_TEST_NVCOMP_SITE is not set";
  const NvcompLibrary library = load_nvcomp({site});
  EXPECT_NE(library.location.find(site), std::string::npos) << library.location;
  EXPECT_GE(library.major, 4);
  std::printf("nvCOMP %u (major %d) from %s\n", library.version, library.major, library.location.c_str());
  for (const NvcompDecompressor* decompressor : {&library.lz4, &library.zstd, &library.deflate}) {
    EXPECT_NE(decompressor->decompress_async, nullptr);
    EXPECT_NE(decompressor->temp_size, nullptr);
  }
  ASSERT_NE(library.status_string, nullptr);
  EXPECT_NE(library.status_string(0), nullptr);
}

}  // namespace
}  // namespace torch_shards::io::decode_plan
