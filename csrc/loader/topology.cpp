#include "loader/topology.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include <cerrno>
#include <cstdlib>
#include <map>
#include <random>
#include <sstream>
#include <vector>

#include "core/epoch_layout.h"
#include "core/errors.h"
#include "loader/process_group.h"

namespace torch_shards {
namespace {

std::optional<int64_t> environment_integer(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(value, &end, 10);
  TORCH_CHECK_VALUE(end != value && *end == '\0' && errno == 0, "environment variable ", name,
                    " must be an integer, got '", value, "'");
  return parsed;
}

std::string encode(const Claim& claim) {
  return core::concat(claim.rank, "\n", claim.world_size, "\n", claim.seed, "\n", claim.seed_given ? 1 : 0, "\n",
                      claim.fingerprint);
}

Claim decode(const std::string& text) {
  std::istringstream in(text);
  Claim claim;
  int seed_given = 0;
  in >> claim.rank >> claim.world_size >> claim.seed >> seed_given;
  claim.seed_given = seed_given != 0;
  in.ignore(1);
  claim.fingerprint.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return claim;
}

std::string list_claims(const std::vector<Claim>& claims, const char* world_size_name) {
  std::string out;
  for (size_t p = 0; p < claims.size(); ++p) {
    if (p == 16) return out + ", ... (" + std::to_string(claims.size()) + " processes)";
    out += core::concat(p ? ", " : "", "process ", p, ": rank ", claims[p].rank, " of ", world_size_name, "=",
                        claims[p].world_size);
  }
  return out;
}

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> default_process_group() {
  try {
    return c10d::resolve_process_group("0");
  } catch (const c10::Error&) {
    return {};  // none registered
  }
}

bool is_sub_group(const c10d::ProcessGroup& group) {
  const c10::intrusive_ptr<c10d::ProcessGroup> job = default_process_group();
  const std::optional<int64_t> job_size =
      job ? std::optional<int64_t>(job->getSize()) : environment_integer("WORLD_SIZE");
  return job_size && group.getSize() < *job_size;
}

void check_seed_scope(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const std::optional<int64_t>& seed,
                      const std::string& who) {
  TORCH_CHECK_VALUE(!group || seed || !is_sub_group(*group), who,
                    ": process_group is a part of the job's processes and seed=None: each such group would agree on "
                    "its own seed, and processes of different groups that read the same rank (tensor-parallel peers) "
                    "would read different rows. Pass seed= (the same on every process)");
}

Topology resolve_topology(std::optional<int64_t> rank, std::optional<int64_t> world_size,
                          const c10::intrusive_ptr<c10d::ProcessGroup>& group, const std::string& who,
                          const char* world_size_name) {
  Topology topology;
  topology.source = rank || world_size ? "explicit" : group ? "group" : "default";
  if (!world_size) world_size = group ? std::optional<int64_t>(group->getSize()) : environment_integer("WORLD_SIZE");
  if (!rank) rank = group ? std::optional<int64_t>(group->getRank()) : environment_integer("RANK");
  if (topology.source == "default" && (rank || world_size)) topology.source = "environment";
  topology.world_size = world_size.value_or(1);
  topology.rank = rank.value_or(0);
  TORCH_CHECK_VALUE(topology.world_size >= 1 && topology.world_size <= core::kMaxWorldSize, who, ": ", world_size_name,
                    " must be in [1, 2**20], got ", topology.world_size);
  // Several ranks and no rank from anywhere: every process would read rank 0's rows.
  TORCH_CHECK_VALUE(rank || topology.world_size == 1, who, ": ", world_size_name, "=", topology.world_size,
                    " but no rank: pass rank=, or build it after torch.distributed.init_process_group, or launch "
                    "with torchrun (which sets RANK); otherwise every process would read rank 0's rows");
  TORCH_CHECK_VALUE(topology.rank >= 0 && topology.rank < topology.world_size, who, ": rank must be in [0, ",
                    world_size_name, "=", topology.world_size, "), got ", topology.rank);
  return topology;
}

int64_t draw_seed() {
  std::random_device device;
  return static_cast<int64_t>((static_cast<uint64_t>(device()) << 32 | device()) >> 1);
}

int64_t agree_over_group(c10d::ProcessGroup& group, const Claim& claim, const std::string& who,
                         const char* world_size_name) {
  if (group.getSize() <= 1) return claim.seed;
  std::vector<Claim> claims;
  for (const std::string& text : all_gather_strings(group, encode(claim))) claims.push_back(decode(text));
  const std::string listed = list_claims(claims, world_size_name);
  // One world size.
  for (size_t p = 1; p < claims.size(); ++p) {
    TORCH_CHECK_VALUE(claims[p].world_size == claims[0].world_size, who, ": the processes of the process group ",
                      "disagree about ", world_size_name, " (", listed, "): leave rank and ", world_size_name,
                      " to the process group, or pass every process the same ", world_size_name,
                      " (for tensor or pipeline parallelism, pass the data-parallel group as ", "process_group=)");
  }
  // Every rank read by as many processes as every other.
  const int64_t world_size = claims[0].world_size;
  std::map<int64_t, int64_t> readers;
  for (const Claim& c : claims) ++readers[c.rank];
  const int64_t expected = static_cast<int64_t>(claims.size()) / world_size;
  bool even =
      static_cast<int64_t>(claims.size()) % world_size == 0 && static_cast<int64_t>(readers.size()) == world_size;
  for (const auto& [rank, count] : readers) even = even && count == expected;
  if (!even) {
    std::string counts;
    for (int64_t rank = 0; rank < world_size; ++rank) {
      const auto found = readers.find(rank);
      counts += core::concat(rank ? ", " : "", "rank ", rank, ": ", found == readers.end() ? 0 : found->second);
    }
    TORCH_CHECK_VALUE(false, who, ": the ", claims.size(), " processes of the process group do not share the ",
                      world_size, " ranks evenly (processes per rank: ", counts, "; ", listed,
                      "): some rows would be read twice as often as others, or never. Leave rank and ", world_size_name,
                      " to the process group, or give every rank to as many processes (for tensor ",
                      "or pipeline parallelism, pass the data-parallel group as process_group=)");
  }
  // The same data and arguments everywhere.
  for (size_t p = 1; p < claims.size(); ++p) {
    const std::string difference =
        first_difference(claims[0].fingerprint, claims[p].fingerprint, static_cast<int64_t>(p));
    TORCH_CHECK_VALUE(difference.empty(), who,
                      ": ranks disagree about what they read (every rank must be built with the same data and "
                      "arguments): ",
                      difference);
  }
  // One seed: the one given, or the first process's draw.
  for (size_t p = 1; p < claims.size(); ++p) {
    TORCH_CHECK_VALUE(
        claims[p].seed_given == claims[0].seed_given, who, ": rank ", p,
        claims[p].seed_given ? " was given a seed and rank 0 was not" : " was given no seed but rank 0 was",
        " (of the process group): pass the same seed= on every rank, or none");
    TORCH_CHECK_VALUE(!claims[0].seed_given || claims[p].seed == claims[0].seed, who,
                      ": ranks disagree about what they read (every rank must be built with the same data and "
                      "arguments): rank ",
                      p, " differs from rank 0 in 'seed': rank 0 has ", claims[0].seed, ", rank ", p, " has ",
                      claims[p].seed,
                      " (pass the same seed on every rank: the partition already gives each rank different rows)");
  }
  return claims[0].seed;
}

}  // namespace torch_shards
