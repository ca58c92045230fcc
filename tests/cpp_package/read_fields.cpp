// Reads one epoch of an AnnData file, or of an annbatch collection, through a
// ShardedDataset whose AnnData sources read the fields and obs columns named
// on the command line (the C++ options: .obs and .fields), and prints every
// row of every field, one line each: "<index> <field> <values...>" (CSR rows
// densified, values as doubles).
//
//   read_fields cells.h5ad cell_type counts=layers/counts pca=obsm/X_pca
#include <ATen/ATen.h>
#include <torch_shards/torch_shards.h>

#include <iomanip>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: read_fields PATH [OBS_COLUMN | FIELD=ELEMENT]...\n";
    return 2;
  }
  const std::string path = argv[1];
  torch_shards::AnnDataSourceOptions options;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t equals = arg.find('=');
    if (equals == std::string::npos) {
      options.obs.push_back(arg);
    } else {
      options.fields.emplace_back(arg.substr(0, equals), arg.substr(equals + 1));
    }
  }
  try {
    const torch_shards::Source source = torch_shards::annbatch_datasets(path)
                                            ? torch_shards::Source(torch_shards::AnnbatchCollection(path, options))
                                            : torch_shards::Source(torch_shards::AnnDataSource(path, options));
    torch_shards::ShardedDataset dataset(source, torch_shards::BlockShuffling(3), {.batch_size = 5, .seed = 1});
    std::cout << std::setprecision(17);
    for (const auto& batch : dataset) {
      const at::Tensor index = batch.at("index");
      for (const auto& item : batch) {
        if (item.key() == "index") continue;
        at::Tensor values = item.value();
        if (values.layout() == at::kSparseCsr) values = values.to_dense();
        values = values.to(at::kDouble).reshape({values.size(0), -1}).contiguous();
        for (int64_t row = 0; row < values.size(0); ++row) {
          std::cout << index[row].item<int64_t>() << ' ' << item.key();
          for (int64_t k = 0; k < values.size(1); ++k) std::cout << ' ' << values[row][k].item<double>();
          std::cout << '\n';
        }
      }
    }
  } catch (const c10::Error& error) {
    std::cerr << error.msg() << '\n';
    return 1;
  }
  return 0;
}
