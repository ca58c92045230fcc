// A 64-bit fingerprint of a text that is the same on every platform and in
// every process (FNV-1a), for checkpoints that must recognise their data.
#pragma once

#include <cstdint>
#include <string>

namespace torch_shards::core {

inline int64_t stable_hash(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (const unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return static_cast<int64_t>(hash);
}

}  // namespace torch_shards::core
