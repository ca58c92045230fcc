// The torch_shards C++ API: sources, strategies, ShardedDataset and
// DistributedSampler, the same native objects Python and TorchScript use
// (torch.classes.torch_shards.*).
//
//   find_package(TorchShards REQUIRED)
//   target_link_libraries(app TorchShards::torch_shards)
#pragma once

#include <torch_shards/dataset.h>
#include <torch_shards/export.h>
#include <torch_shards/open.h>
#include <torch_shards/sampler.h>
#include <torch_shards/source.h>
#include <torch_shards/strategy.h>
#include <torch_shards/version.h>

// A reference from every program that includes this header, so the library
// (and with it the registration of torch.classes.torch_shards.*) is loaded
// even when the program is linked with --as-needed and only uses the classes
// through TorchScript (torch::jit::load). Weak: one copy however many files
// include it.
__attribute__((weak, used)) const char* (*torch_shards_keep_library_loaded)() = &torch_shards::version;
