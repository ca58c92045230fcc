#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "classes.h"

#include <ATen/ops/_sparse_csr_tensor_unsafe.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "../core/errors.h"
#include "anndata_source.h"
#include "process_group.h"

namespace torch_shards {
namespace {

std::mutex binding_mutex;

at::Tensor to_tensor(const std::vector<int64_t>& values) {
  at::Tensor out = at::empty({static_cast<int64_t>(values.size())}, at::TensorOptions().dtype(at::kLong));
  if (!values.empty()) std::memcpy(out.data_ptr<int64_t>(), values.data(), values.size() * sizeof(int64_t));
  return out;
}

}  // namespace

std::shared_ptr<const core::SamplingPlan> Strategy::bound(int64_t num_rows) const {
  std::lock_guard<std::mutex> lock(binding_mutex);
  if (bound_rows_ != num_rows || !bound_) {
    bound_ = strategy_->bind(num_rows);
    bound_rows_ = num_rows;
  }
  return bound_;
}

int64_t Strategy::plan_size(int64_t num_rows) const { return bound(num_rows)->size(); }

at::Tensor Strategy::plan(int64_t num_rows, int64_t seed, int64_t epoch) const {
  const auto plan = bound(num_rows);
  at::Tensor out = at::empty({plan->size()}, at::TensorOptions().dtype(at::kLong));
  plan->fill(static_cast<uint64_t>(seed), epoch, 0, plan->size(), out.data_ptr<int64_t>());
  return out;
}

at::Tensor Strategy::strided(int64_t num_rows, int64_t seed, int64_t epoch, int64_t start, int64_t step,
                             int64_t count) const {
  core::check_argument(start >= 0 && step >= 1 && count >= 0, "strided: need start >= 0, step >= 1, count >= 0, got ",
                       start, ", ", step, ", ", count);
  const auto plan = bound(num_rows);
  const int64_t size = plan->size();
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
      plan->fill(static_cast<uint64_t>(seed), epoch, window_begin, window_end - window_begin, window.data());
    }
    dst[j] = window[position - window_begin];
  }
  return out;
}

std::vector<std::string> Source::field_specs() const {
  std::vector<std::string> specs;
  for (const auto& field : source_->fields()) specs.push_back(field.describe());
  return specs;
}

sources::Batch Source::read(const at::Tensor& rows, int64_t num_threads) const {
  core::check_argument(rows.dim() == 1 && rows.scalar_type() == at::kLong,
                       "Source.read: rows must be a 1-D int64 tensor");
  const at::Tensor contiguous = rows.contiguous();
  const int64_t* data = contiguous.data_ptr<int64_t>();
  std::vector<int64_t> list(data, data + contiguous.numel());
  for (int64_t row : list) {
    core::check_argument(row >= 0 && row < source_->num_rows(), "Source.read: row ", row, " out of range [0, ",
                         source_->num_rows(), ")");
  }
  core::ThreadPool pool(static_cast<int>(std::max<int64_t>(num_threads, 1) - 1));
  sources::TensorPool tensors;
  sources::ReadContext context{pool, tensors};
  return source_->read(list, context);
}

ShardedDataset::ShardedDataset(c10::intrusive_ptr<Source> source, c10::intrusive_ptr<Strategy> strategy,
                               int64_t batch_size, int64_t fetch_factor, bool drop_last,
                               const std::string& even_batches, int64_t seed, int64_t rank, int64_t world_size)
    : source_(source->get()),
      strategy_description_(strategy->describe()),
      seed_(static_cast<uint64_t>(seed)),
      rank_(rank) {
  options_.batch_size = batch_size;
  options_.fetch_factor = fetch_factor;
  options_.drop_last = drop_last;
  options_.even_batches = core::parse_even_batches(even_batches);
  core::check_loader_options(options_, world_size);
  core::check_argument(rank >= 0 && rank < world_size, "rank must be in [0, world_size=", world_size, "), got ", rank);
  auto plan = strategy->get()->bind(source_->num_rows());
  planner_ = std::make_shared<const core::Planner>(std::move(plan), options_, world_size);
}

std::string ShardedDataset::fingerprint() const {
  const auto& layout = planner_->layout();
  return core::concat("rows: ", source_->num_rows(), "\nsource: ", source_->describe(),
                      "\nstrategy: ", strategy_description_, "\nplan entries: ", layout.plan_size(),
                      "\nbatch_size: ", options_.batch_size, "\nfetch_factor: ", options_.fetch_factor,
                      "\ndrop_last: ", options_.drop_last ? "True" : "False",
                      "\neven_batches: ", core::to_string(options_.even_batches), "\nworld_size: ", layout.world_size(),
                      "\nseed: ", seed_);
}

void ShardedDataset::check_consistency(const std::string& group_name) const {
  check_same_on_all_ranks(fingerprint(), group_name, "ShardedDataset");
}

int64_t ShardedDataset::worker_batches(int64_t worker, int64_t num_workers) const {
  core::check_argument(num_workers >= 1 && worker >= 0 && worker < num_workers,
                       "worker must be in [0, num_workers=", num_workers, "), got ", worker);
  return planner_->layout().worker_batches(rank_, worker, num_workers);
}

at::Tensor ShardedDataset::fetch_rows(int64_t epoch, int64_t fetch) const {
  core::check_argument(fetch >= 0 && fetch < planner_->layout().num_fetches(), "fetch must be in [0, ",
                       planner_->layout().num_fetches(), "), got ", fetch);
  std::vector<int64_t> rows;
  planner_->fetch_rows(seed_, epoch, fetch, rows);
  return to_tensor(rows);
}

std::string ShardedDataset::describe() const {
  const auto& layout = planner_->layout();
  return core::concat("ShardedDataset(source=", source_->describe(), ", strategy=", strategy_description_,
                      ", batch_size=", layout.batch_size(), ", fetch_factor=", options_.fetch_factor,
                      ", even_batches=", core::to_string(options_.even_batches), ", rank=", rank_,
                      ", world_size=", layout.world_size(), ")");
}

c10::intrusive_ptr<EpochReader> ShardedDataset::reader(int64_t epoch, int64_t worker, int64_t num_workers,
                                                       int64_t num_threads) const {
  core::check_argument(epoch >= 0, "epoch must be >= 0, got ", epoch);
  core::check_argument(num_threads >= 1, "num_threads must be >= 1, got ", num_threads);
  return c10::make_intrusive<EpochReader>(source_, planner_, seed_, epoch, rank_, worker, num_workers, num_threads);
}

EpochReader::EpochReader(std::shared_ptr<const sources::Source> source, std::shared_ptr<const core::Planner> planner,
                         uint64_t seed, int64_t epoch, int64_t rank, int64_t worker, int64_t num_workers,
                         int64_t num_threads)
    : source_(std::move(source)),
      cursor_(std::move(planner), seed, epoch, rank, worker, num_workers),
      pool_(static_cast<int>(num_threads - 1)),  // the calling thread reads too
      epoch_(epoch),
      batch_size_(cursor_.planner().layout().batch_size()) {}

std::optional<sources::Batch> EpochReader::next() {
  if (!cursor_.next(unit_, rows_)) return std::nullopt;
  last_padding_ = unit_.padding;
  sources::ReadContext context{pool_, tensors_};
  sources::Batch batch = source_->read(rows_, context);
  at::Tensor index = tensors_.empty({static_cast<int64_t>(rows_.size())}, at::kLong);
  std::memcpy(index.data_ptr<int64_t>(), rows_.data(), rows_.size() * sizeof(int64_t));
  batch.insert("index", index);
  return batch;
}

namespace {

// Rows [begin, begin + count) of a unit's tensor: a view for dense tensors; for
// sparse CSR, views of the columns and values with rebased row offsets.
at::Tensor batch_rows(const at::Tensor& tensor, int64_t begin, int64_t count) {
  if (tensor.layout() != at::kSparseCsr) return tensor.narrow(0, begin, count);
  const at::Tensor offsets = tensor.crow_indices();
  const bool wide = offsets.scalar_type() == at::kLong;
  const int64_t first = wide ? offsets.data_ptr<int64_t>()[begin] : offsets.data_ptr<int32_t>()[begin];
  const int64_t last = wide ? offsets.data_ptr<int64_t>()[begin + count] : offsets.data_ptr<int32_t>()[begin + count];
  return at::_sparse_csr_tensor_unsafe(offsets.narrow(0, begin, count + 1).sub(first),
                                       tensor.col_indices().narrow(0, first, last - first),
                                       tensor.values().narrow(0, first, last - first), {count, tensor.size(1)},
                                       tensor.values().options().layout(at::kSparseCsr));
}

}  // namespace

c10::List<sources::Batch> EpochReader::next_batches() {
  c10::List<sources::Batch> batches;
  const std::optional<sources::Batch> unit = next();
  if (!unit) return batches;
  const int64_t rows = static_cast<int64_t>(rows_.size());
  for (int64_t begin = 0; begin < rows; begin += batch_size_) {
    const int64_t count = std::min(batch_size_, rows - begin);
    sources::Batch batch;
    for (const auto& item : *unit) batch.insert(item.key(), batch_rows(item.value(), begin, count));
    batches.push_back(std::move(batch));
  }
  return batches;
}

std::string AnnData::categories_json(const std::string& column) const {
  const io::ObsColumn found = store_->obs_column(column);
  core::check_argument(found.categorical, store_->root().where(), ": obs column '", column, "' is not categorical");
  return found.categories.dump();
}

c10::intrusive_ptr<Source> AnnData::source(const std::vector<std::string>& obs, const std::optional<std::string>& layer,
                                           bool dense) const {
  return c10::make_intrusive<Source>(std::make_shared<sources::AnnDataSource>(store_, layer, obs, dense));
}

}  // namespace torch_shards
