// io::storage::InheritedTable: puts from many threads at once all land, and a child forked while a thread
// of its parent keeps putting reads a whole version (every entry as it was put, none older than what the
// parent had published before the fork) without any lock. Each child runs under alarm(): a hang ends in
// SIGALRM and fails the test.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "io/storage/inherited_table.h"

namespace torch_shards::io::storage {
namespace {

int64_t value_of(int64_t key) { return key * 7 + 3; }

// Every entry of the newest version holds the value its key was put with, and there are at least `least`.
bool whole_version(const InheritedTable<int64_t, int64_t>& table, size_t least) {
  const auto entries = table.snapshot();
  for (const auto& [key, value] : entries) {
    if (value != value_of(key)) return false;
  }
  return entries.size() >= least;
}

// Each test's table is static, as the library's are: the versions it keeps stay reachable (no leak for
// LeakSanitizer, make sanitize).
TEST(InheritedTable, PutsFromManyThreadsAtOnceAllLand) {
  static InheritedTable<int64_t, int64_t> table;
  EXPECT_TRUE(table.snapshot().empty());
  constexpr int64_t kThreads = 4, kEach = 500;
  std::vector<std::thread> threads;
  for (int64_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      for (int64_t i = 0; i < kEach; ++i) table.put(t * kEach + i, value_of(t * kEach + i));
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(table.snapshot().size(), static_cast<size_t>(kThreads * kEach));
  EXPECT_TRUE(whole_version(table, kThreads * kEach));
  table.put(0, 1);  // a key put again: its newest value
  EXPECT_EQ(table.snapshot().at(0), 1);
}

TEST(InheritedTable, AChildForkedWhileItsParentPutsReadsAWholeVersion) {
  static InheritedTable<int64_t, int64_t> table;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> put{0};
  std::thread putting([&] {
    for (int64_t key = 0; !stop; ++key) {
      table.put(key % 2000, value_of(key % 2000));
      put.store(key + 1);
    }
  });
  while (put.load() < 100) std::this_thread::yield();
  for (int child = 0; child < 20; ++child) {
    const size_t published = table.snapshot().size();  // before the fork: the child sees at least these
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(10);
      _exit(whole_version(table, published) ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child " << child << ": status " << status;
  }
  stop = true;
  putting.join();
  EXPECT_TRUE(whole_version(table, 100));
}

}  // namespace
}  // namespace torch_shards::io::storage
