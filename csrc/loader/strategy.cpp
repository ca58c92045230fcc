#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "torch_shards/strategy.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/errors.h"
#include "core/strategy.h"
#include "loader/errors.h"

namespace torch_shards {
namespace {

std::vector<int64_t> to_int64_vector(const at::Tensor& tensor, const std::string& what) {
  TORCH_CHECK_VALUE(tensor.dim() == 1, what, " must be 1-D, got shape ", tensor.sizes());
  TORCH_CHECK_VALUE(!at::isFloatingType(tensor.scalar_type()) && !at::isComplexType(tensor.scalar_type()) &&
                        tensor.scalar_type() != at::kBool,
                    what, " must be an integer tensor, got ", tensor.scalar_type());
  const at::Tensor values = tensor.to(at::kCPU, at::kLong).contiguous();
  const int64_t* data = values.data_ptr<int64_t>();
  return std::vector<int64_t>(data, data + values.numel());
}

std::vector<double> to_double_vector(const at::Tensor& tensor, const std::string& what) {
  TORCH_CHECK_VALUE(tensor.dim() == 1, what, " must be 1-D, got shape ", tensor.sizes());
  TORCH_CHECK_VALUE(!at::isComplexType(tensor.scalar_type()), what, " must be real, got ", tensor.scalar_type());
  const at::Tensor values = tensor.to(at::kCPU, at::kDouble).contiguous();
  const double* data = values.data_ptr<double>();
  return std::vector<double>(data, data + values.numel());
}

int64_t integer(const c10::Dict<std::string, int64_t>& ints, const std::string& kind, const char* key) {
  TORCH_CHECK_VALUE(ints.contains(key), kind, ": parameter '", key, "' is missing");
  return ints.at(key);
}

std::optional<int64_t> optional_integer(const c10::Dict<std::string, int64_t>& ints, const char* key) {
  return ints.contains(key) ? std::optional<int64_t>(ints.at(key)) : std::nullopt;
}

std::optional<std::vector<int64_t>> indices_of(const c10::Dict<std::string, at::Tensor>& tensors,
                                               const std::string& kind) {
  if (!tensors.contains("indices")) return std::nullopt;
  return to_int64_vector(tensors.at("indices"), kind + ": indices");
}

at::Tensor tensor_of(const c10::Dict<std::string, at::Tensor>& tensors, const std::string& kind, const char* key) {
  TORCH_CHECK_VALUE(tensors.contains(key), kind, ": tensor '", key, "' is missing");
  return tensors.at(key);
}

// The one place a core strategy is made, from what the user gave (or what was pickled).
std::shared_ptr<const core::Strategy> make_core_strategy(const StrategyState& state) {
  const auto& [kind, ints, tensors] = state;
  if (kind == "Streaming") {
    return std::make_shared<core::Streaming>(integer(ints, kind, "shuffle") != 0, indices_of(tensors, kind));
  }
  if (kind == "BlockShuffling") {
    return std::make_shared<core::BlockShuffling>(integer(ints, kind, "block_size"), indices_of(tensors, kind));
  }
  if (kind == "BlockWeightedSampling") {
    return std::make_shared<core::BlockWeightedSampling>(
        to_double_vector(tensor_of(tensors, kind, "weights"), kind + ": weights"), optional_integer(ints, "total_size"),
        integer(ints, kind, "block_size"), indices_of(tensors, kind), integer(ints, kind, "replacement") != 0);
  }
  if (kind == "ClassBalancedSampling") {
    return std::make_shared<core::ClassBalancedSampling>(
        to_int64_vector(tensor_of(tensors, kind, "labels"), kind + ": labels"), optional_integer(ints, "total_size"),
        integer(ints, kind, "block_size"), indices_of(tensors, kind));
  }
  TORCH_CHECK_VALUE(false, "unknown strategy kind '", kind,
                    "' (expected Streaming, BlockShuffling, BlockWeightedSampling or ClassBalancedSampling)");
}

// Tensors are kept as given (contiguous CPU copies), so a pickled strategy
// holds exactly what was passed.
void put_tensor(c10::Dict<std::string, at::Tensor>& tensors, const char* key, const at::Tensor& value) {
  tensors.insert(key, value.detach().to(at::kCPU).contiguous());
}

c10::intrusive_ptr<StrategyImpl> make(std::string kind, c10::Dict<std::string, int64_t> ints,
                                      c10::Dict<std::string, at::Tensor> tensors,
                                      const std::optional<at::Tensor>& indices) {
  if (indices) put_tensor(tensors, "indices", *indices);
  return c10::make_intrusive<StrategyImpl>(StrategyState{std::move(kind), std::move(ints), std::move(tensors)});
}

}  // namespace

StrategyImpl::StrategyImpl(StrategyState state) : state_(std::move(state)) {
  strategy_ = translate_errors([&] { return make_core_strategy(state_); });
}

c10::intrusive_ptr<StrategyImpl> StrategyImpl::streaming(bool shuffle, const std::optional<at::Tensor>& indices) {
  c10::Dict<std::string, int64_t> ints;
  ints.insert("shuffle", shuffle);
  return make("Streaming", ints, c10::Dict<std::string, at::Tensor>(), indices);
}

c10::intrusive_ptr<StrategyImpl> StrategyImpl::block_shuffling(int64_t block_size,
                                                               const std::optional<at::Tensor>& indices) {
  c10::Dict<std::string, int64_t> ints;
  ints.insert("block_size", block_size);
  return make("BlockShuffling", ints, c10::Dict<std::string, at::Tensor>(), indices);
}

c10::intrusive_ptr<StrategyImpl> StrategyImpl::block_weighted_sampling(const at::Tensor& weights,
                                                                       std::optional<int64_t> total_size,
                                                                       int64_t block_size,
                                                                       const std::optional<at::Tensor>& indices,
                                                                       bool replacement) {
  c10::Dict<std::string, int64_t> ints;
  if (total_size) ints.insert("total_size", *total_size);
  ints.insert("block_size", block_size);
  ints.insert("replacement", replacement);
  c10::Dict<std::string, at::Tensor> tensors;
  put_tensor(tensors, "weights", weights);
  return make("BlockWeightedSampling", ints, tensors, indices);
}

c10::intrusive_ptr<StrategyImpl> StrategyImpl::class_balanced_sampling(const at::Tensor& labels,
                                                                       std::optional<int64_t> total_size,
                                                                       int64_t block_size,
                                                                       const std::optional<at::Tensor>& indices) {
  c10::Dict<std::string, int64_t> ints;
  if (total_size) ints.insert("total_size", *total_size);
  ints.insert("block_size", block_size);
  c10::Dict<std::string, at::Tensor> tensors;
  put_tensor(tensors, "labels", labels);
  return make("ClassBalancedSampling", ints, tensors, indices);
}

std::string StrategyImpl::describe() const { return strategy_->describe(); }

std::shared_ptr<const core::SamplingPlan> StrategyImpl::bind(int64_t num_rows) const {
  return translate_errors([&] {
    std::lock_guard<std::mutex> lock(binding_mutex_);
    if (bound_rows_ != num_rows || !bound_) {
      bound_ = strategy_->bind(num_rows);
      bound_rows_ = num_rows;
    }
    return bound_;
  });
}

int64_t StrategyImpl::plan_size(int64_t num_rows) const { return bind(num_rows)->size(); }

at::Tensor StrategyImpl::plan(int64_t num_rows, int64_t seed, int64_t epoch) const {
  const auto bound = bind(num_rows);
  TORCH_CHECK_VALUE(epoch >= 0, "epoch must be >= 0, got ", epoch);
  at::Tensor out = at::empty({bound->size()}, at::TensorOptions().dtype(at::kLong));
  bound->fill(static_cast<uint64_t>(seed), epoch, 0, bound->size(), out.data_ptr<int64_t>());
  return out;
}

at::Tensor StrategyImpl::strided(int64_t num_rows, int64_t seed, int64_t epoch, int64_t start, int64_t step,
                                 int64_t count) const {
  TORCH_CHECK_VALUE(start >= 0 && step >= 1 && count >= 0, "strided: need start >= 0, step >= 1, count >= 0, got ",
                    start, ", ", step, ", ", count);
  TORCH_CHECK_VALUE(epoch >= 0, "epoch must be >= 0, got ", epoch);
  const auto bound = bind(num_rows);
  const int64_t size = bound->size();
  at::Tensor out = at::empty({count}, at::TensorOptions().dtype(at::kLong));
  int64_t* dst = out.data_ptr<int64_t>();
  // Evaluate the plan in contiguous windows and keep every step-th entry;
  // positions past the end wrap around (DistributedSampler's padding).
  constexpr int64_t kWindow = 1 << 16;
  std::vector<int64_t> window;
  int64_t window_begin = -1, window_end = -1;
  for (int64_t j = 0; j < count; ++j) {
    const int64_t position = (start + j * step) % size;
    if (position < window_begin || position >= window_end) {
      window_begin = position;
      window_end = std::min(size, position + std::max(kWindow, step));
      window.resize(static_cast<size_t>(window_end - window_begin));
      bound->fill(static_cast<uint64_t>(seed), epoch, window_begin, window_end - window_begin, window.data());
    }
    dst[j] = window[position - window_begin];
  }
  return out;
}

Streaming::Streaming(bool shuffle, const std::optional<at::Tensor>& indices)
    : Strategy(StrategyImpl::streaming(shuffle, indices)) {}

BlockShuffling::BlockShuffling(int64_t block_size, const std::optional<at::Tensor>& indices)
    : Strategy(StrategyImpl::block_shuffling(block_size, indices)) {}

BlockWeightedSampling::BlockWeightedSampling(const at::Tensor& weights, const BlockWeightedSamplingOptions& options)
    : Strategy(StrategyImpl::block_weighted_sampling(weights, options.total_size, options.block_size, options.indices,
                                                     options.replacement)) {}

ClassBalancedSampling::ClassBalancedSampling(const at::Tensor& labels, const ClassBalancedSamplingOptions& options)
    : Strategy(StrategyImpl::class_balanced_sampling(labels, options.total_size, options.block_size, options.indices)) {
}

}  // namespace torch_shards
