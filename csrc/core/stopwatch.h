// Elapsed time for the stats the readers and decoders report.
#pragma once

#include <chrono>
#include <cstdint>

namespace torch_shards::core {

// Whole microseconds from `start` to now on the steady clock.
inline int64_t microseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace torch_shards::core
