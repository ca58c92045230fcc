// Data-parallel training in pure C++: a TorchScript model (make_model.py)
// trained with torch::optim on an .h5ad read through torch_shards, one
// process per rank, gradients averaged over a gloo process group made from a
// c10d FileStore. Every rank reads its own share of every epoch exactly once.
//
//   train --data cells.h5ad --model model.pt --rank 0 --world-size 2 --store /tmp/store [--epochs 2]
//
// Each rank prints its steps and, with --rows-out, writes the rows it read
// (one line per epoch) so a check can confirm the shares are disjoint.
#include <torch/script.h>
#include <torch/torch.h>
#include <torch_shards/torch_shards.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace {

std::map<std::string, std::string> parse(int argc, char** argv) {
  std::map<std::string, std::string> args{
      {"--epochs", "2"}, {"--batch-size", "32"}, {"--label", "cell_type"}, {"--lr", "0.05"}};
  for (int i = 1; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  for (const char* required : {"--data", "--model", "--rank", "--world-size", "--store"}) {
    if (!args.count(required)) {
      std::cerr << "usage: train --data cells.h5ad --model model.pt --rank R --world-size W --store FILE "
                   "[--epochs 2] [--batch-size 32] [--label cell_type] [--rows-out FILE]\n";
      std::exit(2);
    }
  }
  return args;
}

// A gloo process group over a FileStore every rank can reach.
c10::intrusive_ptr<c10d::ProcessGroup> gloo_group(const std::string& store_path, int rank, int world_size) {
  auto store = c10::make_intrusive<c10d::FileStore>(store_path, world_size);
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, options);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world_size);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  return group;
}

}  // namespace

int main(int argc, char** argv) {
  const auto args = parse(argc, argv);
  const int rank = std::stoi(args.at("--rank")), world_size = std::stoi(args.at("--world-size"));
  const std::string label = args.at("--label");
  auto group = gloo_group(args.at("--store"), rank, world_size);

  // Rank and world size come from the group; the seed is rank 0's, and the
  // ranks check over the group that they read the same data.
  torch_shards::AnnDataSource source(args.at("--data"), {.obs = {label}, .dense = true});
  torch_shards::ShardedDataset dataset(source, torch_shards::BlockShuffling(16),
                                       {.batch_size = std::stoi(args.at("--batch-size")), .process_group = group});

  torch::jit::Module model = torch::jit::load(args.at("--model"));
  model.train();
  std::vector<at::Tensor> parameters;
  for (const auto& parameter : model.parameters()) parameters.push_back(parameter);
  torch::optim::SGD optimizer(parameters, torch::optim::SGDOptions(std::stod(args.at("--lr"))));

  std::ofstream rows_out;
  if (args.count("--rows-out")) rows_out.open(args.at("--rows-out"));
  for (int epoch = 0; epoch < std::stoi(args.at("--epochs")); ++epoch) {
    int64_t steps = 0, rows = 0;
    double total_loss = 0;
    for (const auto& batch : dataset) {  // every loop is the next epoch
      const at::Tensor logits = model.forward({batch.at("X")}).toTensor();
      const at::Tensor loss = torch::nn::functional::cross_entropy(logits, batch.at(label));
      optimizer.zero_grad();
      loss.backward();
      for (auto& parameter : parameters) {  // average the gradients over the ranks
        std::vector<at::Tensor> gradient{parameter.grad()};
        group->allreduce(gradient)->wait();
        parameter.grad().div_(world_size);
      }
      optimizer.step();
      total_loss += loss.item<double>();
      ++steps;
      const at::Tensor index = batch.at("index");
      rows += index.numel();
      if (rows_out) {
        for (int64_t i = 0; i < index.numel(); ++i) rows_out << index[i].item<int64_t>() << ' ';
      }
    }
    if (rows_out) rows_out << '\n';
    std::cout << "[rank " << rank << "/" << world_size << "] epoch " << dataset->epoch() << ": " << steps << " steps, "
              << rows << " rows, loss " << total_loss / static_cast<double>(steps) << std::endl;
  }
  return 0;
}
