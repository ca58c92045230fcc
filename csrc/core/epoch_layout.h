// Who delivers which batch: the arithmetic of DESIGN.md's distribution
// contract, evaluated in O(1) per question with no per-rank arrays.
//
// The plan P (L entries) is cut into fetches of F = batch_size * fetch_factor
// entries; each fetch into batches of batch_size (the global batches). Whole
// fetches go round-robin to ranks while a full round of W complete fetches
// remains (R rounds); the T batches of the remaining fetches go round-robin to
// ranks one at a time, then even_batches pads or drops so every rank steps
// equally often. A rank's units (its whole fetches, then its tail batches) go
// round-robin to its K workers.
#pragma once

#include <cstdint>
#include <string>

#include "core/dealing.h"

namespace torch_shards::core {

// Bounds that keep the counts of layouts, samplers and resume states within
// int64, and their memory (a few words a rank) in proportion: more ranks than
// any job runs, epochs that count on and plans padded to a multiple of the
// ranks without overflowing (DataLoader workers: epoch_state.h's kMaxWorkers).
constexpr int64_t kMaxWorldSize = int64_t{1} << 20;
constexpr int64_t kMaxEpoch = int64_t{1} << 62;
constexpr int64_t kMaxPlanSize = int64_t{1} << 62;

enum class EvenBatches { kPad, kDrop, kNone };

EvenBatches parse_even_batches(const std::string& value);  // "pad", "drop" or "none"
const char* to_string(EvenBatches value);

struct LoaderOptions {
  int64_t batch_size = 1;
  int64_t fetch_factor = 16;
  bool drop_last = false;
  EvenBatches even_batches = EvenBatches::kPad;
};

// Validates batch_size, fetch_factor (and their product) and world_size.
void check_loader_options(const LoaderOptions& options, int64_t world_size);

class EpochLayout : public Dealing {
 public:
  EpochLayout(int64_t plan_size, const LoaderOptions& options, int64_t world_size);

  int64_t plan_size() const { return plan_size_; }
  const LoaderOptions& options() const { return options_; }
  int64_t batch_size() const { return options_.batch_size; }
  int64_t fetch_size() const { return fetch_size_; }
  int64_t fetch_factor() const { return options_.fetch_factor; }
  EvenBatches even_batches() const { return options_.even_batches; }
  int64_t world_size() const override { return world_size_; }
  int64_t num_fetches() const { return num_fetches_; }
  // Plan entries [fetch_begin(f), fetch_begin(f) + fetch_rows(f)) form fetch f.
  int64_t fetch_begin(int64_t fetch) const { return fetch * fetch_size_; }
  int64_t fetch_rows(int64_t fetch) const;
  // Batches of fetch f that are delivered (drop_last removes a short last one).
  int64_t fetch_batches(int64_t fetch) const;
  // Rows of batch b of fetch f (only the epoch's last batch may be short).
  int64_t batch_rows(int64_t fetch, int64_t batch) const;

  int64_t num_global_batches() const { return num_global_batches_; }
  int64_t whole_fetch_rounds() const { return rounds_; }
  int64_t num_tail_batches() const { return tail_batches_; }

  // Batches rank r delivers this epoch (after even_batches).
  int64_t rank_batches(int64_t rank) const override;
  int64_t rank_units(int64_t rank) const override;
  WorkUnit rank_unit(int64_t rank, int64_t unit) const override;
  // In O(1): units below whole_fetch_rounds() are whole fetches, the rest single batches.
  int64_t worker_batches(int64_t rank, int64_t worker, int64_t num_workers) const override;

 private:
  int64_t rank_tail_units(int64_t rank) const;

  int64_t plan_size_;
  LoaderOptions options_;
  int64_t world_size_;
  int64_t fetch_size_;
  int64_t num_fetches_;
  int64_t num_full_fetches_;
  int64_t num_global_batches_;
  int64_t rounds_;
  int64_t tail_batches_;
};

}  // namespace torch_shards::core
