#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <torch_shards/strategy.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include <torch_shards/source.h>
#include "core/epoch_layout.h"
#include "core/errors.h"
#include "core/strategy.h"
#include "loader/errors.h"
#include "loader/sources/labels.h"

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

double real(const c10::Dict<std::string, at::Tensor>& tensors, const char* key, double otherwise) {
  return tensors.contains(key) ? tensors.at(key).item<double>() : otherwise;
}

std::optional<std::string> text(const c10::Dict<std::string, std::string>& strings, const char* key) {
  return strings.contains(key) ? std::optional<std::string>(strings.at(key)) : std::nullopt;
}

// The one place a core strategy is made, from what the user gave (or what was pickled). Null for
// a strategy that still has to read something from a dataset's source (label_key).
std::shared_ptr<const core::Strategy> make_core_strategy(const StrategyState& state) {
  const auto& [kind, ints, tensors, strings] = state;
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
    TORCH_CHECK_VALUE(tensors.contains("labels") != strings.contains("label_key"), kind,
                      ": pass labels or label_key (a column of the dataset's source), not both and not neither");
    if (!tensors.contains("labels")) return nullptr;  // labels read when a dataset is made (resolved_for)
    return std::make_shared<core::ClassBalancedSampling>(
        to_int64_vector(tensor_of(tensors, kind, "labels"), kind + ": labels"), optional_integer(ints, "total_size"),
        integer(ints, kind, "block_size"), indices_of(tensors, kind), real(tensors, "smoothing", 0.0));
  }
  if (kind == "CustomStrategy") {
    std::optional<std::vector<int64_t>> fixed;
    if (tensors.contains("plan")) fixed = to_int64_vector(tensors.at("plan"), kind + ": plan");
    TORCH_CHECK_VALUE(fixed || ints.contains("size"), kind, ": pass a plan or the size of the plans provided");
    return std::make_shared<core::CustomStrategy>(std::move(fixed), optional_integer(ints, "size").value_or(0),
                                                  integer(ints, kind, "shuffle") != 0,
                                                  text(strings, "description").value_or(""));
  }
  TORCH_CHECK_VALUE(false, "unknown strategy kind '", kind,
                    "' (expected Streaming, BlockShuffling, BlockWeightedSampling, ClassBalancedSampling or "
                    "CustomStrategy)");
}

// Tensors are kept as given (contiguous CPU copies), so a pickled strategy
// holds exactly what was passed.
void put_tensor(c10::Dict<std::string, at::Tensor>& tensors, const char* key, const at::Tensor& value) {
  tensors.insert(key, value.detach().to(at::kCPU).contiguous());
}

c10::intrusive_ptr<StrategyImpl> make(std::string kind, c10::Dict<std::string, int64_t> ints,
                                      c10::Dict<std::string, at::Tensor> tensors,
                                      const std::optional<at::Tensor>& indices,
                                      c10::Dict<std::string, std::string> strings) {
  if (indices) put_tensor(tensors, "indices", *indices);
  return c10::make_intrusive<StrategyImpl>(
      StrategyState{std::move(kind), std::move(ints), std::move(tensors), std::move(strings)});
}

}  // namespace

StrategyImpl::StrategyImpl(StrategyState state) : state_(std::move(state)) {
  strategy_ = translate_errors([&] { return make_core_strategy(state_); });
}

c10::intrusive_ptr<StrategyImpl> StrategyImpl::streaming(bool shuffle, const std::optional<at::Tensor>& indices) {
  c10::Dict<std::string, int64_t> ints;
  ints.insert("shuffle", shuffle);
  return make("Streaming", ints, c10::Dict<std::string, at::Tensor>(), indices, c10::Dict<std::string, std::string>());
}

c10::intrusive_ptr<StrategyImpl> StrategyImpl::block_shuffling(int64_t block_size,
                                                               const std::optional<at::Tensor>& indices) {
  c10::Dict<std::string, int64_t> ints;
  ints.insert("block_size", block_size);
  return make("BlockShuffling", ints, c10::Dict<std::string, at::Tensor>(), indices,
              c10::Dict<std::string, std::string>());
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
  return make("BlockWeightedSampling", ints, tensors, indices, c10::Dict<std::string, std::string>());
}

c10::intrusive_ptr<StrategyImpl> StrategyImpl::class_balanced_sampling(
    const std::optional<at::Tensor>& labels, std::optional<int64_t> total_size, int64_t block_size,
    const std::optional<at::Tensor>& indices, double smoothing, const std::optional<std::string>& label_key) {
  c10::Dict<std::string, int64_t> ints;
  if (total_size) ints.insert("total_size", *total_size);
  ints.insert("block_size", block_size);
  c10::Dict<std::string, at::Tensor> tensors;
  if (labels) put_tensor(tensors, "labels", *labels);
  if (smoothing != 0.0) tensors.insert("smoothing", at::full({}, smoothing, at::TensorOptions().dtype(at::kDouble)));
  c10::Dict<std::string, std::string> strings;
  if (label_key) strings.insert("label_key", *label_key);
  return make("ClassBalancedSampling", ints, tensors, indices, strings);
}

c10::intrusive_ptr<StrategyImpl> StrategyImpl::custom_strategy(const std::optional<at::Tensor>& plan,
                                                               std::optional<int64_t> size, bool shuffle,
                                                               const std::string& description) {
  c10::Dict<std::string, int64_t> ints;
  if (size) ints.insert("size", *size);
  ints.insert("shuffle", shuffle);
  c10::Dict<std::string, at::Tensor> tensors;
  if (plan) put_tensor(tensors, "plan", *plan);
  c10::Dict<std::string, std::string> strings;
  strings.insert("description", description);
  return make("CustomStrategy", ints, tensors, std::nullopt, strings);
}

std::string StrategyImpl::describe() const {
  if (strategy_) return strategy_->describe();
  const auto& [kind, ints, tensors, strings] = state_;
  return core::concat(kind, "(label_key='", strings.at("label_key"),
                      "', total_size=", ints.contains("total_size") ? std::to_string(ints.at("total_size")) : "None",
                      ", block_size=", ints.at("block_size"),
                      ", indices=", tensors.contains("indices") ? "<...>" : "None",
                      ", smoothing=", real(tensors, "smoothing", 0.0), ")");
}

c10::intrusive_ptr<StrategyImpl> StrategyImpl::resolved_for(const SourceImpl& source) const {
  if (strategy_) return c10::intrusive_ptr<StrategyImpl>::reclaim_copy(const_cast<StrategyImpl*>(this));
  auto [kind, ints, tensors, strings] = state_;
  const sources::Labels labels =
      translate_errors([&] { return sources::read_labels(*source.get(), strings.at("label_key")); });
  c10::Dict<std::string, at::Tensor> with_labels = tensors.copy();
  with_labels.insert("labels", labels.codes);
  c10::Dict<std::string, std::string> without_key = strings.copy();
  (void)without_key.erase("label_key");
  return c10::make_intrusive<StrategyImpl>(StrategyState{kind, ints, with_labels, without_key});
}

void StrategyImpl::provide(int64_t epoch, const at::Tensor& rows, int64_t num_rows) const {
  const auto* custom = dynamic_cast<const core::CustomStrategy*>(strategy_.get());
  TORCH_CHECK_VALUE(custom != nullptr, kind(), ": only a CustomStrategy takes plans per epoch");
  std::vector<int64_t> values = to_int64_vector(rows, "CustomStrategy: the plan of an epoch");
  translate_errors([&] { custom->provide(epoch, std::move(values), num_rows); });
}

std::shared_ptr<const core::SamplingPlan> StrategyImpl::bind(int64_t num_rows) const {
  TORCH_CHECK_VALUE(strategy_, kind(), "(label_key=...) reads its labels from a dataset's source: give it to a ",
                    "ShardedDataset (or pass labels=)");
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
  TORCH_CHECK_VALUE(epoch >= 0 && epoch <= core::kMaxEpoch, "epoch must be in [0, 2**62], got ", epoch);
  at::Tensor out = at::empty({bound->size()}, at::TensorOptions().dtype(at::kLong));
  bound->fill(static_cast<uint64_t>(seed), epoch, 0, bound->size(), out.data_ptr<int64_t>());
  return out;
}

at::Tensor StrategyImpl::strided(int64_t num_rows, int64_t seed, int64_t epoch, int64_t start, int64_t step,
                                 int64_t count) const {
  TORCH_CHECK_VALUE(start >= 0 && step >= 1 && count >= 0, "strided: need start >= 0, step >= 1, count >= 0, got ",
                    start, ", ", step, ", ", count);
  TORCH_CHECK_VALUE(epoch >= 0 && epoch <= core::kMaxEpoch, "epoch must be in [0, 2**62], got ", epoch);
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
    : Strategy(StrategyImpl::class_balanced_sampling(labels, options.total_size, options.block_size, options.indices,
                                                     options.smoothing, std::nullopt)) {}

ClassBalancedSampling::ClassBalancedSampling(const std::string& label_key, const ClassBalancedSamplingOptions& options)
    : Strategy(StrategyImpl::class_balanced_sampling(std::nullopt, options.total_size, options.block_size,
                                                     options.indices, options.smoothing, label_key)) {}

CustomStrategy::CustomStrategy(const at::Tensor& plan, bool shuffle)
    : Strategy(StrategyImpl::custom_strategy(plan, std::nullopt, shuffle, "")) {}

}  // namespace torch_shards
