// torch_shards::open and its decision (plan_open): the source a path is
// opened as, by what it holds, over the AnnData fixture files of
// tests/data/anndata and small files written here.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <torch_shards/torch_shards.h>

#include "error_of.h"
#include "temp_dir.h"

namespace ts = torch_shards;

namespace {

const std::string kData = TORCH_SHARDS_TEST_DATA "/anndata";

using torch_shards::testing_support::error_of;

using torch_shards::testing_support::TempDir;

// An HDF5 file (not AnnData) holding the 10 x 2 float dataset "/x".
std::string write_hdf5(const TempDir& dir) {
  const std::string path = dir / "x.h5";
  const at::Tensor data = torch::arange(20, torch::kFloat).reshape({10, 2});
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hsize_t dims[2] = {10, 2};
  const hid_t space = H5Screate_simple(2, dims, nullptr);
  const hid_t set = H5Dcreate2(file, "x", H5T_NATIVE_FLOAT, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data_ptr<float>());
  H5Dclose(set);
  H5Sclose(space);
  H5Fclose(file);
  return path;
}

TEST(Open, AnAnnDataFileOrStoreIsAnAnnDataSource) {
  const std::string h5ad = kData + "/anndata-0.12.19/dense.h5ad";
  const ts::OpenPlan plan = ts::plan_open(h5ad, false, false);
  EXPECT_EQ(plan.kind, "anndata");
  EXPECT_EQ(plan.paths, std::vector<std::string>{h5ad});
  const ts::Source source = ts::open(h5ad);
  EXPECT_EQ(source.size(), ts::AnnDataSource(h5ad).size());
  const std::string zarr = kData + "/anndata-0.12.19/dense-zarr3-sharded.zarr";
  EXPECT_EQ(ts::plan_open(zarr, false, false).kind, "anndata");
}

TEST(Open, AnAnnbatchCollectionIsACollectionOfItsDatasets) {
  for (const std::string name : {"collection.zarr", "collection-h5ad"}) {
    const std::string path = kData + "/annbatch-0.3.1/" + name;
    const ts::OpenPlan plan = ts::plan_open(path, false, false);
    EXPECT_EQ(plan.kind, "collection") << name;
    EXPECT_EQ(plan.paths, *ts::annbatch_datasets(path)) << name;
    int64_t rows = 0;
    for (const std::string& dataset : plan.paths) rows += ts::AnnDataSource(dataset).size();
    EXPECT_EQ(ts::open(path).size(), rows) << name;
  }
}

TEST(Open, AnHdf5FileNeedsItsDataset) {
  TempDir dir;
  const std::string path = write_hdf5(dir);
  EXPECT_EQ(error_of<c10::ValueError>([&] { ts::open(path); }),
            "torch_shards.open: " + path + " is an HDF5 file but not AnnData: pass dataset='/path/in/file'");
  ts::OpenOptions options;
  options.dataset = "/x";
  const ts::Source source = ts::open(path, options);
  EXPECT_EQ(source.size(), 10);
  EXPECT_TRUE(torch::equal(source.read(torch::tensor({3}, torch::kLong)).at("X"), torch::tensor({{6.0f, 7.0f}})));
  // Several paths: a Collection of each.
  EXPECT_EQ(ts::open(std::vector<std::string>{path, path}, options).size(), 20);
}

TEST(Open, AZarrGroupNeedsItsArray) {
  TempDir dir;
  const std::string store = dir / "group.zarr";
  std::filesystem::create_directories(store);
  std::ofstream(store + "/.zgroup") << R"({"zarr_format": 2})";
  EXPECT_EQ(error_of<c10::ValueError>([&] { ts::plan_open(store, false, false); }),
            "torch_shards.open: " + store + " is a zarr group but not AnnData: pass array='/path/in/store'");
  EXPECT_EQ(ts::plan_open(store, false, true).kind, "zarr");
}

TEST(Open, WhatIsNeitherOrMissingIsRefused) {
  TempDir dir;
  const std::string text = dir / "notes.txt";
  std::ofstream(text) << "not a dataset";
  EXPECT_EQ(error_of<c10::ValueError>([&] { ts::open(text); }),
            "torch_shards.open: " + text + " is neither an HDF5 file nor a zarr store");
  const std::string missing = dir / "missing.h5ad";
  EXPECT_EQ(error_of<c10::Error>([&] { ts::open(missing); }), "[Errno 2] No such file or directory: '" + missing + "'");
  ts::OpenOptions options;
  options.storage = ts::StorageOptions{};
  EXPECT_EQ(error_of<c10::ValueError>([&] { ts::open(text, options); }),
            "torch_shards::open: storage options are for URLs, " + text + " is a local path");
}

}  // namespace
