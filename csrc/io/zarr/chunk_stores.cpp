#include "io/zarr/chunk_stores.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>

#include "core/errors.h"
#include "core/waiting_tasks.h"
#include "io/codecs.h"
#include "io/file.h"
#include "io/storage/url.h"
#include "io/zarr/chunk_decoding.h"
#include "io/zarr/json.h"

namespace torch_shards::io::zarr {

using core::concat;
using core::FileNotFound;
using core::ReadError;

namespace {

constexpr uint64_t kMissingEntry = std::numeric_limits<uint64_t>::max();

// The array's metadata file as the store was opened. A chunk (or shard)
// file that does not exist was never written, and one opened later belongs
// to the store that was opened, as long as that file is unchanged: a store
// deleted or moved while open would otherwise read as its fill value, and a
// store replaced or rewritten (another metadata file) would mix old and new
// chunks in one read.
class MetadataStamp {
 public:
  explicit MetadataStamp(std::string path) : path_(std::move(path)), stamp_(FileStamp::of_path(path_)) {}
  const std::string& path() const { return path_; }
  uint64_t digest() const { return stamp_ ? stamp_->digest() : 0; }
  // Throws FileNotFound if the file is gone, ReadError if it changed.
  void check() const {
    const std::optional<FileStamp> now = FileStamp::of_path(path_);
    if (!now) throw FileNotFound(path_);
    const std::string change = stamp_ && file_checks_enabled() ? stamp_->changes_to(*now) : "";
    if (change.empty()) return;
    throw ReadError(concat(path_, ": the zarr store changed while being read (", change,
                           "): chunks read from it may mix its old and new contents, so they are not delivered; "
                           "open the dataset again once the store is written"));
  }

 private:
  std::string path_;
  std::optional<FileStamp> stamp_;  // nullopt: it could not be stat'ed at open (then only its presence counts)
};

// One file per chunk, named by its key. A chunk file is opened for each
// read, so each chunk's stamp from its first read in the job (this process
// or the one it was forked from) is kept in a table: a chunk written again
// since (zarr-python writes a chunk to a new file renamed over the old one,
// leaving the metadata file as it was) is refused, not mixed with chunks read
// before. Arrays of more than kMaxStampedChunks chunks keep no table.
class ChunkFiles : public ChunkStore {
 public:
  ChunkFiles(std::string dir, ChunkKeys keys, std::string metadata_file, std::vector<int64_t> grid)
      : dir_(std::move(dir)),
        keys_(keys),
        metadata_(std::move(metadata_file)),
        grid_(std::move(grid)),
        chunks_(chunk_count_capped(grid_, kMaxStampedChunks)) {}
  ~ChunkFiles() override { delete[] stamps_.load(); }

  std::optional<std::vector<uint8_t>> read_chunk(const std::vector<int64_t>& coords) const override {
    if (reads_together()) {
      core::ThreadPool inline_pool(0);
      return std::move(read_chunks({coords}, inline_pool)[0]);
    }
    const std::shared_ptr<const File> file = open_chunk(coords);
    if (!file) return std::nullopt;
    return file->read_at(0, static_cast<size_t>(file->size()), "the whole file");
  }
  // Chunks behind URLs: each a whole object, all fetched together.
  bool reads_together() const override { return storage::is_url(dir_); }
  std::vector<std::optional<std::vector<uint8_t>>> read_chunks(const std::vector<std::vector<int64_t>>& coords,
                                                               core::ThreadPool& /*pool*/) const override {
    std::vector<std::string> paths;
    paths.reserve(coords.size());
    for (const std::vector<int64_t>& chunk : coords) paths.push_back(dir_ + "/" + keys_.key(chunk));
    std::vector<FileStamp> stamps;
    std::vector<std::optional<std::vector<uint8_t>>> chunks = read_whole_files_if_exist(paths, &stamps);
    metadata_.check();
    for (size_t i = 0; i < coords.size(); ++i) {
      if (chunks[i]) check_chunk(coords[i], paths[i], stamps[i].digest());
    }
    return chunks;
  }
  bool can_locate() const override { return true; }
  std::optional<ChunkLocation> locate(const std::vector<int64_t>& coords) const override {
    std::shared_ptr<const File> file = open_chunk(coords);
    if (!file) return std::nullopt;
    const int64_t size = file->size();
    return ChunkLocation{std::move(file), 0, size};
  }
  std::string describe_chunk(const std::vector<int64_t>& coords) const override {
    return concat("chunk ", format_coords(coords), " (", keys_.key(coords), ")");
  }
  void opened_stamps(FileStamps& stamps) const override { stamps[metadata_.path()] = metadata_.digest(); }

 private:
  static constexpr int64_t kMaxStampedChunks = int64_t{1} << 22;  // 32 MiB of stamps

  // The chunk's file, opened (each is opened when read, never kept open), or
  // null if it was never written; either once the store and the chunk are
  // checked unchanged.
  std::shared_ptr<const File> open_chunk(const std::vector<int64_t>& coords) const {
    std::shared_ptr<const File> file = File::open_if_exists(dir_ + "/" + keys_.key(coords));
    metadata_.check();
    if (file) check_chunk(coords, file->path(), file->stamp().digest());
    return file;
  }

  void check_chunk(const std::vector<int64_t>& coords, const std::string& path, uint64_t now) const {
    if (!file_checks_enabled() || chunks_ > kMaxStampedChunks || coords.size() != grid_.size()) return;
    int64_t chunk = 0;
    for (size_t d = 0; d < coords.size(); ++d) {
      if (coords[d] < 0 || coords[d] >= grid_[d]) return;
      chunk = chunk * grid_[d] + coords[d];
    }
    std::atomic<uint64_t>& slot = stamps()[chunk];
    uint64_t first = 0;
    if (slot.compare_exchange_strong(first, now, std::memory_order_relaxed) || first == now) return;
    throw ReadError(concat(path,
                           ": the zarr chunk changed while being read (written again since it was first "
                           "read, the array's metadata as it was): rows read from it may mix its old and "
                           "new contents, so they are not delivered; open the dataset again once the "
                           "store is written"));
  }

  // The table of first stamps (0: not read yet), made on first use.
  std::atomic<uint64_t>* stamps() const {
    if (std::atomic<uint64_t>* table = stamps_.load(std::memory_order_acquire)) return table;
    std::lock_guard<std::mutex> lock(first_use_mutex());
    if (stamps_.load(std::memory_order_relaxed) == nullptr) {
      stamps_.store(new std::atomic<uint64_t>[static_cast<size_t>(chunks_)](), std::memory_order_release);
    }
    return stamps_.load(std::memory_order_relaxed);
  }

  std::string dir_;
  ChunkKeys keys_;
  MetadataStamp metadata_;
  std::vector<int64_t> grid_;  // chunks along each dimension
  int64_t chunks_ = 0;         // in all (kMaxStampedChunks + 1: more)
  mutable std::atomic<std::atomic<uint64_t>*> stamps_{nullptr};
};

// Where each inner chunk of one shard lies in the shard file.
struct ShardIndex {
  bool shard_exists = false;
  std::shared_ptr<const File> file;                    // kept open (and mapped) while the store lives
  std::vector<std::pair<uint64_t, uint64_t>> entries;  // (offset, nbytes); kMissingEntry twice: never written
};

// Inner chunks of v3 shards: inner grid coordinates -> shard file -> index
// entry. Each shard's index is read once (only its bytes) and kept. Shards
// are found by their position in the shard grid (no key string, no shared
// lookup per chunk) when the grid is of a reasonable size, by key otherwise.
class ShardedChunkStore : public ChunkStore {
 public:
  ShardedChunkStore(std::string dir, ChunkKeys keys, std::vector<int64_t> chunks_per_shard,
                    std::vector<int64_t> shard_grid, ShardLayout layout, std::string metadata_file)
      : dir_(std::move(dir)),
        keys_(keys),
        metadata_(std::move(metadata_file)),
        chunks_per_shard_(std::move(chunks_per_shard)),
        shard_grid_(std::move(shard_grid)),
        layout_(std::move(layout)) {
    // Each inner chunk takes 16 bytes of the index, which every shard file holds.
    constexpr int64_t kMaxEntries = std::numeric_limits<int64_t>::max() / 16 - 1;
    for (int64_t count : chunks_per_shard_) {
      if (count != 0 && inner_chunks_ > kMaxEntries / count) {
        throw std::runtime_error("shards of more than 2^59 inner chunks (corrupt chunk shapes)");
      }
      inner_chunks_ *= count;
    }
    // Shards found by grid position when there are at most kMaxIndexedShards of them.
    indexed_shards_ = 1;
    for (int64_t count : shard_grid_) {
      const bool fits = indexed_shards_ >= 0 && count > 0 && indexed_shards_ <= kMaxIndexedShards / count;
      indexed_shards_ = fits ? indexed_shards_ * count : -1;
    }
  }

  std::optional<std::vector<uint8_t>> read_chunk(const std::vector<int64_t>& coords) const override {
    const std::optional<ChunkLocation> location = locate(coords);
    if (!location) return std::nullopt;
    return location->file->read_at(location->offset, static_cast<size_t>(location->size),
                                   "inner chunk " + format_coords(coords));
  }

  bool can_locate() const override { return true; }
  bool maps_chunks() const override { return true; }
  // Shards behind URLs: the indexes a read needs are loaded in parallel
  // first (open), then each shard's chunks requested together; unless every
  // shard opened so far is held whole in the node-local cache, mapped
  // (storage/object_store.h): its chunks are then decoded where they lie, as
  // from a local shard. A shard opened later that is not held whole turns
  // requests together back on.
  bool reads_together() const override {
    return storage::is_url(dir_) && (shards_in_ranges_.load(std::memory_order_relaxed) > 0 ||
                                     shards_held_whole_.load(std::memory_order_relaxed) == 0);
  }
  // Behind URLs, until every shard of the grid is open in this process (then reads need not look).
  bool opens_objects() const override {
    return storage::is_url(dir_) &&
           (indexed_shards_ < 0 || cache().opened.load(std::memory_order_relaxed) < indexed_shards_);
  }
  bool opens(const std::vector<std::vector<int64_t>>& coords) const override {
    return opens_objects() &&
           std::any_of(coords.begin(), coords.end(), [&](const auto& chunk) { return !index_loaded(chunk); });
  }
  void open(const std::vector<std::vector<int64_t>>& coords) const override {
    if (!opens_objects()) return;
    std::map<std::vector<int64_t>, size_t> first_of_shard;  // a chunk of each shard not open yet
    for (size_t i = 0; i < coords.size(); ++i) {
      if (!index_loaded(coords[i])) first_of_shard.emplace(shard_of(coords[i]), i);
    }
    std::vector<size_t> unopened;
    for (const auto& [shard, i] : first_of_shard) unopened.push_back(i);
    // Each open waits on round trips (a stamp, the index, or the whole object's download into the
    // cache): together.
    core::run_waiting_tasks(static_cast<int64_t>(unopened.size()),
                            [&](int64_t k) { (void)locate(coords[unopened[static_cast<size_t>(k)]]); });
  }
  std::vector<std::optional<std::vector<uint8_t>>> read_chunks(const std::vector<std::vector<int64_t>>& coords,
                                                               core::ThreadPool& pool) const override {
    open(coords);
    return ChunkStore::read_chunks(coords, pool);
  }
  std::optional<ChunkLocation> locate(const std::vector<int64_t>& coords) const override {
    int64_t entry = 0;
    for (size_t d = 0; d < coords.size(); ++d) entry = entry * chunks_per_shard_[d] + coords[d] % chunks_per_shard_[d];
    const ShardIndex& index = shard_index(coords, shard_position(coords));
    if (!index.shard_exists) return std::nullopt;
    const auto [offset, nbytes] = index.entries[entry];
    if (offset == kMissingEntry) return std::nullopt;
    return ChunkLocation{index.file, static_cast<int64_t>(offset), static_cast<int64_t>(nbytes)};
  }

  std::string describe_chunk(const std::vector<int64_t>& coords) const override {
    return concat("inner chunk ", format_coords(coords), " of shard ", keys_.key(shard_of(coords)));
  }

  void opened_stamps(FileStamps& stamps) const override { stamps[metadata_.path()] = metadata_.digest(); }

  void open_files(std::vector<const File*>& files) const override {
    Cache& cache = this->cache();
    std::lock_guard<std::mutex> lock(cache.mutex);
    files.insert(files.end(), cache.files.begin(), cache.files.end());
  }

 private:
  static constexpr int64_t kMaxIndexedShards = int64_t{1} << 16;
  static constexpr size_t kMaxRecheckedShards = 256;

  struct Slot {
    std::mutex mutex;  // held while the index loads, so each loads once
    std::shared_ptr<const ShardIndex> index;
    std::atomic<const ShardIndex*> loaded{nullptr};  // index, once set: read without the lock
  };

  struct Cache {
    explicit Cache(int64_t indexed_shards) : indexed(static_cast<size_t>(std::max<int64_t>(indexed_shards, 0))) {}
    std::vector<Slot> indexed;  // by position in the shard grid (empty: too many shards)
    std::mutex mutex;           // guards slots and files
    std::map<std::string, std::shared_ptr<Slot>> slots;
    std::vector<const File*> files;  // of the shards loaded
    std::atomic<int64_t> opened{0};  // shards whose index is loaded (or found missing)
  };

  // This process's cache of shard indexes. A forked child starts its own: a
  // thread of the parent may have held one of the old cache's mutexes at the
  // fork, and would never release it in the child. The inherited cache is
  // left alone (its indexes may still be referenced), not destroyed while
  // perhaps locked.
  Cache& cache() const {
    const int pid = current_process_id();
    if (cache_pid_.load(std::memory_order_acquire) != pid) {
      std::lock_guard<std::mutex> lock(first_use_mutex());
      if (cache_pid_.load(std::memory_order_relaxed) != pid) {
        if (cache_pid_.load(std::memory_order_relaxed) != 0) (void)cache_.release();
        cache_ = std::make_unique<Cache>(indexed_shards_);
        cache_pid_.store(pid, std::memory_order_release);
      }
    }
    return *cache_;
  }

  // The position in the shard grid of the shard holding `coords`, or -1 (too many shards, or outside the
  // grid) to look it up by key.
  int64_t shard_position(const std::vector<int64_t>& coords) const {
    int64_t shard = indexed_shards_ >= 0 ? 0 : -1;
    for (size_t d = 0; d < coords.size() && shard >= 0; ++d) {
      const int64_t position = coords[d] / chunks_per_shard_[d];
      shard = position < shard_grid_[d] ? shard * shard_grid_[d] + position : -1;
    }
    return shard;
  }

  // Whether the index of the shard holding `coords` is loaded in this process already.
  bool index_loaded(const std::vector<int64_t>& coords) const {
    Cache& cache = this->cache();
    const int64_t shard = cache.indexed.empty() ? -1 : shard_position(coords);
    if (shard >= 0) return cache.indexed[static_cast<size_t>(shard)].loaded.load(std::memory_order_acquire) != nullptr;
    std::lock_guard<std::mutex> lock(cache.mutex);
    const auto found = cache.slots.find(keys_.key(shard_of(coords)));
    return found != cache.slots.end() && found->second->loaded.load(std::memory_order_acquire) != nullptr;
  }

  std::vector<int64_t> shard_of(const std::vector<int64_t>& coords) const {
    std::vector<int64_t> shard(coords.size());
    for (size_t d = 0; d < coords.size(); ++d) shard[d] = coords[d] / chunks_per_shard_[d];
    return shard;
  }

  // `position`: the shard's place in the grid, or -1 to look it up by key.
  // The index of the shard holding `coords`; valid while the store lives.
  const ShardIndex& shard_index(const std::vector<int64_t>& coords, int64_t position) const {
    Cache& cache = this->cache();
    Slot* slot = nullptr;
    if (position >= 0 && !cache.indexed.empty()) {
      slot = &cache.indexed[static_cast<size_t>(position)];
      if (const ShardIndex* loaded = slot->loaded.load(std::memory_order_acquire)) return *loaded;
    } else {
      std::lock_guard<std::mutex> lock(cache.mutex);
      std::shared_ptr<Slot>& entry = cache.slots[keys_.key(shard_of(coords))];
      if (!entry) entry = std::make_shared<Slot>();
      slot = entry.get();  // slots are never removed
    }
    std::lock_guard<std::mutex> lock(slot->mutex);
    // A failed load leaves the slot empty: later reads retry.
    if (!slot->index) {
      std::shared_ptr<const ShardIndex> index = load_index(keys_.key(shard_of(coords)));
      check_held_shards(cache);
      if (index->file) {
        std::lock_guard<std::mutex> files_lock(cache.mutex);
        cache.files.push_back(index->file.get());
      }
      slot->index = std::move(index);
      slot->loaded.store(slot->index.get(), std::memory_order_release);
      cache.opened.fetch_add(1, std::memory_order_relaxed);
    }
    return *slot->index;
  }

  // A shard opened now must come from the store whose shards this process
  // holds: each held shard's path (the newest kMaxRecheckedShards) must still
  // lead to the file held. zarr-python writes a shard to a new file renamed
  // over the old one, the metadata file left as it was: without this, rows of
  // held (old) and new shards would mix.
  void check_held_shards(Cache& cache) const {
    if (!file_checks_enabled()) return;
    std::vector<const File*> held;
    {
      std::lock_guard<std::mutex> lock(cache.mutex);
      const size_t first = cache.files.size() > kMaxRecheckedShards ? cache.files.size() - kMaxRecheckedShards : 0;
      held.assign(cache.files.begin() + static_cast<std::ptrdiff_t>(first), cache.files.end());
    }
    for (const File* file : held) {
      // Shards behind URLs need no look: every read of one carries its ETag (If-Match).
      if (file->remote()) continue;
      const std::optional<FileStamp> now = FileStamp::of_path(file->path());
      if (now && now->device == file->stamp().device && now->inode == file->stamp().inode) continue;
      throw ReadError(concat(file->path(), ": the zarr store changed while being read (",
                             now ? file->stamp().changes_to(*now) : std::string("this shard is gone"),
                             ", found opening another shard): rows read from its shards may mix old and new contents, "
                             "so they are not delivered; open the dataset again once the store is written"));
    }
  }

  std::shared_ptr<const ShardIndex> load_index(const std::string& key) const {
    auto index = std::make_shared<ShardIndex>();
    const std::string path = dir_ + "/" + key;
    index->file = File::open_if_exists(path, File::Access::kMapped);
    // Throws (the slot stays empty) unless the shard opened, or found missing, is the store's (the file is
    // then checked by its own stamp).
    metadata_.check();
    if (!index->file) return index;
    index->shard_exists = true;
    const File& file = *index->file;
    const size_t entry_bytes = static_cast<size_t>(inner_chunks_) * 16;
    const size_t index_bytes = entry_bytes + (layout_.index_crc32c ? 4 : 0);
    if (static_cast<uint64_t>(file.size()) < index_bytes) {
      throw std::runtime_error(
          concat("the shard has ", file.size(), " bytes, less than its ", index_bytes, "-byte index (truncated)"));
    }
    const int64_t index_offset = layout_.index_at_start ? 0 : file.size() - static_cast<int64_t>(index_bytes);
    std::vector<uint8_t> bytes = file.read_at(index_offset, index_bytes, "the shard index");
    if (file.remote()) (file.mapped() ? shards_held_whole_ : shards_in_ranges_).fetch_add(1, std::memory_order_relaxed);
    if (layout_.index_crc32c) {
      try {
        strip_crc32c(bytes);
      } catch (const std::runtime_error& error) {
        throw std::runtime_error(concat("shard index: ", error.what()));
      }
    }
    const uint64_t file_size = static_cast<uint64_t>(file.size());
    index->entries.resize(static_cast<size_t>(inner_chunks_));
    for (int64_t i = 0; i < inner_chunks_; ++i) {
      uint64_t values[2] = {0, 0};
      for (int v = 0; v < 2; ++v) {
        const uint8_t* field = bytes.data() + i * 16 + v * 8;
        for (int b = 0; b < 8; ++b) {
          const int shift = layout_.index_big_endian ? 8 * (7 - b) : 8 * b;
          values[v] |= static_cast<uint64_t>(field[b]) << shift;
        }
      }
      const auto [offset, nbytes] = values;
      const bool missing = offset == kMissingEntry && nbytes == kMissingEntry;
      if (!missing && (offset > file_size || nbytes > file_size - offset)) {
        throw std::runtime_error(concat("shard index entry ", i, " (offset ", offset, ", nbytes ", nbytes,
                                        ") lies outside the shard's ", file_size, " bytes (corrupt index)"));
      }
      index->entries[i] = {offset, nbytes};
    }
    return index;
  }

  std::string dir_;
  ChunkKeys keys_;
  MetadataStamp metadata_;
  std::vector<int64_t> chunks_per_shard_;
  std::vector<int64_t> shard_grid_;  // shards along each dimension
  ShardLayout layout_;
  int64_t inner_chunks_ = 1;
  int64_t indexed_shards_ = -1;  // shards in the grid, or -1: more than kMaxIndexedShards
  mutable std::unique_ptr<Cache> cache_;
  mutable std::atomic<int> cache_pid_{0};
  // Shards behind URLs opened so far: held whole (mapped) in the cache, or read in ranges.
  mutable std::atomic<int64_t> shards_held_whole_{0}, shards_in_ranges_{0};
};

}  // namespace

std::shared_ptr<const ChunkStore> make_chunk_store(const ZarrMetadata& meta) {
  const std::string metadata_file = meta.dir + (meta.format == 3 ? "/zarr.json" : "/.zarray");
  // Chunks (shards when sharded) along each dimension, rounded up without overflow: a shape may be as large
  // as 2^63 - 1.
  std::vector<int64_t> grid(meta.shape.size());
  for (size_t d = 0; d < grid.size(); ++d) {
    grid[d] = meta.shape[d] / meta.chunk_shape[d] + (meta.shape[d] % meta.chunk_shape[d] != 0 ? 1 : 0);
  }
  if (!meta.sharding) return std::make_shared<ChunkFiles>(meta.dir, meta.keys, metadata_file, std::move(grid));
  std::vector<int64_t> chunks_per_shard(meta.shape.size()), shard_grid = std::move(grid);
  for (size_t d = 0; d < chunks_per_shard.size(); ++d) {
    chunks_per_shard[d] = meta.chunk_shape[d] / meta.sharding->inner_chunk_shape[d];
  }
  try {
    return std::make_shared<ShardedChunkStore>(meta.dir, meta.keys, std::move(chunks_per_shard), std::move(shard_grid),
                                               *meta.sharding, metadata_file);
  } catch (const std::runtime_error& error) {
    throw ReadError(concat(meta.where, ": ", error.what()));
  }
}

}  // namespace torch_shards::io::zarr
