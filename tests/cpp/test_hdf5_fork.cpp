// The HDF5 lock across fork(): a child of a process that used HDF5 reads
// through HDF5's own read path (a filter only the library decodes), also when
// the fork happened while another thread was inside HDF5 or while the forking
// thread itself held the lock. Each child runs under alarm(): a deadlock ends
// in SIGALRM and fails the test instead of hanging it.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "io/array.h"
#include "io/hdf5_array.h"
#include "io/hdf5_library.h"

namespace torch_shards::io {
namespace {

constexpr int64_t kRows = 100;
constexpr int64_t kColumns = 4;

// A chunked int32 dataset with the Fletcher-32 filter, which torch_shards
// leaves to HDF5's own reader; value at (r, c) is 10 r + c.
std::string write_fletcher32_file(const std::string& name) {
  // named by this process too: another run of the suites may write the same name at the same time
  const std::string path = testing::TempDir() + "/" + std::to_string(::getpid()) + "_" + name;
  auto lock = hdf5_lock();
  Hid file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  const hsize_t dims[2] = {kRows, kColumns}, chunk[2] = {10, kColumns};
  Hid space(H5Screate_simple(2, dims, nullptr), H5Sclose);
  Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_chunk(dcpl.get(), 2, chunk);
  H5Pset_fletcher32(dcpl.get());
  Hid dataset(H5Dcreate2(file.get(), "x", H5T_STD_I32LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose);
  std::vector<int32_t> values(kRows * kColumns);
  for (int64_t i = 0; i < kRows * kColumns; ++i) values[i] = static_cast<int32_t>(10 * (i / kColumns) + i % kColumns);
  EXPECT_GE(H5Dwrite(dataset.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
  return path;
}

bool reads_every_row(const Array& array) {
  core::ThreadPool pool(2);
  const std::vector<uint8_t> bytes = array.read_range(0, kRows, pool);
  const auto* values = reinterpret_cast<const int32_t*>(bytes.data());
  for (int64_t i = 0; i < kRows * kColumns; ++i) {
    if (values[i] != 10 * (i / kColumns) + i % kColumns) return false;
  }
  return true;
}

// Runs `child` in a forked process (10 s to finish); its exit status, or -signal.
template <typename Function>
int in_child(Function child) {
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(10);
    _exit(child() ? 0 : 1);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1000;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

TEST(Hdf5Fork, ChildOfAProcessThatUsedHdf5ReadsThroughTheLibrary) {
  const auto array = open_hdf5_array(write_fletcher32_file("used.h5"), "/x");
  ASSERT_TRUE(reads_every_row(*array));  // the parent used HDF5: the at-fork handlers are installed
  EXPECT_EQ(
      in_child([&] { return reads_every_row(*array) && reads_every_row(*open_hdf5_array(array->info().file, "/x")); }),
      0);
  EXPECT_TRUE(reads_every_row(*array));  // and the parent still can
}

TEST(Hdf5Fork, ForkWhileAnotherThreadReadsWaitsForItAndTheChildReads) {
  const auto array = open_hdf5_array(write_fletcher32_file("busy.h5"), "/x");
  std::atomic<bool> stop{false};
  std::atomic<int> parent_reads{0};
  std::thread reader([&] {
    while (!stop) {
      if (!reads_every_row(*array)) return;
      ++parent_reads;
    }
  });
  while (parent_reads == 0) std::this_thread::yield();
  for (int i = 0; i < 20; ++i) EXPECT_EQ(in_child([&] { return reads_every_row(*array); }), 0) << "fork " << i;
  stop = true;
  reader.join();
  EXPECT_GT(parent_reads.load(), 0);
}

TEST(Hdf5Fork, ForkFromInsideALockedSectionKeepsTheLockHeldInTheChild) {
  const auto array = open_hdf5_array(write_fletcher32_file("inside.h5"), "/x");
  auto lock = hdf5_lock();
  const int status = in_child([&] {
    // The lock is this thread's (recursively, as before the fork); once
    // released, other threads of the child can take it.
    if (!hdf5_lock_held()) return false;
    lock.unlock();
    bool read = false;
    std::thread other([&] { read = reads_every_row(*array); });
    other.join();
    return read && !hdf5_lock_held();
  });
  EXPECT_EQ(status, 0);
  EXPECT_TRUE(hdf5_lock_held());
  lock.unlock();
  EXPECT_FALSE(hdf5_lock_held());
}

}  // namespace
}  // namespace torch_shards::io
