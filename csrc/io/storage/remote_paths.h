// What file.h does for local paths, for URLs: stat, exists, is a
// "directory" (objects below it), list, read whole, read ranges of an
// opened object. Stats and small objects (zarr.json and the like, asked for
// many times while a dataset opens) are kept per process so that opening
// costs few round trips: within one opening (OpeningScope), and otherwise
// for a few seconds.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/storage/object_store.h"
#include "io/storage/url.h"

namespace torch_shards::io::storage {

// One dataset opening: while one lives (on any thread), stats and small
// objects are reused only if learnt since the first of them began; so a
// dataset opened again, after its objects were rewritten, reads them as they
// are now, never the earlier opening's metadata or stamps. Scopes that
// overlap (nested, or on other threads) are one opening. begin_opening and
// end_opening are its two halves, for a door that cannot hold one (Python's
// with-block).
void begin_opening();
void end_opening();
class OpeningScope {
 public:
  OpeningScope() { begin_opening(); }
  ~OpeningScope() { end_opening(); }
  OpeningScope(const OpeningScope&) = delete;
  OpeningScope& operator=(const OpeningScope&) = delete;
};

struct RemoteObject {
  Url url;
  ObjectStamp stamp;
};

// The object at `url` stamped now, or nullopt when there is none.
std::optional<RemoteObject> open_remote(const std::string& url);
// Reads ranges of an opened object (ObjectStore::read; coalesce_gap: -1 for its default).
void read_remote(const RemoteObject& object, std::vector<RangeRead>& ranges, const std::function<std::string()>& what,
                 int64_t coalesce_gap = -1);
// The object's whole cache entry, mapped (fetched first when missing), or null when the cache does
// not hold it whole (ObjectStore::whole).
std::shared_ptr<const MappedEntry> map_remote(const RemoteObject& object, const std::function<std::string()>& what);
// The object's stamp (kept a few seconds), or nullopt when there is none.
std::optional<ObjectStamp> stat_remote(const std::string& url);
// The stamps of many objects asked for together (those not known already), kept as stat_remote keeps
// them: what a later stat_remote of them answers without a request. Nothing is thrown: an object whose
// stamp did not come is asked for again by stat_remote, which names why it cannot be.
void stat_remote_together(const std::vector<std::string>& urls);
// An object at `url`, or objects below it.
bool remote_exists(const std::string& url);
// Objects below `url` and none at it (S3); over HTTP, a zarr store's
// metadata below it (zarr.json, .zgroup or .zarray) and no object at it.
bool remote_is_directory(const std::string& url);
std::vector<std::pair<std::string, bool>> list_remote(const std::string& url);
// s3: every object below `url` listed at once (up to a few thousand) and their zarr metadata fetched
// together, so that opening a store there asks for nothing more about what it holds: which objects
// exist, which "directories", their listings and metadata are then answered from what was learnt
// (under the same rules of reuse as stats). Nothing over HTTP, where nothing can be listed, and
// nothing (no error) when the listing is refused: the opening then asks for each thing as before.
void list_remote_store(const std::string& url);
// What a store's consolidated metadata (zarr v3's consolidated_metadata, v2's .zmetadata) says of the
// store at `url`: `files`, the metadata files of every node below it by path relative to it
// ("X/zarr.json", "obs/.zattrs"), as their bytes. Learnt within an opening (nothing otherwise) and used
// as stats are (in that opening, or outside openings for a few seconds): a metadata file below it other
// than its root's zarr.json and .zmetadata is then answered from these (absent from them: none), and so
// are whether its nodes exist, are directories, and what they list.
void learn_consolidated_metadata(const std::string& url, std::map<std::string, std::vector<uint8_t>> files);
// Whether the opening under way has learnt the consolidated metadata of the store at `url`.
bool consolidated_metadata_learnt(const std::string& url);
// Whole objects, fetched together; nullopt for those missing. etags gets
// each one's ETag when given.
std::vector<std::optional<std::vector<uint8_t>>> read_remote_objects(const std::vector<std::string>& urls,
                                                                     std::vector<std::string>* etags = nullptr);

}  // namespace torch_shards::io::storage
