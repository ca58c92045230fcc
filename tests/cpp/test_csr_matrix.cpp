// CsrMatrix reads of a shuffled fetch's rows (each row a segment of its own,
// read gathered through source order), over arrays stored as raw files,
// contiguous or in chunks, read by copy or in place from a mapping: on the
// calling thread alone and with helpers that split the read into parts, the
// rows equal those computed from the arrays, placed rows, rows across chunks
// and indices widened as they are placed included; a column index out of
// range in any part, checked as stored or as widened, is a ReadError naming
// the array, and so is a mapped file that shrinks under a read in place.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "core/thread_pool.h"
#include "io/csr_matrix.h"
#include "io/file.h"
#include "raw_arrays.h"
#include "temp_dir.h"

namespace torch_shards::io {
namespace {

using testing_support::RawLayout;
using testing_support::TempDir;

constexpr int64_t kRows = 24000;
constexpr int64_t kCols = 3000;

struct Matrix {
  std::vector<int64_t> indptr{0};
  std::vector<int32_t> indices;
  std::vector<float> values;
};

// Rows of 0-120 values (some empty), ~1.4M in all: a read of every row is several parts of 256 KB groups.
Matrix make_matrix(uint32_t seed) {
  std::mt19937 random(seed);
  Matrix m;
  for (int64_t row = 0; row < kRows; ++row) {
    const int64_t count = row % 97 == 0 ? 0 : static_cast<int64_t>(random() % 121);
    for (int64_t k = 0; k < count; ++k) {
      m.indices.push_back(static_cast<int32_t>(random() % kCols));
      m.values.push_back(static_cast<float>(row) + static_cast<float>(k) / 1024.0F);
    }
    m.indptr.push_back(static_cast<int64_t>(m.indices.size()));
  }
  return m;
}

// How the matrix's arrays are stored and read: contiguous or in chunks of 1,000 elements (rows of up to
// 120 cross them), by copy or from a mapping (then in place).
struct Storage {
  RawLayout layout;
  File::Access access;
  std::string name() const {
    return std::string(layout == RawLayout::kContiguous ? "contiguous" : "chunked") +
           (access == File::Access::kRead ? ", read by copy" : ", mapped");
  }
};
const std::vector<Storage> kStorages{{RawLayout::kContiguous, File::Access::kRead},
                                     {RawLayout::kContiguous, File::Access::kMapped},
                                     {RawLayout::kChunksLastFirst, File::Access::kRead},
                                     {RawLayout::kChunksLastFirst, File::Access::kMapped}};

CsrMatrix csr_of(const TempDir& dir, const Matrix& m, Storage storage = kStorages[0]) {
  const auto array = [&](const std::string& name, const auto& values, DType dtype) {
    return testing_support::raw_array(dir, name, values, dtype, storage.layout, storage.access);
  };
  return CsrMatrix(array("indptr", m.indptr, DType::kInt64), array("indices", m.indices, DType::kInt32),
                   array("data", m.values, DType::kFloat32), kRows, kCols);
}

// A fetch's rows: blocks of 16 consecutive rows (every block, or about three in four), then the rows
// shuffled among themselves, and a few rows twice.
std::vector<int64_t> shuffled_fetch(uint32_t seed, bool every_block = true) {
  std::mt19937 random(seed);
  std::vector<int64_t> blocks;
  for (int64_t block = 0; block < kRows / 16; ++block) {
    if (every_block || random() % 4 != 0) blocks.push_back(block);
  }
  std::shuffle(blocks.begin(), blocks.end(), random);
  std::vector<int64_t> rows;
  for (const int64_t block : blocks) {
    for (int64_t row = block * 16; row < block * 16 + 16; ++row) rows.push_back(row);
  }
  for (int64_t row = 500; row < 540; ++row) rows.push_back(row);
  std::shuffle(rows.begin(), rows.end(), random);
  return rows;
}

void expect_rows(const Matrix& m, const std::vector<int64_t>& rows, const std::vector<int64_t>& starts,
                 const std::vector<int32_t>& columns, const std::vector<float>& values) {
  for (size_t k = 0; k < rows.size(); ++k) {
    const int64_t first = m.indptr[rows[k]], length = m.indptr[rows[k] + 1] - first;
    for (int64_t j = 0; j < length; ++j) {
      ASSERT_EQ(columns[starts[k] + j], m.indices[first + j]) << "row " << rows[k] << " (position " << k << ")";
      ASSERT_EQ(values[starts[k] + j], m.values[first + j]) << "row " << rows[k] << " (position " << k << ")";
    }
  }
}

// Shuffled fetches read, placed and widened, on 0-3 helpers, equal the stored rows.
void expect_shuffled_reads(const Matrix& m, const CsrMatrix& csr) {
  for (const auto& [helpers, every_block] : {std::pair{0, true}, {1, true}, {3, true}, {0, false}, {3, false}}) {
    SCOPED_TRACE("helpers " + std::to_string(helpers) + (every_block ? ", every block" : ", some blocks"));
    core::ThreadPool pool(helpers);
    const std::vector<int64_t> rows = shuffled_fetch(11 + helpers, every_block);
    const CsrPlan plan = csr.plan(rows, pool);
    ASSERT_EQ(plan.nnz(), [&] {
      int64_t nnz = 0;
      for (const int64_t row : rows) nnz += m.indptr[row + 1] - m.indptr[row];
      return nnz;
    }());
    std::vector<int32_t> columns(static_cast<size_t>(plan.nnz()), -1);
    std::vector<float> values(static_cast<size_t>(plan.nnz()), -1.0F);
    csr.read(plan, columns.data(), DType::kInt32, values.data(), pool);
    expect_rows(m, rows, plan.row_offsets, columns, values);
    // Widened as they are placed (stored as int32).
    std::vector<int64_t> wide(static_cast<size_t>(plan.nnz()), -1);
    csr.read(plan, wide.data(), DType::kInt64, values.data(), pool);
    ASSERT_TRUE(std::equal(wide.begin(), wide.end(), columns.begin()));

    // Placed: rows last to first, 5 elements apart, nothing written between them.
    std::vector<int64_t> starts(rows.size());
    int64_t end = 0;
    for (size_t k = rows.size(); k-- > 0;) {
      starts[k] = end + 5;
      end = starts[k] + plan.row_offsets[k + 1] - plan.row_offsets[k];
    }
    std::vector<int32_t> placed_columns(static_cast<size_t>(end), -7);
    std::vector<float> placed_values(static_cast<size_t>(end), -7.0F);
    csr.read_placed(plan, starts, placed_columns.data(), DType::kInt32, placed_values.data(), pool);
    expect_rows(m, rows, starts, placed_columns, placed_values);
    for (size_t k = 0; k < rows.size(); ++k) {
      for (int64_t gap = starts[k] - 5; gap < starts[k]; ++gap) {
        ASSERT_EQ(placed_columns[gap], -7);
        ASSERT_EQ(placed_values[gap], -7.0F);
      }
    }
  }
}

TEST(CsrMatrix, ShuffledRowsReadWithHelpersEqualTheStoredRows) {
  const Matrix m = make_matrix(5);
  for (const Storage& storage : kStorages) {
    SCOPED_TRACE(storage.name());
    TempDir dir("csr_matrix");
    const CsrMatrix csr = csr_of(dir, m, storage);
    expect_shuffled_reads(m, csr);
  }
}

TEST(CsrMatrix, RowsPlannedWithThePlannersSortedPositionsReadAsWhenSortedHere) {
  // A shuffled fetch's positions in row order come from the planner (its
  // shuffle), repeated rows in any order among themselves: the plan and the
  // rows read are those of a plan that sorts them itself.
  TempDir dir("csr_matrix");
  const Matrix m = make_matrix(6);
  const CsrMatrix csr = csr_of(dir, m);
  core::ThreadPool pool(2);
  for (const bool every_block : {true, false}) {
    SCOPED_TRACE(every_block ? "every block" : "some blocks");
    std::vector<int64_t> rows = shuffled_fetch(23, every_block);
    rows.insert(rows.begin() + 3, rows[10]);  // a row delivered twice, and a run of two rows
    rows.insert(rows.begin() + 7, {200, 201});
    std::mt19937 random(5);
    std::vector<std::pair<int64_t, uint32_t>> keyed;  // (row, random tie-break)
    for (const int64_t row : rows) keyed.emplace_back(row, random());
    std::vector<int64_t> positions(rows.size());
    std::iota(positions.begin(), positions.end(), 0);
    std::sort(positions.begin(), positions.end(), [&](int64_t a, int64_t b) { return keyed[a] < keyed[b]; });
    const CsrPlan own = csr.plan(rows, pool);
    const CsrPlan given = csr.plan(rows, pool, &positions);
    ASSERT_EQ(given.row_offsets, own.row_offsets);
    std::vector<int32_t> columns(static_cast<size_t>(given.nnz()), -1);
    std::vector<float> values(static_cast<size_t>(given.nnz()), -1.0F);
    csr.read(given, columns.data(), DType::kInt32, values.data(), pool);
    expect_rows(m, rows, given.row_offsets, columns, values);
  }
  const std::vector<int64_t> rows{5, 3, 9}, short_positions{1, 0}, unordered{0, 1, 2};
  EXPECT_THROW(csr.plan(rows, pool, &short_positions), std::logic_error);
  EXPECT_THROW(csr.plan(rows, pool, &unordered), std::logic_error);
}

TEST(CsrMatrix, AColumnIndexOutOfRangeInAnyPartIsAReadErrorNamingTheArray) {
  for (const auto& [where, storage] : {std::pair{0.1, kStorages[0]}, {0.5, kStorages[3]}, {0.95, kStorages[1]}}) {
    SCOPED_TRACE("at " + std::to_string(where) + " of the values, " + storage.name());
    TempDir dir("csr_matrix");
    Matrix m = make_matrix(9);
    m.indices[static_cast<size_t>(where * static_cast<double>(m.indices.size()))] = static_cast<int32_t>(kCols + 4);
    const CsrMatrix csr = csr_of(dir, m, storage);
    for (const auto& [helpers, index_dtype] : {std::pair{0, DType::kInt32}, {3, DType::kInt32}, {3, DType::kInt64}}) {
      core::ThreadPool pool(helpers);
      const std::vector<int64_t> rows = shuffled_fetch(3);
      const CsrPlan plan = csr.plan(rows, pool);
      std::vector<int64_t> columns(static_cast<size_t>(plan.nnz()));  // wide enough for either
      std::vector<float> values(static_cast<size_t>(plan.nnz()));
      try {
        csr.read(plan, columns.data(), index_dtype, values.data(), pool);
        ADD_FAILURE() << "no error with " << helpers << " helpers, read as " << dtype_name(index_dtype);
      } catch (const core::ReadError& error) {
        const std::string message = error.what();
        EXPECT_NE(message.find("/X/indices"), std::string::npos) << message;
        EXPECT_NE(message.find("column index " + std::to_string(kCols + 4) + " out of range"), std::string::npos)
            << message;
      }
    }
  }
}

TEST(CsrMatrix, AMappedFileThatShrinksUnderAReadInPlaceIsAReadErrorNamingIt) {
  for (const Storage& storage : {kStorages[1], kStorages[3]}) {
    SCOPED_TRACE(storage.name());
    TempDir dir("csr_matrix");
    const Matrix m = make_matrix(4);
    const CsrMatrix csr = csr_of(dir, m, storage);
    core::ThreadPool pool(1);
    const std::vector<int64_t> rows = shuffled_fetch(8);
    const CsrPlan plan = csr.plan(rows, pool);
    std::vector<int32_t> columns(static_cast<size_t>(plan.nnz()));
    std::vector<float> values(static_cast<size_t>(plan.nnz()));
    csr.read(plan, columns.data(), DType::kInt32, values.data(), pool);  // mapped now
    ASSERT_EQ(::truncate((dir / "data").c_str(), 4096), 0);
    try {
      csr.read(plan, columns.data(), DType::kInt32, values.data(), pool);
      ADD_FAILURE() << "no error";
    } catch (const core::ReadError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(dir / "data"), std::string::npos) << message;
      EXPECT_NE(message.find("shrank"), std::string::npos) << message;
    }
  }
}

}  // namespace
}  // namespace torch_shards::io
