// What the thread suites share: the threads this process has now (its
// /proc/self/task entries).
#pragma once

#include <filesystem>

namespace torch_shards {

inline int threads_in_process() {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    (void)entry;
    ++count;
  }
  return count;
}

}  // namespace torch_shards
