#include "core/epoch_layout.h"

#include <algorithm>
#include <limits>

#include "core/errors.h"

namespace torch_shards::core {

EvenBatches parse_even_batches(const std::string& value) {
  if (value == "pad") return EvenBatches::kPad;
  if (value == "drop") return EvenBatches::kDrop;
  if (value == "none") return EvenBatches::kNone;
  throw InvalidArgument(concat("even_batches must be 'pad', 'drop' or None, got '", value, "'"));
}

const char* to_string(EvenBatches value) {
  switch (value) {
    case EvenBatches::kPad:
      return "pad";
    case EvenBatches::kDrop:
      return "drop";
    case EvenBatches::kNone:
      return "none";
  }
  return "?";
}

void check_loader_options(const LoaderOptions& options, int64_t world_size) {
  check_argument(options.batch_size >= 1, "batch_size must be >= 1, got ", options.batch_size);
  check_argument(options.fetch_factor >= 1, "fetch_factor must be >= 1, got ", options.fetch_factor);
  // Fetches are shuffled with 32-bit bounded draws.
  check_argument(options.batch_size <= std::numeric_limits<int32_t>::max() / options.fetch_factor,
                 "batch_size * fetch_factor must be < 2**31, got ", options.batch_size, " * ", options.fetch_factor);
  check_argument(world_size >= 1 && world_size <= kMaxWorldSize, "world_size must be in [1, 2**20], got ", world_size);
}

EpochLayout::EpochLayout(int64_t plan_size, const LoaderOptions& options, int64_t world_size)
    : plan_size_(plan_size), options_(options), world_size_(world_size) {
  check_loader_options(options, world_size);
  check_argument(plan_size >= 1, "the plan must have at least one entry, got ", plan_size);
  fetch_size_ = options.batch_size * options.fetch_factor;
  num_full_fetches_ = plan_size / fetch_size_;
  num_fetches_ = (plan_size + fetch_size_ - 1) / fetch_size_;
  const int64_t rest = plan_size % fetch_size_;
  const int64_t last_fetch_batches =
      options.drop_last ? rest / options.batch_size : (rest + options.batch_size - 1) / options.batch_size;
  num_global_batches_ = num_full_fetches_ * options.fetch_factor + last_fetch_batches;
  rounds_ = num_full_fetches_ / world_size_;
  tail_batches_ = num_global_batches_ - rounds_ * world_size_ * options.fetch_factor;
}

int64_t EpochLayout::fetch_rows(int64_t fetch) const { return std::min(fetch_size_, plan_size_ - fetch * fetch_size_); }

int64_t EpochLayout::fetch_batches(int64_t fetch) const {
  if (fetch < num_full_fetches_) return options_.fetch_factor;
  const int64_t rows = fetch_rows(fetch);
  return options_.drop_last ? rows / options_.batch_size : (rows + options_.batch_size - 1) / options_.batch_size;
}

int64_t EpochLayout::batch_rows(int64_t fetch, int64_t batch) const {
  return std::min(options_.batch_size, fetch_rows(fetch) - batch * options_.batch_size);
}

int64_t EpochLayout::rank_tail_units(int64_t rank) const {
  switch (options_.even_batches) {
    case EvenBatches::kPad:
      return (tail_batches_ + world_size_ - 1) / world_size_;
    case EvenBatches::kDrop:
      return tail_batches_ / world_size_;
    case EvenBatches::kNone:
      return rank < tail_batches_ ? (tail_batches_ - rank + world_size_ - 1) / world_size_ : 0;
  }
  return 0;
}

int64_t EpochLayout::rank_batches(int64_t rank) const {
  return rounds_ * options_.fetch_factor + rank_tail_units(rank);
}

int64_t EpochLayout::rank_units(int64_t rank) const { return rounds_ + rank_tail_units(rank); }

WorkUnit EpochLayout::rank_unit(int64_t rank, int64_t unit) const {
  WorkUnit out;
  if (unit < rounds_) {
    out.fetch = unit * world_size_ + rank;
    out.first_batch = 0;
    out.num_batches = options_.fetch_factor;
    return out;
  }
  // Tail position p of the round-robin; positions past the last tail batch
  // (only with even_batches="pad") wrap around to the first ones.
  const int64_t position = rank + (unit - rounds_) * world_size_;
  const int64_t batch = position % tail_batches_;
  out.fetch = rounds_ * world_size_ + batch / options_.fetch_factor;
  out.first_batch = batch % options_.fetch_factor;
  out.num_batches = 1;
  out.padding = position >= tail_batches_;
  return out;
}

int64_t EpochLayout::worker_batches(int64_t rank, int64_t worker, int64_t num_workers) const {
  const int64_t units = worker_units(rank, worker, num_workers);
  // Units w, w+K, ... below rounds_ are whole fetches; the rest single batches.
  const int64_t whole = worker < rounds_ ? std::min(units, (rounds_ - worker + num_workers - 1) / num_workers) : 0;
  return whole * options_.fetch_factor + (units - whole);
}

}  // namespace torch_shards::core
