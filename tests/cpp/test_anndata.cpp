// The AnnData layout over files written by anndata itself (tests/data/anndata,
// see tests/data/make_anndata_fixtures.py): every obs encoding read by the io
// layer compared with what anndata read back (<file>.json), and the decoded
// indptr cache of CSR matrices against the stored indptr, from several threads,
// rows placed where a collection puts them (read_placed), and per-cell elements
// found by their paths (element) or refused naming the file and the element.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/errors.h"
#include "core/thread_pool.h"
#include "io/anndata.h"
#include "io/hdf5_group.h"
#include "io/zarr/array.h"
#include "io/zarr/group.h"

namespace torch_shards::io {
namespace {

using json = nlohmann::json;

const std::string kData = TORCH_SHARDS_TEST_DATA "/anndata";

json load_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  return json::parse(in);
}

std::shared_ptr<const Group> open_root(const std::string& path) {
  return path.size() > 5 && path.substr(path.size() - 5) == ".h5ad" ? open_hdf5_group(path, "/")
                                                                    : open_zarr_group(path, "/");
}

// Every row of a 1-D array, as int64 (integers and bools) or double (floats).
std::vector<double> read_numbers(const Array& array) {
  core::ThreadPool pool(0);
  const std::vector<uint8_t> bytes = array.read_range(0, array.num_rows(), pool);
  std::vector<double> out;
  for (int64_t i = 0; i < array.num_rows(); ++i) {
    switch (array.info().dtype) {
      case DType::kBool:
      case DType::kUInt8:
        out.push_back(bytes[i]);
        break;
      case DType::kInt8:
        out.push_back(reinterpret_cast<const int8_t*>(bytes.data())[i]);
        break;
      case DType::kUInt16:
        out.push_back(reinterpret_cast<const uint16_t*>(bytes.data())[i]);
        break;
      case DType::kInt32:
        out.push_back(reinterpret_cast<const int32_t*>(bytes.data())[i]);
        break;
      case DType::kInt64:
        out.push_back(static_cast<double>(reinterpret_cast<const int64_t*>(bytes.data())[i]));
        break;
      case DType::kFloat32:
        out.push_back(reinterpret_cast<const float*>(bytes.data())[i]);
        break;
      case DType::kFloat64:
        out.push_back(reinterpret_cast<const double*>(bytes.data())[i]);
        break;
      default:
        ADD_FAILURE() << array.where() << ": unexpected dtype " << dtype_name(array.info().dtype);
    }
  }
  return out;
}

double number(const json& value) { return value.is_boolean() ? value.get<bool>() : value.get<double>(); }

void expect_columns_match_anndata(const std::string& path) {
  SCOPED_TRACE(path);
  const json expected = load_json(path + ".json");
  const AnnDataStore store(open_root(path));
  ASSERT_EQ(store.n_obs(), expected["n_obs"].get<int64_t>());
  int checked = 0;
  for (const auto& [name, want] : expected["obs"].items()) {
    SCOPED_TRACE(name);
    const ObsColumn column = store.obs_column(name);
    const std::vector<double> got = read_numbers(*column.values);
    const std::string kind = want["kind"];
    if (kind == "categorical") {
      EXPECT_TRUE(column.categorical);
      EXPECT_EQ(column.categories, want["categories"]);
      EXPECT_EQ(column.ordered, want["ordered"].get<bool>());
      for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want["codes"][i].get<double>());
    } else if (kind == "string") {
      EXPECT_TRUE(column.categorical);
      for (size_t i = 0; i < got.size(); ++i) {
        const json& value = want["values"][i];
        if (value.is_null()) {
          EXPECT_EQ(got[i], -1);
        } else {
          EXPECT_EQ(column.categories.at(static_cast<size_t>(got[i])), value);
        }
      }
    } else if (kind == "nullable") {
      ASSERT_TRUE(column.mask);
      const std::vector<double> mask = read_numbers(*column.mask);
      for (size_t i = 0; i < got.size(); ++i) {
        const json& value = want["values"][i];
        EXPECT_EQ(mask[i], value.is_null() ? 1 : 0);
        EXPECT_EQ(got[i], value.is_null() ? 0 : number(value));
      }
    } else {
      EXPECT_FALSE(column.mask);
      for (size_t i = 0; i < got.size(); ++i) {
        if (column.values->info().dtype == DType::kInt64) continue;  // beyond a double's 53 bits
        EXPECT_EQ(got[i], number(want["values"][i]));
      }
    }
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

TEST(AnnData, ObsEncodingsOfTheNewestAnnDataMatchWhatItReads) {
  for (const char* name : {"obs.h5ad", "obs-zarr2.zarr", "obs-zarr3.zarr", "obs-zarr3-sharded.zarr"}) {
    expect_columns_match_anndata(kData + "/anndata-0.13.4/" + name);
  }
}

TEST(AnnData, ObsEncodingsOfAnnData07MatchWhatItReads) {
  for (const char* name : {"obs.h5ad", "obs-zarr2.zarr"})
    expect_columns_match_anndata(kData + "/anndata-0.7.8/" + name);
}

TEST(AnnData, NullableStringIndexIsRead) {
  const std::string path = kData + "/anndata-0.13.4/obs-zarr3-sharded.zarr";
  const json expected = load_json(path + ".json");
  const AnnDataStore store(open_root(path));
  EXPECT_EQ(load_json(path + ".json")["encodings"]["_index"], "nullable-string-array");
  std::vector<std::string> names;
  for (const auto& name : expected["obs_names"]) names.push_back(name);
  EXPECT_EQ(store.obs_names(), names);
}

// The CSR rows read through the cached indptr equal those the stored indptr
// describes, from two threads at once, twice (the second pass from the cache).
TEST(AnnData, CachedIndptrAgreesWithTheStoredOne) {
  const std::string store_path = kData + "/annbatch-0.3.1/collection.zarr";
  const AnnDataStore store(open_zarr_group(store_path, "/dataset_0"));
  const MatrixData matrix = store.matrix(std::nullopt);
  ASSERT_TRUE(matrix.csr);
  core::ThreadPool inline_pool(0);
  const auto stored = open_zarr_array(store_path, "/dataset_0/X/indptr");
  ASSERT_EQ(stored->info().dtype, DType::kInt32);  // annbatch: the smallest index type
  std::vector<int32_t> indptr(static_cast<size_t>(stored->num_rows()));
  stored->read({Segment{0, stored->num_rows(), 0}}, indptr.data(), inline_pool);
  const auto check = [&](uint32_t seed) {
    std::mt19937 random(seed);
    core::ThreadPool pool(0);
    for (int round = 0; round < 50; ++round) {
      std::vector<int64_t> rows(40);
      for (auto& row : rows) row = static_cast<int64_t>(random() % matrix.rows);
      const CsrPlan plan = matrix.csr->plan(rows, pool);
      for (size_t i = 0; i < rows.size(); ++i) {
        EXPECT_EQ(plan.row_offsets[i + 1] - plan.row_offsets[i], indptr[rows[i] + 1] - indptr[rows[i]]);
      }
    }
  };
  for (int pass = 0; pass < 2; ++pass) {
    std::thread other(check, 7 + pass);
    check(11 + pass);
    other.join();
  }
}

// read_placed (a collection's part writing into the collection's arrays)
// puts each row where its start says, column indices converted and checked as
// read() does, and touches nothing between the rows.
TEST(AnnData, PlacedRowsLandWhereTheirStartsSay) {
  const std::string store_path = kData + "/annbatch-0.3.1/collection.zarr";
  const AnnDataStore store(open_zarr_group(store_path, "/dataset_0"));
  const MatrixData matrix = store.matrix(std::nullopt);
  ASSERT_TRUE(matrix.csr);
  ASSERT_EQ(matrix.csr->index_dtype(), DType::kUInt8);  // annbatch: the smallest type (12 columns), widened below
  core::ThreadPool pool(2);
  std::mt19937 random(3);
  for (const bool shuffled : {true, false}) {
    std::vector<int64_t> rows;
    for (int64_t row = 0; row < matrix.rows; ++row) rows.push_back(row);
    for (int64_t row = 10; row < 30; ++row) rows.push_back(row);  // some twice
    if (shuffled) std::shuffle(rows.begin(), rows.end(), random);
    const CsrPlan plan = matrix.csr->plan(rows, pool);
    std::vector<int32_t> columns(static_cast<size_t>(plan.nnz()));
    std::vector<float> values(static_cast<size_t>(plan.nnz()));
    matrix.csr->read(plan, columns.data(), DType::kInt32, values.data(), pool);
    // Rows placed last to first, a gap of 3 elements before each.
    std::vector<int64_t> starts(rows.size());
    int64_t end = 0;
    for (size_t k = rows.size(); k-- > 0;) {
      starts[k] = end + 3;
      end = starts[k] + plan.row_offsets[k + 1] - plan.row_offsets[k];
    }
    std::vector<int32_t> placed_columns(static_cast<size_t>(end), -7);
    std::vector<float> placed_values(static_cast<size_t>(end), -7.0F);
    matrix.csr->read_placed(plan, starts, placed_columns.data(), DType::kInt32, placed_values.data(), pool);
    for (size_t k = 0; k < rows.size(); ++k) {
      const int64_t length = plan.row_offsets[k + 1] - plan.row_offsets[k];
      for (int64_t j = 0; j < length; ++j) {
        ASSERT_EQ(placed_columns[starts[k] + j], columns[plan.row_offsets[k] + j]) << "row " << rows[k];
        ASSERT_EQ(placed_values[starts[k] + j], values[plan.row_offsets[k] + j]) << "row " << rows[k];
      }
      for (int64_t gap = starts[k] - 3; gap < starts[k]; ++gap) {
        ASSERT_EQ(placed_columns[gap], -7);
        ASSERT_EQ(placed_values[gap], -7.0F);
      }
    }
  }
  const CsrPlan plan = matrix.csr->plan({0, 1}, pool);
  int32_t column = 0;
  float value = 0;
  EXPECT_THROW(matrix.csr->read_placed(plan, {0}, &column, DType::kInt32, &value, pool), std::logic_error);
}

// The message of the InvalidArgument `make` throws ("" if it throws none).
template <typename Make>
std::string invalid_argument(Make&& make) {
  try {
    make();
  } catch (const core::InvalidArgument& error) {
    return error.what();
  }
  return "";
}

// Every element path a field can read, in both stores of the newest anndata:
// the same arrays matrix() reads for X and the layers, the row shapes past n_obs.
TEST(AnnData, ElementsByPathAreTheMatricesOfTheirGroups) {
  for (const char* name : {"obs.h5ad", "obs-zarr3-sharded.zarr"}) {
    SCOPED_TRACE(name);
    const AnnDataStore store(open_root(kData + "/anndata-0.13.4/" + name));
    EXPECT_EQ(store.element_path("X"), "X");
    EXPECT_EQ(store.element_path("/layers/counts"), "layers/counts");
    EXPECT_EQ(store.element_path("obsm/X_pca"), "obsm/X_pca");
    EXPECT_EQ(store.element_path("/raw/X"), "raw/X");
    const MatrixData x = store.element("X"), counts = store.element("/layers/counts"),
                     dense = store.element("layers/dense");
    ASSERT_TRUE(x.csr && counts.csr && dense.dense);
    EXPECT_EQ(x.csr->where(), store.matrix(std::nullopt).csr->where());
    EXPECT_EQ(counts.csr->where(), store.matrix("counts").csr->where());
    EXPECT_EQ(dense.dense->where(), store.matrix("dense").dense->where());
    EXPECT_EQ(counts.rows, store.n_obs());
    EXPECT_EQ(counts.row_shape(), std::vector<int64_t>{store.n_vars()});
    EXPECT_EQ(dense.row_shape(), std::vector<int64_t>{store.n_vars()});
  }
}

TEST(AnnData, ElementsThatAreNoPerCellMatrixAreRefusedNamingThem) {
  const std::string file = kData + "/anndata-0.13.4/obs.h5ad";
  const AnnDataStore store(open_root(file));
  const auto refusal = [&](const std::string& path) { return invalid_argument([&] { store.element(path); }); };
  EXPECT_EQ(refusal("obsm/X_umap"), file + ":/obsm/X_umap: no such element (obsm: none)");
  EXPECT_EQ(refusal("layers/spliced"), file + ":/layers/spliced: no such element (layers: counts, dense)");
  for (const char* path : {"var", "varm/PCs", "uns/log1p", "raw/var", "obs/cell_type", "layers", "layers/a/b", ""}) {
    SCOPED_TRACE(path);
    const std::string message = refusal(path);
    EXPECT_EQ(message.rfind(file + ": fields cannot read element '" + path + "'", 0), 0u) << message;
    EXPECT_NE(message.find("they read X, layers/<name>, obsm/<name>, obsp/<name> or raw/X"), std::string::npos);
  }
  // annbatch stores raw as a null scalar, not a group.
  const std::string collection = kData + "/annbatch-0.3.1/collection.zarr";
  const AnnDataStore dataset(open_zarr_group(collection, "/dataset_0"));
  EXPECT_EQ(invalid_argument([&] { dataset.element("raw/X"); }),
            collection + ":/dataset_0/raw/X: no such element (the AnnData has no raw group)");
}

}  // namespace
}  // namespace torch_shards::io
