#include "loader/shared_slab.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <utility>

#include "core/errors.h"

namespace torch_shards {
namespace {

constexpr size_t kPage = 4096;

// A slab made here: freed (unmapped, its descriptor closed) with its storage.
struct Slab {
  void* base = nullptr;
  size_t bytes = 0;
  int fd = -1;
  int64_t id = 0;
  int64_t inode = 0;
  int64_t nonce = 0;
};

// This process's slab bookkeeping. Never destroyed (a slab may be freed while
// the process exits), and made afresh in a forked child: the parent's threads,
// which may have held the lock at the fork, do not exist there.
struct Local {
  int pid = 0;
  int64_t nonce = 0;
  std::atomic<int64_t> next_id{1};
  std::mutex mutex;
  std::vector<int64_t> freed;  // ids of slabs freed since take_freed_slabs()
};

int64_t draw_nonce() {
  std::random_device device;
  const uint64_t high = device(), low = device();
  return static_cast<int64_t>((high << 32) ^ low ^ static_cast<uint64_t>(getpid()));
}

// The process's State, made (and set up by `init`) on first use in each process.
template <typename State, typename Init>
State& for_this_process(std::atomic<State*>& current, Init init) {
  const int pid = getpid();
  State* state = current.load(std::memory_order_acquire);
  while (state == nullptr || state->pid != pid) {
    auto* fresh = new State();  // the one replaced is left as it is: never freed
    fresh->pid = pid;
    init(*fresh);
    if (current.compare_exchange_weak(state, fresh, std::memory_order_acq_rel)) return *fresh;
    delete fresh;
  }
  return *state;
}

std::atomic<Local*> local_state{nullptr};

Local& local() {
  return for_this_process(local_state, [](Local& state) { state.nonce = draw_nonce() | 1; });  // never 0
}

void delete_slab(void* context) {
  auto* slab = static_cast<Slab*>(context);
  (void)munmap(slab->base, slab->bytes);
  (void)close(slab->fd);
  Local& state = local();
  if (state.nonce == slab->nonce) {  // a parent's slab freed in a forked child is not this process's to report
    const std::lock_guard<std::mutex> lock(state.mutex);
    state.freed.push_back(slab->id);
  }
  delete slab;
}

std::string why(int error) { return std::strerror(error); }

// The main process's mappings of other processes' slabs, by (owner nonce, slab id).
struct Mapped {
  int pid = 0;
  std::mutex mutex;
  struct Entry {
    c10::Storage storage;
    int64_t owner_pid = 0;
  };
  std::map<std::pair<int64_t, int64_t>, Entry> slabs;
  int64_t maps = 0;
};

std::atomic<Mapped*> mapped_state{nullptr};

Mapped& mapped() {
  return for_this_process(mapped_state, [](Mapped&) {});
}

struct Mapping {
  void* base = nullptr;
  size_t bytes = 0;
};

void delete_mapping(void* context) {
  auto* mapping = static_cast<Mapping*>(context);
  (void)munmap(mapping->base, mapping->bytes);
  delete mapping;
}

bool process_gone(int64_t pid) { return kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

// Gone, or exiting (a zombie, or dead and not reaped yet: /proc/<pid>/stat's state Z or X).
bool process_ended(int64_t pid) {
  if (process_gone(pid)) return true;
  const int fd = open(core::concat("/proc/", pid, "/stat").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  char text[512] = {};
  const ssize_t size = read(fd, text, sizeof(text) - 1);
  (void)close(fd);
  const char* end = size > 0 ? std::strrchr(text, ')') : nullptr;  // the name may hold spaces and parentheses
  return end == nullptr || end[1] == '\0' || end[2] == 'Z' || end[2] == 'X';
}

// Whether the process ends within 200 ms: a killed process closes its descriptors before it becomes a
// zombie, so one whose descriptor just vanished may still look alive for a moment.
bool process_ending(int64_t pid) {
  for (int attempt = 0; attempt < 40; ++attempt) {
    if (process_ended(pid)) return true;
    usleep(5000);
  }
  return false;
}

void forget_dead_locked(Mapped& state) {
  std::map<int64_t, bool> gone;  // by pid: one signal each
  for (auto it = state.slabs.begin(); it != state.slabs.end();) {
    auto [known, added] = gone.emplace(it->second.owner_pid, false);
    if (added) known->second = process_gone(it->second.owner_pid);
    it = known->second ? state.slabs.erase(it) : std::next(it);
  }
}

c10::Storage map_new(const SlabOwner& owner, const SlabHandle& handle) {
  const std::string path = core::concat("/proc/", owner.pid, "/fd/", handle.fd);
  const auto fail = [&](const std::string& reason) -> c10::Storage {
    throw std::runtime_error(core::concat(
        "torch_shards: cannot map a batch's shared memory from DataLoader worker process ", owner.pid, " (", path,
        "): ", reason,
        ". Batches cross from DataLoader workers as handles to memory the main process maps; where another "
        "process's /proc/<pid>/fd cannot be opened (another user, a hardened kernel), create the ShardedDataset with "
        "worker_transport='torch'"));
  };
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT && process_ending(owner.pid)) {
      // Killed or crashed with this batch in flight (torch may not have noticed yet): say so as torch does.
      throw std::runtime_error(core::concat("DataLoader worker (pid ", owner.pid,
                                            ") exited unexpectedly: torch_shards could not map the shared memory of "
                                            "a batch it sent (",
                                            path, ")"));
    }
    return fail(error == ENOENT ? "the descriptor is closed: the worker freed the slab" : why(error));
  }
  struct stat status {};
  if (fstat(fd, &status) != 0) {
    const int error = errno;
    (void)close(fd);
    return fail(why(error));
  }
  if (static_cast<int64_t>(status.st_ino) != handle.inode || status.st_size < handle.bytes) {
    (void)close(fd);
    return fail(core::concat("the descriptor is another file now (inode ", status.st_ino, ", ", status.st_size,
                             " bytes; the slab was inode ", handle.inode, ", ", handle.bytes, " bytes)"));
  }
  const size_t bytes = static_cast<size_t>(handle.bytes);
  // Populated at once: the worker wrote its pages; faulting them in one by one costs more.
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  (void)close(fd);  // the mapping keeps the file
  if (base == MAP_FAILED) return fail(core::concat("mmap of ", bytes, " bytes: ", why(error)));
  return c10::Storage(c10::Storage::use_byte_size_t(), bytes,
                      c10::DataPtr(base, new Mapping{base, bytes}, &delete_mapping, c10::Device(c10::DeviceType::CPU)),
                      /*allocator=*/nullptr, /*resizable=*/false);
}

}  // namespace

SlabOwner slab_owner() {
  const Local& state = local();
  return SlabOwner{state.pid, state.nonce};
}

c10::Storage new_slab(size_t bytes) {
  bytes = std::max(kPage, (bytes + kPage - 1) / kPage * kPage);
  const int fd = memfd_create("torch_shards_slab", MFD_CLOEXEC);
  TORCH_CHECK(fd >= 0, "torch_shards: memfd_create failed: ", why(errno));
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int error = errno;
    (void)close(fd);
    TORCH_CHECK(false, "torch_shards: cannot size a shared-memory slab of ", bytes, " bytes: ", why(error));
  }
  struct stat status {};
  void* base = fstat(fd, &status) == 0 ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (base == MAP_FAILED) {
    const int error = errno;
    (void)close(fd);
    TORCH_CHECK(false, "torch_shards: cannot map a shared-memory slab of ", bytes, " bytes: ", why(error));
  }
  Local& state = local();
  auto* slab = new Slab{base, bytes, fd, state.next_id.fetch_add(1), static_cast<int64_t>(status.st_ino), state.nonce};
  return c10::Storage(c10::Storage::use_byte_size_t(), bytes,
                      c10::DataPtr(base, slab, &delete_slab, c10::Device(c10::DeviceType::CPU)),
                      /*allocator=*/nullptr, /*resizable=*/false);
}

std::optional<SlabHandle> slab_handle(const c10::Storage& storage) {
  const c10::DataPtr& data = storage.data_ptr();
  if (data.get_deleter() != &delete_slab) return std::nullopt;
  const auto* slab = static_cast<const Slab*>(data.get_context());
  if (slab->nonce != local().nonce) return std::nullopt;  // a parent's, inherited through fork
  return SlabHandle{slab->id, slab->fd, slab->inode, static_cast<int64_t>(slab->bytes)};
}

std::vector<int64_t> take_freed_slabs() {
  Local& state = local();
  std::vector<int64_t> out;
  const std::lock_guard<std::mutex> lock(state.mutex);
  out.swap(state.freed);
  return out;
}

c10::Storage map_slab(const SlabOwner& owner, const SlabHandle& handle) {
  Mapped& state = mapped();
  const std::pair<int64_t, int64_t> key{owner.nonce, handle.id};
  {
    const std::lock_guard<std::mutex> lock(state.mutex);
    auto it = state.slabs.find(key);
    if (it != state.slabs.end()) return it->second.storage;
  }
  c10::Storage storage = map_new(owner, handle);  // outside the lock: it may take a while
  const std::lock_guard<std::mutex> lock(state.mutex);
  forget_dead_locked(state);  // a new mapping is rare: a good time to drop those of exited workers
  auto [it, added] = state.slabs.emplace(key, Mapped::Entry{storage, owner.pid});
  if (added) ++state.maps;
  return it->second.storage;
}

void forget_slabs(int64_t nonce, const std::vector<int64_t>& ids) {
  if (ids.empty()) return;
  Mapped& state = mapped();
  const std::lock_guard<std::mutex> lock(state.mutex);
  for (int64_t id : ids) state.slabs.erase({nonce, id});
}

void forget_slab_owner(int64_t nonce) {
  Mapped& state = mapped();
  const std::lock_guard<std::mutex> lock(state.mutex);
  auto it = state.slabs.lower_bound({nonce, std::numeric_limits<int64_t>::min()});
  while (it != state.slabs.end() && it->first.first == nonce) it = state.slabs.erase(it);
}

void forget_dead_slab_owners() {
  Mapped& state = mapped();
  const std::lock_guard<std::mutex> lock(state.mutex);
  forget_dead_locked(state);
}

MappedSlabStats mapped_slab_stats() {
  Mapped& state = mapped();
  const std::lock_guard<std::mutex> lock(state.mutex);
  MappedSlabStats out;
  out.maps = state.maps;
  out.mapped = static_cast<int64_t>(state.slabs.size());
  for (const auto& [key, entry] : state.slabs) out.mapped_bytes += static_cast<int64_t>(entry.storage.nbytes());
  return out;
}

}  // namespace torch_shards
