#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "classes.h"

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
                                                       const ReaderOptions& options) const {
  return c10::make_intrusive<EpochReader>(source_, planner_, seed_, epoch, rank_, worker, num_workers, options);
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
