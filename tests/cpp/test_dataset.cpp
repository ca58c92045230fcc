// The public C++ API against LibTorch: the same native objects and the same
// contract as the Python door (epochs, ranks, exactly-once, errors).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <torch/torch.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <torch_shards/torch_shards.h>
#include "error_of.h"
#include "loader/dataset_door.h"
#include "loader/sources/source.h"
#include "temp_dir.h"

namespace ts = torch_shards;

namespace {

// A source whose "X" holds each row's own index times 10, to audit reads.
ts::TensorSource rows_source(int64_t rows) { return ts::TensorSource(torch::arange(rows, torch::kLong) * 10); }

std::vector<std::vector<int64_t>> epoch_batches(const ts::ShardedDataset& dataset) {
  std::vector<std::vector<int64_t>> batches;
  for (const auto& batch : dataset) {
    const at::Tensor index = batch.at("index");
    EXPECT_TRUE(torch::equal(batch.at("X"), index * 10));
    batches.emplace_back(index.data_ptr<int64_t>(), index.data_ptr<int64_t>() + index.numel());
  }
  return batches;
}

std::vector<int64_t> sorted_rows(const std::vector<std::vector<int64_t>>& batches) {
  std::vector<int64_t> rows;
  for (const auto& batch : batches) rows.insert(rows.end(), batch.begin(), batch.end());
  std::sort(rows.begin(), rows.end());
  return rows;
}

std::vector<int64_t> iota(int64_t count) {
  std::vector<int64_t> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out[static_cast<size_t>(i)] = i;
  return out;
}

// Every read of a LoggedSource: the rows it asked for, when it started and when it ended.
struct ReadLog {
  using Clock = std::chrono::steady_clock;
  struct Read {
    int64_t rows = 0;
    Clock::time_point began, ended;
  };
  std::mutex mutex;
  std::vector<Read> reads;
};

// One read of a LoggedSource: "X" holds each row's index times 10, written after a few milliseconds (as a
// file's read takes time), and the read is logged.
class LoggedRead : public ts::sources::PlannedRead {
 public:
  LoggedRead(const ts::sources::RowRequest& request, ReadLog& log)
      : rows_(request.rows), log_(log), began_(ReadLog::Clock::now()) {
    outputs_.push_back(ts::sources::OutputSpec{"X", ts::sources::OutputSpec::Part::kDense,
                                               ts::sources::TensorSpec{{request.num_out_rows()}, at::kLong}});
    for (size_t i = 0; i < rows_.size(); ++i) dests_.push_back(request.dest(i));
  }
  ts::sources::Batch fill(const std::vector<at::Tensor>& tensors, ts::sources::ReadContext&) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    int64_t* x = tensors[0].data_ptr<int64_t>();
    for (size_t i = 0; i < rows_.size(); ++i) x[dests_[i]] = rows_[i] * 10;
    const std::lock_guard<std::mutex> lock(log_.mutex);
    log_.reads.push_back({static_cast<int64_t>(rows_.size()), began_, ReadLog::Clock::now()});
    ts::sources::Batch batch;
    batch.insert("X", tensors[0]);
    return batch;
  }

 private:
  std::vector<int64_t> rows_, dests_;
  ReadLog& log_;
  ReadLog::Clock::time_point began_;
};

class LoggedSource : public ts::sources::Source {
 public:
  LoggedSource(int64_t rows, std::shared_ptr<ReadLog> log) : rows_(rows), log_(std::move(log)) {}
  int64_t num_rows() const override { return rows_; }
  std::vector<ts::sources::FieldSpec> fields() const override { return {{"X", at::kLong, {}, false}}; }
  std::unique_ptr<ts::sources::PlannedRead> plan(const ts::sources::RowRequest& request,
                                                 ts::sources::ReadContext&) const override {
    return std::make_unique<LoggedRead>(request, *log_);
  }
  std::string describe() const override { return "LoggedSource(" + std::to_string(rows_) + ")"; }

 private:
  int64_t rows_;
  std::shared_ptr<ReadLog> log_;
};

using torch_shards::testing_support::error_of;

using torch_shards::testing_support::TempDir;

}  // namespace

TEST(Dataset, EveryEpochDeliversEveryRowOnceAndEpochsAdvanceByThemselves) {
  ts::ShardedDataset dataset(rows_source(103), ts::BlockShuffling(4), {.batch_size = 8, .fetch_factor = 2, .seed = 5});
  EXPECT_EQ(dataset->epoch(), -1);
  std::vector<std::vector<std::vector<int64_t>>> epochs;
  for (int epoch = 0; epoch < 3; ++epoch) {
    epochs.push_back(epoch_batches(dataset));
    EXPECT_EQ(dataset->epoch(), epoch);
    EXPECT_EQ(static_cast<int64_t>(epochs.back().size()), dataset.size());
    EXPECT_EQ(sorted_rows(epochs.back()), iota(103));
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
  dataset->set_epoch(1);  // pins the next epoch, counting continues from it
  EXPECT_EQ(epoch_batches(dataset), epochs[1]);
  EXPECT_EQ(epoch_batches(dataset), epochs[2]);
}

TEST(Dataset, SameSeedSameBatchesWhateverTheReadAhead) {
  const auto batches = [](int64_t threads, int64_t prefetch) {
    ts::ShardedDataset dataset(
        rows_source(200), ts::Streaming(true),
        {.batch_size = 7, .fetch_factor = 3, .seed = 11, .num_threads = threads, .prefetch = prefetch});
    return epoch_batches(dataset);
  };
  const auto reference = batches(1, 0);
  EXPECT_EQ(batches(3, 0), reference);
  EXPECT_EQ(batches(2, 2), reference);
  EXPECT_EQ(batches(3, 5), reference);
}

TEST(Dataset, RanksShareEveryRowExactlyOnceWithEqualStepCounts) {
  for (int64_t world_size : {1, 2, 3, 4}) {
    std::vector<std::vector<int64_t>> all;
    std::set<int64_t> lengths;
    for (int64_t rank = 0; rank < world_size; ++rank) {
      ts::ShardedDataset dataset(rows_source(101), ts::BlockShuffling(3),
                                 {.batch_size = 4,
                                  .fetch_factor = 2,
                                  .even_batches = std::nullopt,
                                  .seed = 9,
                                  .rank = rank,
                                  .world_size = world_size});
      const auto batches = epoch_batches(dataset);
      EXPECT_EQ(static_cast<int64_t>(batches.size()), dataset.size());
      all.insert(all.end(), batches.begin(), batches.end());
      lengths.insert(dataset.size());
    }
    EXPECT_EQ(sorted_rows(all), iota(101)) << "world_size " << world_size;
    EXPECT_LE(*lengths.rbegin() - *lengths.begin(), 1);
  }
  // even_batches="pad" (the default): equal step counts on every rank.
  std::set<int64_t> padded;
  for (int64_t rank = 0; rank < 3; ++rank) {
    ts::ShardedDataset dataset(rows_source(101), ts::BlockShuffling(3),
                               {.batch_size = 4, .fetch_factor = 2, .seed = 9, .rank = rank, .world_size = 3});
    padded.insert(static_cast<int64_t>(epoch_batches(dataset).size()));
  }
  EXPECT_EQ(padded.size(), 1u);
}

TEST(Dataset, WorkersOfARankDeliverTheRanksBatches) {
  ts::ShardedDataset dataset(rows_source(150), ts::BlockShuffling(5),
                             {.batch_size = 6, .fetch_factor = 2, .seed = 2, .rank = 1, .world_size = 2});
  std::vector<std::vector<int64_t>> whole, by_workers;
  for (auto it = dataset->iter_epoch(4, 0, 1); auto batch = it->next();) {
    const at::Tensor index = batch->at("index");
    whole.emplace_back(index.data_ptr<int64_t>(), index.data_ptr<int64_t>() + index.numel());
  }
  for (int64_t worker = 0; worker < 3; ++worker) {
    for (auto it = dataset->iter_epoch(4, worker, 3); auto batch = it->next();) {
      const at::Tensor index = batch->at("index");
      by_workers.emplace_back(index.data_ptr<int64_t>(), index.data_ptr<int64_t>() + index.numel());
    }
  }
  std::sort(whole.begin(), whole.end());
  std::sort(by_workers.begin(), by_workers.end());
  EXPECT_EQ(whole, by_workers);
}

TEST(Dataset, EveryStrategyDelivers) {
  const at::Tensor weights = torch::arange(60, torch::kDouble).remainder(4) + 0.5;
  const at::Tensor labels = torch::arange(60, torch::kLong).remainder(3);
  const std::vector<ts::Strategy> strategies{ts::Streaming(), ts::Streaming(true), ts::BlockShuffling(4),
                                             ts::BlockWeightedSampling(weights, {.total_size = 80, .block_size = 2}),
                                             ts::ClassBalancedSampling(labels, {.block_size = 2})};
  for (const auto& strategy : strategies) {
    ts::ShardedDataset dataset(rows_source(60), strategy, {.batch_size = 8, .seed = 1});
    const auto batches = epoch_batches(dataset);
    int64_t rows = 0;
    for (const auto& batch : batches) rows += static_cast<int64_t>(batch.size());
    EXPECT_EQ(rows, strategy->plan_size(60)) << strategy->describe();
  }
}

TEST(Dataset, BreakingOutOfAnEpochStopsItsThreads) {
  ts::ShardedDataset dataset(rows_source(5000), ts::BlockShuffling(4),
                             {.batch_size = 16, .seed = 0, .num_threads = 3, .prefetch = 4});
  for (int epoch = 0; epoch < 20; ++epoch) {
    for (const auto& batch : dataset) {
      EXPECT_EQ(batch.at("index").size(0), 16);
      break;
    }
  }
  EXPECT_EQ(dataset->epoch(), 19);
  EXPECT_TRUE(dataset->reader_stats().empty());
}

TEST(Dataset, AnEpochsFirstBatchIsReadAloneAsAPieceOfItsOwn) {
  // Fetches of 4 batches of 8 rows; the epoch's first batch is read first and alone (its rows, not its
  // fetch's 32), then the others start. From the second epoch on: the first may not know yet that its
  // reads wait on no request, and while reads wait (a server's) they all start at once.
  auto log = std::make_shared<ReadLog>();
  const ts::Source source(c10::make_intrusive<ts::SourceImpl>(
      ts::SourceState{"LoggedSource", "{}", c10::Dict<std::string, at::Tensor>(), {}},
      std::make_shared<LoggedSource>(320, log)));
  ts::ShardedDataset dataset(source, ts::BlockShuffling(4),
                             {.batch_size = 8, .fetch_factor = 4, .seed = 3, .num_threads = 4, .prefetch = 8});
  for (int epoch = 0; epoch < 3; ++epoch) {
    {
      const std::lock_guard<std::mutex> lock(log->mutex);
      log->reads.clear();
    }
    const auto batches = epoch_batches(dataset);  // every batch's X is its rows' index times 10
    EXPECT_EQ(sorted_rows(batches), iota(320));
    if (epoch == 0) continue;
    const std::lock_guard<std::mutex> lock(log->mutex);
    ASSERT_GE(log->reads.size(), 3u);
    std::sort(log->reads.begin(), log->reads.end(), [](const auto& a, const auto& b) { return a.began < b.began; });
    EXPECT_EQ(log->reads[0].rows, 8) << "epoch " << epoch;
    // The rest of the first fetch, then whole fetches (which thread logs its start first is the scheduler's).
    std::vector<int64_t> later;
    for (size_t i = 1; i < log->reads.size(); ++i) later.push_back(log->reads[i].rows);
    std::sort(later.begin(), later.end());
    std::vector<int64_t> expected(9, 32);
    expected.insert(expected.begin(), 24);
    EXPECT_EQ(later, expected) << "epoch " << epoch;
    for (size_t i = 1; i < log->reads.size(); ++i) {
      EXPECT_GE(log->reads[i].began, log->reads[0].ended) << "epoch " << epoch << ": read " << i;
    }
  }
}

TEST(Dataset, DeviceOptionOnTheHostAndWithoutCuda) {
  // "cpu" is the host path; a CUDA device needs a CUDA torch (the GPU tests run the copy itself).
  const auto batches = [](std::optional<c10::Device> device) {
    ts::DatasetOptions options{.batch_size = 4, .seed = 1};
    options.device = device;
    std::vector<int64_t> rows;
    for (const auto& batch : ts::ShardedDataset(rows_source(10), ts::BlockShuffling(3), options)) {
      EXPECT_TRUE(batch.at("index").is_cpu());
      for (int64_t r : std::vector<int64_t>(batch.at("index").data_ptr<int64_t>(),
                                            batch.at("index").data_ptr<int64_t>() + batch.at("index").numel())) {
        rows.push_back(r);
      }
    }
    return rows;
  };
  EXPECT_EQ(batches(c10::Device("cpu")), batches(std::nullopt));
  if (!torch::cuda::is_available()) {
    ts::DatasetOptions options{.batch_size = 4};
    options.device = c10::Device("cuda");
    EXPECT_EQ(error_of<c10::ValueError>([&] { ts::ShardedDataset(rows_source(10), ts::Streaming(), options); }),
              "ShardedDataset: device='cuda' but this torch has no CUDA device (torch.cuda.is_available() is False); "
              "leave device=None to keep batches on the host");
  }
}

TEST(Dataset, BadArgumentsThrowValueErrorsWithThePythonMessages) {
  const auto make = [](ts::DatasetOptions options) {
    return [options] { ts::ShardedDataset(rows_source(20), ts::Streaming(), options); };
  };
  const std::map<std::string, ts::DatasetOptions> cases{
      {"ShardedDataset: batch_size must be >= 1, got 0", {.batch_size = 0}},
      {"ShardedDataset: batch_size must be >= 1, got -3", {.batch_size = -3}},
      {"ShardedDataset: fetch_factor must be >= 1, got 0", {.batch_size = 4, .fetch_factor = 0}},
      {"ShardedDataset: batch_size * fetch_factor must be < 2**31, got 1048576 * 4096",
       {.batch_size = 1 << 20, .fetch_factor = 1 << 12}},
      {"ShardedDataset: rank must be in [0, world_size=2), got 2", {.batch_size = 4, .rank = 2, .world_size = 2}},
      {"ShardedDataset: world_size must be in [1, 2**20], got 0", {.batch_size = 4, .rank = 0, .world_size = 0}},
      // (ctest sets no RANK.)
      {"ShardedDataset: world_size=2 but no rank: pass rank=, or build it after torch.distributed.init_process_group, "
       "or launch with torchrun (which sets RANK); otherwise every process would read rank 0's rows",
       {.batch_size = 4, .world_size = 2}},
      {"ShardedDataset: even_batches must be 'pad', 'drop' or None, got 'equal'",
       {.batch_size = 4, .even_batches = "equal"}},
      {"ShardedDataset: prefetch must be in [0, 1024], got -1", {.batch_size = 4, .prefetch = -1}},
      {"ShardedDataset: num_threads must be in [1, 256], got 0", {.batch_size = 4, .num_threads = 0}},
      {"ShardedDataset: prefetch must be in [0, 1024], got 1000000000", {.batch_size = 4, .prefetch = 1000000000}},
      {"ShardedDataset: num_threads must be in [1, 256], got 5000", {.batch_size = 4, .num_threads = 5000}},
  };
  for (const auto& [message, options] : cases) EXPECT_EQ(error_of<c10::ValueError>(make(options)), message);
  EXPECT_EQ(error_of<c10::ValueError>([] { ts::BlockShuffling(0); }), "BlockShuffling: block_size must be >= 1, got 0");
  EXPECT_EQ(error_of<c10::ValueError>([] {
              ts::Streaming(false, torch::tensor({3, 1, 3}));
            }),
            "Streaming: indices must be unique, got row 3 more than once");
  EXPECT_EQ(error_of<c10::ValueError>([] {
              ts::BlockWeightedSampling(torch::tensor({0.0, 0.0}));
            }),
            "BlockWeightedSampling: weights must not all be zero");
  // An empty source is a valid part of a collection; a dataset over no rows is refused.
  EXPECT_EQ(
      error_of<c10::ValueError>([] {
        ts::ShardedDataset(ts::TensorSource(torch::zeros({0, 3})), ts::Streaming(), {.batch_size = 4});
      }),
      "ShardedDataset: the source has no rows (TensorSource(rows=0, X=Float[0, 3])): there is nothing to iterate");
  EXPECT_EQ(error_of<c10::ValueError>([] {
              ts::TensorSource(at::quantize_per_tensor(torch::rand({4, 2}), 0.1, 0, at::kQUInt8));
            }),
            "TensorSource: field 'X' is a quantized tensor (QUInt8): dequantize it first (tensor.dequantize() or "
            "tensor.int_repr())");
}

TEST(Dataset, MissingFilesNameThePath) {
  const std::string message = error_of<c10::Error>([] { ts::HDF5Source("/no/such/file.h5", "/x"); });
  EXPECT_NE(message.find("/no/such/file.h5"), std::string::npos) << message;
  EXPECT_NE(message.find("No such file or directory"), std::string::npos) << message;
  const std::string zarr = error_of<c10::Error>([] { ts::ZarrSource("/no/such/store.zarr"); });
  EXPECT_NE(zarr.find("No such file or directory: '/no/such/store.zarr'"), std::string::npos) << zarr;
}

// annbatch's DatasetCollection (the committed fixtures annbatch 0.3.1 wrote):
// its datasets in annbatch's order, read as one collection whose rows are
// the datasets' rows one after the other.
TEST(Dataset, OpensAnnbatchCollections) {
  const std::string data = TORCH_SHARDS_TEST_DATA "/anndata/annbatch-0.3.1";
  for (const std::string name : {"collection.zarr", "collection-h5ad"}) {
    const std::string path = data + "/" + name, suffix = name == "collection.zarr" ? "" : ".h5ad";
    const auto datasets = ts::annbatch_datasets(path);
    ASSERT_TRUE(datasets) << path;
    ASSERT_EQ(datasets->size(), 3u);
    std::vector<ts::Source> parts;
    for (size_t i = 0; i < datasets->size(); ++i) {
      EXPECT_EQ((*datasets)[i], path + "/dataset_" + std::to_string(i) + suffix);
      parts.push_back(ts::AnnDataSource((*datasets)[i], {.dense = true}));
    }
    const ts::AnnbatchCollection collection(path, {.dense = true});
    int64_t offset = 0;
    for (const ts::Source& part : parts) {
      const at::Tensor local = torch::arange(part.size(), torch::kLong);
      const at::Tensor expected = part.read(local).at("X");
      EXPECT_TRUE(torch::equal(collection.read(local + offset).at("X"), expected)) << name;
      offset += part.size();
    }
    EXPECT_EQ(collection.size(), offset);
    // What its codes mean: every dataset's categories (they agree).
    const ts::AnnbatchCollection labelled(path, {.obs = {"cell_type", "n_counts"}});
    const std::string categories = labelled.categories_json("cell_type");
    EXPECT_NE(categories, "[]") << name;
    for (const std::string& dataset : *datasets) {
      EXPECT_EQ(categories, ts::AnnDataSource(dataset).anndata()->categories_json("cell_type")) << dataset;
    }
    const std::string unread = error_of<c10::ValueError>([&] { labelled.categories_json("src_path"); });
    EXPECT_NE(unread.find("'src_path' is not an obs column the collection reads (obs=['cell_type', 'n_counts'])"),
              std::string::npos)
        << unread;
    const std::string numbers = error_of<c10::ValueError>([&] { labelled.categories_json("n_counts"); });
    EXPECT_NE(numbers.find("obs column 'n_counts' is not categorical"), std::string::npos) << numbers;
  }
  const std::string no_anndata = error_of<c10::ValueError>([] {
    ts::Collection(std::vector<ts::Source>{ts::TensorSource(torch::zeros({2, 1}))}).categories_json("y");
  });
  EXPECT_NE(no_anndata.find("the collection holds no AnnDataSource"), std::string::npos) << no_anndata;
  // A single AnnData, a directory of anything else: not collections.
  EXPECT_FALSE(ts::annbatch_datasets(data + "/collection.zarr/dataset_0"));
  EXPECT_FALSE(ts::annbatch_datasets(data));
  EXPECT_FALSE(ts::annbatch_datasets(data + "/manifest.json"));
  const std::string missing = error_of<c10::Error>([] { ts::AnnbatchCollection("/no/such/collection.zarr"); });
  EXPECT_NE(missing.find("No such file or directory: '/no/such/collection.zarr'"), std::string::npos) << missing;
  const std::string plain =
      error_of<c10::ValueError>([&] { ts::AnnbatchCollection(data + "/collection.zarr/dataset_0"); });
  EXPECT_NE(plain.find("dataset_0 is not an annbatch DatasetCollection"), std::string::npos) << plain;
  // By number, not by name; other files left out.
  TempDir dir;
  std::filesystem::create_directory(dir / "h5ad");
  for (const char* file : {"dataset_10.h5ad", "dataset_2.h5ad", "dataset_1.h5ad", "notes.txt", "dataset_x.h5ad"}) {
    std::ofstream(dir / ("h5ad/" + std::string(file)));
  }
  const auto numbered = ts::annbatch_datasets(dir / "h5ad");
  ASSERT_TRUE(numbered);
  EXPECT_EQ(*numbered, (std::vector<std::string>{dir / "h5ad/dataset_1.h5ad", dir / "h5ad/dataset_2.h5ad",
                                                 dir / "h5ad/dataset_10.h5ad"}));
  // The marker without datasets is named.
  std::filesystem::create_directory(dir / "empty.zarr");
  std::filesystem::copy_file(data + "/collection.zarr/zarr.json", dir / "empty.zarr/zarr.json");
  const std::string empty = error_of<c10::ValueError>([&] { ts::annbatch_datasets(dir / "empty.zarr"); });
  EXPECT_NE(empty.find("empty.zarr is an annbatch DatasetCollection without datasets"), std::string::npos) << empty;
}

// annbatch's datasets store their barcodes as string columns of their own
// (codes into each dataset's sorted barcodes): a collection reads them as
// codes into the union of them, the datasets in order, each barcode at its
// first appearance; nested collections unite their unions.
TEST(Dataset, ReadsPerDatasetCategoriesAsCodesIntoTheirUnion) {
  const std::string data = TORCH_SHARDS_TEST_DATA "/anndata/annbatch-0.3.1/collection.zarr";
  const auto dataset = [&](int k) {
    return ts::AnnDataSource(data + "/dataset_" + std::to_string(k), {.obs = {"barcode"}});
  };
  const ts::AnnbatchCollection flat(data, {.obs = {"barcode"}});
  // (A braced list of one collection would copy it: the parts are spelled as vectors.)
  const ts::Collection inner(std::vector<ts::Source>{dataset(1)});
  const ts::Collection nested({dataset(0), ts::Collection(std::vector<ts::Source>{inner}), dataset(2)});
  nlohmann::json expected = nlohmann::json::array();
  std::vector<nlohmann::json> values;  // every row's barcode
  for (int k = 0; k < 3; ++k) {
    const ts::AnnDataSource part = dataset(k);
    const auto own = nlohmann::json::parse(part.anndata()->categories_json("barcode"));
    for (const auto& barcode : own) {
      if (std::find(expected.begin(), expected.end(), barcode) == expected.end()) expected.push_back(barcode);
    }
    const at::Tensor codes = part.read(torch::arange(part.size(), torch::kLong)).at("barcode");
    for (int64_t i = 0; i < codes.numel(); ++i) values.push_back(own.at(codes[i].item<int64_t>()));
  }
  ASSERT_GT(expected.size(), nlohmann::json::parse(dataset(0).anndata()->categories_json("barcode")).size());
  const int64_t rows = static_cast<int64_t>(values.size());
  const at::Tensor shuffled = torch::randperm(rows, torch::TensorOptions().dtype(torch::kLong));
  for (const ts::Collection* collection : {static_cast<const ts::Collection*>(&flat), &nested}) {
    const auto categories = nlohmann::json::parse(collection->categories_json("barcode"));
    EXPECT_EQ(categories, expected);
    const at::Tensor codes = collection->read(shuffled).at("barcode");
    for (int64_t i = 0; i < rows; ++i) {
      ASSERT_EQ(categories.at(codes[i].item<int64_t>()), values[shuffled[i].item<int64_t>()]) << i;
    }
  }
}

TEST(Dataset, ReadsAnHdf5File) {
  TempDir dir;
  const std::string path = dir / "x.h5";
  const at::Tensor data = torch::arange(40 * 3, torch::kFloat).reshape({40, 3});
  {
    const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t dims[2] = {40, 3};
    const hid_t space = H5Screate_simple(2, dims, nullptr);
    const hid_t set = H5Dcreate2(file, "x", H5T_NATIVE_FLOAT, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data_ptr<float>());
    H5Dclose(set);
    H5Sclose(space);
    H5Fclose(file);
  }
  ts::HDF5Source source(path, "/x");
  EXPECT_EQ(source.size(), 40);
  ts::ShardedDataset dataset(source, ts::BlockShuffling(3), {.batch_size = 6, .seed = 4});
  int64_t rows = 0;
  for (const auto& batch : dataset) {
    EXPECT_TRUE(torch::equal(batch.at("X"), data.index_select(0, batch.at("index"))));
    rows += batch.at("index").size(0);
  }
  EXPECT_EQ(rows, 40);
}

TEST(Dataset, SeedAndConsistencyOverAProcessGroup) {
  TempDir dir;
  auto store = c10::make_intrusive<c10d::FileStore>(dir / "store", 1);
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  c10::intrusive_ptr<c10d::ProcessGroup> group = c10::make_intrusive<c10d::ProcessGroup>(store, 0, 1);
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, 0, 1, options);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  ts::ShardedDataset dataset(rows_source(30), ts::BlockShuffling(2), {.batch_size = 4, .process_group = group});
  EXPECT_EQ(dataset->rank(), 0);
  EXPECT_EQ(dataset->world_size(), 1);
  EXPECT_EQ(sorted_rows(epoch_batches(dataset)), iota(30));
}

// With seed=None, a group that is a part of the job (here one process of the two WORLD_SIZE says) is
// refused: each such group would agree on its own seed. Given a seed, it reads.
TEST(Dataset, AGroupThatIsAPartOfTheJobNeedsASeed) {
  TempDir dir;
  auto store = c10::make_intrusive<c10d::FileStore>(dir / "store", 1);
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  c10::intrusive_ptr<c10d::ProcessGroup> group = c10::make_intrusive<c10d::ProcessGroup>(store, 0, 1);
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, 0, 1, options);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  setenv("WORLD_SIZE", "2", 1);
  EXPECT_EQ(error_of<c10::ValueError>([&] {
              ts::ShardedDataset(rows_source(30), ts::BlockShuffling(2), {.batch_size = 4, .process_group = group});
            }),
            "ShardedDataset: process_group is a part of the job's processes and seed=None: each such group would "
            "agree on its own seed, and processes of different groups that read the same rank (tensor-parallel "
            "peers) would read different rows. Pass seed= (the same on every process)");
  ts::ShardedDataset dataset(rows_source(30), ts::BlockShuffling(2),
                             {.batch_size = 4, .seed = 3, .process_group = group});
  unsetenv("WORLD_SIZE");
  EXPECT_EQ(dataset->seed(), 3);
  EXPECT_EQ(sorted_rows(epoch_batches(dataset)), iota(30));
}

TEST(Dataset, RankAndWorldSizeFromTheEnvironment) {
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "3", 1);
  ts::ShardedDataset dataset(rows_source(30), ts::Streaming(), {.batch_size = 4, .seed = 0});
  EXPECT_EQ(dataset->rank(), 1);
  EXPECT_EQ(dataset->world_size(), 3);
  setenv("RANK", "x", 1);
  EXPECT_EQ(error_of<c10::ValueError>([] { ts::ShardedDataset(rows_source(30), ts::Streaming(), {.batch_size = 4}); }),
            "environment variable RANK must be an integer, got 'x'");
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
}

TEST(Dataset, FetchTransformMustKeepItsRows) {
  ts::ShardedDataset dataset(rows_source(30), ts::Streaming(), {.batch_size = 4, .fetch_factor = 2, .seed = 0});
  auto it = dataset->iter();
  auto unit = it->next_unit();
  ASSERT_TRUE(unit.has_value());
  ts::Batch shorter;
  shorter.insert("X", unit->at("X").narrow(0, 0, 5));
  EXPECT_EQ(error_of<c10::ValueError>([&] { it->push_unit(shorter); }),
            "ShardedDataset: fetch_transform must keep the rows it is given (their number and order): it got 8 rows "
            "and returned 5");
  it->push_unit(*unit);
  EXPECT_EQ(it->pending(), 2);
  EXPECT_EQ(it->next()->at("index").size(0), 4);
}

TEST(Dataset, CheckpointsResumeExactlyOnceOnAnotherTopology) {
  const auto make = [](int64_t rank, int64_t world_size) {
    return ts::ShardedDataset(rows_source(97), ts::BlockShuffling(3),
                              {.batch_size = 4, .fetch_factor = 3, .seed = 3, .rank = rank, .world_size = world_size});
  };
  std::vector<std::vector<int64_t>> delivered;
  ts::StateDict state;
  for (int64_t rank = 0; rank < 2; ++rank) {
    auto dataset = make(rank, 2);
    int64_t taken = 0;
    for (const auto& batch : dataset) {
      const at::Tensor index = batch.at("index");
      delivered.emplace_back(index.data_ptr<int64_t>(), index.data_ptr<int64_t>() + index.numel());
      if (++taken == 5) break;
    }
    if (rank == 0) state = dataset->state_dict();  // the loop consumed 5 batches
  }
  EXPECT_EQ(state.at("epoch"), 0);
  for (int64_t rank = 0; rank < 3; ++rank) {
    auto dataset = make(rank, 3);
    dataset->load_state_dict(state);
    const int64_t expected = dataset.size();
    const auto rest = epoch_batches(dataset);
    EXPECT_EQ(static_cast<int64_t>(rest.size()), expected);
    delivered.insert(delivered.end(), rest.begin(), rest.end());
  }
  std::vector<int64_t> rows = sorted_rows(delivered);
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());  // padding repeats aside
  EXPECT_EQ(rows, iota(97));
  auto other = ts::ShardedDataset(rows_source(97), ts::BlockShuffling(3), {.batch_size = 5, .fetch_factor = 3});
  EXPECT_EQ(error_of<c10::ValueError>([&] { other->load_state_dict(state); }),
            "ShardedDataset.load_state_dict: the state was taken on another dataset: its batch_size is 4, this "
            "dataset's is 5");
}

namespace {

// Runs one epoch of `dataset` through `loop`, which calls checkpoint() once, somewhere; then resumes a
// fresh dataset from that checkpoint and returns every row the two runs delivered, in order.
template <typename Loop>
std::vector<int64_t> rows_around_a_checkpoint(const Loop& loop) {
  const auto make = [] {
    return ts::ShardedDataset(rows_source(61), ts::BlockShuffling(3), {.batch_size = 4, .fetch_factor = 3, .seed = 9});
  };
  auto dataset = make();
  std::vector<int64_t> rows;
  ts::StateDict state;
  const auto use = [&](const ts::Batch& batch) {
    const at::Tensor index = batch.at("index");
    rows.insert(rows.end(), index.data_ptr<int64_t>(), index.data_ptr<int64_t>() + index.numel());
  };
  loop(dataset, use, [&] { state = dataset->state_dict(); });
  // The loop stops at its checkpoint: resume the rest.
  auto resumed = make();
  resumed->load_state_dict(state);
  for (const auto& batch : resumed) use(batch);
  return rows;
}

}  // namespace

TEST(Dataset, ACheckpointCountsTheBatchesTheLoopTookWhicheverWayItIsWritten) {
  const std::vector<int64_t> every_row = iota(61);
  const auto once = [&](std::vector<int64_t> rows) {
    std::sort(rows.begin(), rows.end());
    return rows == every_row;
  };
  // A range-for, checkpointing after using its 5th batch.
  EXPECT_TRUE(once(rows_around_a_checkpoint([](ts::ShardedDataset& dataset, auto&& use, auto&& checkpoint) {
    int64_t step = 0;
    for (const auto& batch : dataset) {
      use(batch);
      if (++step == 5) {
        checkpoint();
        break;
      }
    }
  })));
  // An explicit iterator, checkpointing right after ++it, before the batch it reached is used.
  EXPECT_TRUE(once(rows_around_a_checkpoint([](ts::ShardedDataset& dataset, auto&& use, auto&& checkpoint) {
    int64_t step = 0;
    for (auto it = dataset.begin(); it != dataset.end(); ++it) {
      if (step++ == 5) {
        checkpoint();
        break;
      }
      use(*it);
    }
  })));
  // ++it over batches never looked at: they are taken (passed over), so not delivered again.
  std::vector<int64_t> skipped;
  std::vector<int64_t> rows = rows_around_a_checkpoint([&](ts::ShardedDataset& dataset, auto&& use, auto&& checkpoint) {
    auto it = dataset.begin();
    for (int i = 0; i < 2; ++i) {
      const at::Tensor index = it->at("index");
      skipped.insert(skipped.end(), index.data_ptr<int64_t>(), index.data_ptr<int64_t>() + index.numel());
      ++it;
    }
    ++it;  // never looked at
    use(*it);
    ++it;
    checkpoint();
  });
  EXPECT_EQ(rows.size() + skipped.size() + 4, every_row.size());  // the batch passed over unseen: 4 rows
  // next() on the native iterator: each batch it returns is taken.
  EXPECT_TRUE(once(rows_around_a_checkpoint([](ts::ShardedDataset& dataset, auto&& use, auto&& checkpoint) {
    auto batches = dataset->iter();
    for (int step = 0; step < 5; ++step) use(*batches->next());
    ASSERT_TRUE(batches->has_next());  // waits for the 6th, takes nothing
    checkpoint();
  })));
  // Dereferencing past the end is refused.
  auto dataset = ts::ShardedDataset(rows_source(8), ts::Streaming(), {.batch_size = 8});
  auto it = dataset.begin();
  ++it;
  EXPECT_TRUE(it == dataset.end());
  EXPECT_NE(error_of<c10::Error>([&] { *it; }).find("dereferenced at the end of the epoch"), std::string::npos);
}

TEST(Dataset, ACsrSourcesFirstPiecesAreAdmittedByTheStoredSizeOfItsRows) {
  // Before anything is read, a row of an AnnData X in CSR is taken to cost what its stored arrays say
  // (values and column indices of an average row, an offset, the index): from the dense fields alone
  // (the index, 8 bytes), every reader thread started a piece at once, whatever prefetch_bytes said.
  // A collection's is its parts', weighted by their rows.
  const std::string data = std::string(TORCH_SHARDS_TEST_DATA) + "/anndata/anndata-0.13.4/";
  const ts::AnnDataSource sparse(data + "obs.h5ad"), densified(data + "obs.h5ad", {.dense = true});
  const ts::Collection both({sparse, sparse});
  for (const ts::Source& source : std::vector<ts::Source>{sparse, densified, both}) {
    auto dataset = c10::make_intrusive<ts::ShardedDatasetImpl>(source.native(), ts::Streaming().native(),
                                                               ts::DatasetOptions{.batch_size = 8, .num_threads = 2});
    auto batches = dataset->iter();
    const int64_t estimate = batches->stats().at("row_bytes_estimate");  // no read has started
    while (batches->next()) {
    }
    const c10::Dict<std::string, int64_t> read = batches->stats();
    const double per_row = static_cast<double>(read.at("bytes")) / static_cast<double>(read.at("rows"));
    EXPECT_EQ(read.at("rows"), source.size());
    EXPECT_GT(per_row, 30.0);  // 143 values in 40 rows of 12 columns
    EXPECT_GE(estimate, 0.8 * per_row) << source.native()->describe();
    EXPECT_LE(estimate, 1.2 * per_row) << source.native()->describe();
  }
}

TEST(Dataset, AWorkerPackingUnitsReadsAnItemAheadUnlessPrefetchIsSet) {
  // ts.DataLoader's workers take units an item at a time (take_units), then are away while it crosses:
  // the threads read the next item meanwhile, beyond the default two units per thread, within
  // prefetch_bytes; a prefetch the user set is kept.
  constexpr int64_t kUnitBytes = 16 * (64 * 4 + 8);  // 16 rows of 64 float32 and their index
  constexpr int64_t kItemBytes = 16 * kUnitBytes;
  // The most units read and not taken seen after one item was taken, once they stop growing.
  const auto most_queued = [&](std::optional<int64_t> prefetch, int64_t prefetch_bytes) {
    ts::DatasetOptions options{.batch_size = 16,
                               .fetch_factor = 1,
                               .seed = 0,
                               .num_threads = 2,
                               .prefetch = prefetch,
                               .prefetch_bytes = prefetch_bytes};
    auto dataset = c10::make_intrusive<ts::ShardedDatasetImpl>(ts::TensorSource(torch::zeros({16384, 64})).native(),
                                                               ts::Streaming().native(), options);
    auto iterator = ts::DatasetDoor::iter_worker(*dataset, 0, 1, 1, false);
    EXPECT_EQ(ts::DatasetDoor::take_units(*iterator, 10000, kItemBytes).size(), 16u);
    int64_t most = 0, same_since = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (same_since < 20 && std::chrono::steady_clock::now() < deadline) {
      const int64_t queued = iterator->stats().at("queue_depth");
      same_since = queued == most && iterator->stats().at("in_flight") == 0 ? same_since + 1 : 0;
      most = std::max(most, queued);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return most;
  };
  const int64_t deepened = most_queued(std::nullopt, int64_t{1} << 30);
  EXPECT_GE(deepened, 15);  // an item's bytes (less the estimate of a unit being read at the end)
  EXPECT_LE(deepened, 16 + 2);
  EXPECT_EQ(most_queued(4, int64_t{1} << 30), 4);
  EXPECT_LE(most_queued(std::nullopt, 5 * kUnitBytes), 5 + 2);  // prefetch_bytes still bounds it
}

TEST(Dataset, AWorkerPackingUnitsIsWokenOncePerItemNotPerUnit) {
  // take_units waits for an item's bytes at once (EpochReader::wait_for_bytes): the reader threads wake
  // it when they are read, not at every unit or two; and it still returns at the epoch's end, with fewer
  // bytes, and when prefetch_bytes leaves no room for the rest of the item. Each read takes 3 ms
  // (LoggedSource): the worker waits for most units.
  constexpr int64_t kUnitBytes = 16 * (8 + 8);  // 16 rows of "X" (int64) and their index
  const auto take = [&](int64_t item_units, int64_t prefetch_bytes) {
    ts::DatasetOptions options{
        .batch_size = 16, .fetch_factor = 1, .seed = 0, .num_threads = 2, .prefetch_bytes = prefetch_bytes};
    const ts::Source source(c10::make_intrusive<ts::SourceImpl>(
        ts::SourceState{"LoggedSource", "{}", c10::Dict<std::string, at::Tensor>(), {}},
        std::make_shared<LoggedSource>(16 * 64, std::make_shared<ReadLog>())));
    auto dataset =
        c10::make_intrusive<ts::ShardedDatasetImpl>(source.native(), ts::BlockShuffling(4).native(), options);
    auto iterator = ts::DatasetDoor::iter_worker(*dataset, 0, 1, 1, false);
    std::vector<int64_t> item_sizes;
    int64_t wakes = 0;
    while (true) {
      const auto units = ts::DatasetDoor::take_units(*iterator, 10000, item_units * kUnitBytes);
      if (units.empty()) break;
      item_sizes.push_back(static_cast<int64_t>(units.size()));
      if (!iterator->finished()) wakes = iterator->stats().at("wakes");
    }
    return std::pair{item_sizes, wakes};
  };
  const auto [items, wakes] = take(16, int64_t{1} << 30);  // 64 units: 4 items of 16
  EXPECT_EQ(items, (std::vector<int64_t>{16, 16, 16, 16}));
  EXPECT_LE(wakes, 4 * 2) << "woken " << wakes << " times for 4 items of 16 units";
  const auto [tail, tail_wakes] = take(40, int64_t{1} << 30);  // the epoch ends within the second item
  EXPECT_EQ(tail, (std::vector<int64_t>{40, 24}));
  const auto [roomless, roomless_wakes] = take(16, 4 * kUnitBytes);  // room for 4 units out at a time
  int64_t units = 0;
  for (const int64_t size : roomless) units += size;
  EXPECT_EQ(units, 64);
}

TEST(Dataset, AWorkerCopysLoadedStateGivesTheMainObjectItsSeed) {
  // torchdata's StatefulDataLoader restores each DataLoader worker's own state in that worker: the main
  // process's object shares its words and must report and checkpoint the loaded seed.
  const auto options = [](std::optional<int64_t> seed) {
    return ts::DatasetOptions{.batch_size = 4, .fetch_factor = 3, .seed = seed};
  };
  auto taken =
      c10::make_intrusive<ts::ShardedDatasetImpl>(rows_source(61).native(), ts::BlockShuffling(3).native(), options(5));
  auto iterator = ts::DatasetDoor::iter_worker(*taken, 0, 2, 1, false);
  iterator->next();
  const ts::StateDict worker_state = taken->state_dict();
  auto main = c10::make_intrusive<ts::ShardedDatasetImpl>(rows_source(61).native(), ts::BlockShuffling(3).native(),
                                                          options(std::nullopt));
  auto worker = ts::DatasetDoor::make(rows_source(61).native(), ts::BlockShuffling(3).native(), options(std::nullopt),
                                      ts::DatasetDoor::shared_state(*main));
  worker->load_state_dict(worker_state);
  EXPECT_EQ(main->seed(), 5);
  EXPECT_EQ(main->state_dict().at("seed"), 5);
}
