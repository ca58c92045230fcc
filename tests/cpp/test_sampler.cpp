// DistributedSampler from C++: torch's layout, epochs that advance with every
// loop of a torch::data DataLoader, and the ranks' indices covering the
// dataset exactly once.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <set>
#include <vector>

#include <torch_shards/torch_shards.h>

namespace ts = torch_shards;

namespace {

// A map-style dataset whose example i is the tensor {i}.
class Rows : public torch::data::datasets::Dataset<Rows, torch::data::Example<>> {
 public:
  explicit Rows(size_t size) : size_(size) {}
  torch::data::Example<> get(size_t index) override {
    return {torch::tensor({static_cast<int64_t>(index)}), torch::tensor({0})};
  }
  std::optional<size_t> size() const override { return size_; }

 private:
  size_t size_;
};

std::vector<int64_t> one_epoch(ts::DistributedSampler& sampler) {
  sampler.reset();
  std::vector<int64_t> out;
  while (auto indices = sampler.next(7)) out.insert(out.end(), indices->begin(), indices->end());
  return out;
}

}  // namespace

TEST(Sampler, WithoutShuffleItIsTorchsLayout) {
  ts::DistributedSampler sampler(10, {.num_replicas = 3, .rank = 1, .shuffle = false});
  EXPECT_EQ(one_epoch(sampler), (std::vector<int64_t>{1, 4, 7, 0}));  // padded by wrapping around
  EXPECT_EQ(sampler.size(), 4u);
  ts::DistributedSampler dropping(10, {.num_replicas = 3, .rank = 2, .shuffle = false, .drop_last = true});
  EXPECT_EQ(one_epoch(dropping), (std::vector<int64_t>{2, 5, 8}));
}

TEST(Sampler, RanksCoverEveryIndexOnceAndEpochsAdvance) {
  std::vector<std::vector<int64_t>> epochs(2);
  for (int64_t rank = 0; rank < 4; ++rank) {
    ts::DistributedSampler sampler(101, {.num_replicas = 4, .rank = rank, .seed = 3, .drop_last = true});
    for (auto& epoch : epochs) {
      const auto indices = one_epoch(sampler);
      epoch.insert(epoch.end(), indices.begin(), indices.end());
    }
    EXPECT_EQ(sampler.epoch(), 1);
  }
  for (auto& epoch : epochs) {
    EXPECT_EQ(epoch.size(), 100u);
    EXPECT_EQ(std::set<int64_t>(epoch.begin(), epoch.end()).size(), 100u);  // no repeats across ranks
  }
  EXPECT_NE(epochs[0], epochs[1]);
}

TEST(Sampler, DrivesATorchDataLoader) {
  Rows rows(50);
  auto loader = torch::data::make_data_loader(rows.map(torch::data::transforms::Stack<>()),
                                              ts::DistributedSampler(50, {.num_replicas = 2, .rank = 0, .seed = 1}),
                                              torch::data::DataLoaderOptions(8));
  std::vector<std::vector<int64_t>> epochs;
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> seen;
    for (const auto& batch : *loader) {
      const at::Tensor data = batch.data.flatten();
      seen.insert(seen.end(), data.data_ptr<int64_t>(), data.data_ptr<int64_t>() + data.numel());
    }
    EXPECT_EQ(seen.size(), 25u);
    epochs.push_back(seen);
  }
  EXPECT_NE(epochs[0], epochs[1]);  // a new order every loop, no set_epoch needed
}

TEST(Sampler, AnyStrategyIsPartitioned) {
  const at::Tensor labels = torch::arange(60, torch::kLong).remainder(3);
  std::vector<int64_t> all;
  for (int64_t rank = 0; rank < 3; ++rank) {
    ts::DistributedSampler sampler(
        60, {.num_replicas = 3, .rank = rank, .strategy = ts::ClassBalancedSampling(labels, {.total_size = 90})});
    const auto indices = one_epoch(sampler);
    EXPECT_EQ(indices.size(), 30u);
    all.insert(all.end(), indices.begin(), indices.end());
  }
  EXPECT_EQ(all.size(), 90u);
  EXPECT_TRUE(std::all_of(all.begin(), all.end(), [](int64_t i) { return i >= 0 && i < 60; }));
}

TEST(Sampler, SavesAndLoadsItsPositionInAnArchive) {
  ts::DistributedSampler reference(30, {.num_replicas = 1, .rank = 0, .seed = 4});
  const auto first = one_epoch(reference), second = one_epoch(reference);
  const auto archived = [](const ts::DistributedSampler& sampler) {
    torch::serialize::OutputArchive archive;
    sampler.save(archive);
    std::stringstream stream;
    archive.save_to(stream);
    ts::DistributedSampler restored(30, {.num_replicas = 1, .rank = 0, .seed = 4});
    torch::serialize::InputArchive input;
    input.load_from(stream);
    restored.load(input);
    return restored;
  };
  // Mid-epoch: the rest of the epoch, then the next one.
  ts::DistributedSampler sampler(30, {.num_replicas = 1, .rank = 0, .seed = 4});
  sampler.reset();
  std::vector<int64_t> taken;
  for (int i = 0; i < 2; ++i) {
    const auto indices = sampler.next(7);
    taken.insert(taken.end(), indices->begin(), indices->end());
  }
  auto restored = archived(sampler);
  const auto rest = one_epoch(restored);
  taken.insert(taken.end(), rest.begin(), rest.end());
  EXPECT_EQ(taken, first);
  EXPECT_EQ(one_epoch(restored), second);
  // After a finished epoch: the next one.
  auto after = archived(restored);
  EXPECT_EQ(one_epoch(after), one_epoch(reference));
}

TEST(Sampler, BadArgumentsThrowValueErrors) {
  EXPECT_THROW(ts::DistributedSampler(10, {.num_replicas = 2, .rank = 2}), c10::ValueError);
  EXPECT_THROW(ts::DistributedSampler(0, {.num_replicas = 1, .rank = 0, .strategy = ts::BlockShuffling(2)}),
               c10::ValueError);
  // An empty dataset yields nothing, as torch's sampler does.
  ts::DistributedSampler empty(0, {.num_replicas = 2, .rank = 1});
  EXPECT_FALSE(empty.next(4).has_value());
}
