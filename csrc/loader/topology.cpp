#include "loader/topology.h"

#include <c10/util/Exception.h>

#include <cerrno>
#include <cstdlib>
#include <random>

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

}  // namespace

Topology resolve_topology(std::optional<int64_t> rank, std::optional<int64_t> world_size,
                          const c10::intrusive_ptr<c10d::ProcessGroup>& group, const std::string& who,
                          const char* world_size_name) {
  Topology topology;
  if (!world_size) world_size = group ? std::optional<int64_t>(group->getSize()) : environment_integer("WORLD_SIZE");
  if (!rank) rank = group ? std::optional<int64_t>(group->getRank()) : environment_integer("RANK");
  topology.world_size = world_size.value_or(1);
  topology.rank = rank.value_or(0);
  TORCH_CHECK_VALUE(topology.world_size >= 1, who, ": ", world_size_name, " must be >= 1, got ", topology.world_size);
  TORCH_CHECK_VALUE(topology.rank >= 0 && topology.rank < topology.world_size, who, ": rank must be in [0, ",
                    world_size_name, "=", topology.world_size, "), got ", topology.rank);
  if (group && group->getSize() == topology.world_size && group->getRank() == topology.rank) topology.group = group;
  return topology;
}

int64_t resolve_seed(std::optional<int64_t> seed, const Topology& topology) {
  if (seed) return *seed;
  std::random_device device;
  const uint64_t drawn = (static_cast<uint64_t>(device()) << 32 | device()) >> 1;
  const int64_t mine = static_cast<int64_t>(drawn);
  return topology.group ? broadcast_seed(*topology.group, mine) : mine;
}

}  // namespace torch_shards
