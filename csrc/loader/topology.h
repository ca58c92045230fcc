// Where this process stands in a distributed job: its rank and world size,
// and the seed every process of the job agrees on. One implementation for
// the dataset and the sampler, for every door.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace torch_shards {

struct Topology {
  int64_t rank = 0;
  int64_t world_size = 1;
  // Where they came from: "explicit", "group", "environment" (RANK / WORLD_SIZE) or "default".
  std::string source = "default";
};

// Explicit values first, then the group's, then the RANK / WORLD_SIZE
// environment variables (torchrun), else 0 and 1; a world size above 1 with
// no rank from any of them is refused. `who` and the parameter
// name (world_size / num_replicas) appear in errors.
Topology resolve_topology(std::optional<int64_t> rank, std::optional<int64_t> world_size,
                          const c10::intrusive_ptr<c10d::ProcessGroup>& group, const std::string& who,
                          const char* world_size_name = "world_size");

// The job's default process group: the one torch.distributed's
// init_process_group registers with c10d (under the name "0"), or null when
// none is (no torch.distributed in this process, or not initialised yet).
c10::intrusive_ptr<c10d::ProcessGroup> default_process_group();

// Whether `group` holds only a part of the job's processes: fewer than the
// default process group, or, without one, than the WORLD_SIZE environment
// variable (torchrun) says.
bool is_sub_group(const c10d::ProcessGroup& group);

// Refuses (c10::ValueError) a seed to be agreed over a group that is a part
// of the job (seed=None with such a process_group): each such group would
// agree on its own seed, and processes of different groups reading the same
// rank would read different rows.
void check_seed_scope(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const std::optional<int64_t>& seed,
                      const std::string& who);

// A fresh random seed (local to this process).
int64_t draw_seed();

// What one process says about itself to the others.
struct Claim {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t seed = 0;
  bool seed_given = false;  // else `seed` is this process's own draw
  std::string fingerprint;  // "key: value" lines of what it reads and how
};

// All-gathers every process's claim over the group (one collective) and
// checks them, on every process alike: all claim the same world size; every
// rank in [0, world_size) is claimed by as many processes as every other
// (replicas and tensor-parallel groups may share a rank; none may be left
// out or read twice as often); all read the same data with the same
// arguments; and the seeds given agree. Returns the seed every process uses:
// the one given, else the draw of the group's first process. Throws
// c10::ValueError on every process, naming what does not fit and listing the
// claims.
int64_t agree_over_group(c10d::ProcessGroup& group, const Claim& claim, const std::string& who,
                         const char* world_size_name = "world_size");

}  // namespace torch_shards
