// Save folders: a MANIFEST (counts, sizes and xxh64 checksums of every file, plus whatever the
// writer describes itself with) and the files it lists. A save is written into `<path>.tmp`,
// every file fsync'ed, the MANIFEST last, and then swapped in place of `<path>` in one atomic
// exchange (or rename), so a crash or a failed write mid-save leaves the previous save, never a
// half-written one, under `<path>`. load verifies the MANIFEST's own checksum, then every file's
// size and checksum, and names the file that does not match.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "common/thread_annotations.hpp"
#include "table/io/file_env.hpp"

struct XXH64_state_s;  // xxhash.h's, for VerifiedChunkReader

namespace gpubox::table::io {

inline constexpr const char* kManifestName = "MANIFEST";
// The largest MANIFEST (or MODEL_MANIFEST) read: a line per file, so a save of a million files
// fits; a larger one is refused unread.
inline constexpr uint64_t kMaxManifestBytes = uint64_t{64} << 20;

struct ManifestFile {
  std::string name;
  uint64_t records = 0;  // rows, keys or blocks, as the writer counts them
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;
};

// What a save folder holds. `properties` are the writer's own (mode, layout, day counter, ...).
struct Manifest {
  std::string kind;  // "sparse" or "dense"
  std::map<std::string, std::string> properties;
  std::vector<ManifestFile> files;

  std::string encode() const;
  // `where` names the manifest in errors.
  static StatusOr<Manifest> parse(const std::string& text, const std::string& where);

  // properties[key], or InvalidArgument/Corruption naming the key when missing or not a number.
  StatusOr<std::string> get(const std::string& key) const;
  StatusOr<int64_t> get_int(const std::string& key) const;
};

uint64_t checksum(const void* data, std::size_t size);

// A 64-bit checksum or digest as manifests write it: 16 lowercase hex digits.
std::string hex64(uint64_t value);
// Reads what hex64 wrote (1 to 16 hex digits); false when `text` is not that.
bool parse_hex64(const std::string& text, uint64_t* value);

// One save being written. Not thread-safe except add_file, which several shard writers may call
// at once. Destroying an uncommitted save removes its staging folder (best effort).
class StagedSave {
 public:
  // Starts a save of `path` (its MANIFEST's kind `kind`): removes a stale `<path>.tmp` from an
  // earlier crash and creates it (marked as a staging folder until commit). Refuses a `path`
  // that exists and is neither empty nor a save of `kind` and nothing else (it would be replaced,
  // whatever it holds), and a `<path>.tmp` that is not a staging folder or a whole save.
  static StatusOr<std::unique_ptr<StagedSave>> begin(FileEnv* env, const std::string& path,
                                                     const std::string& kind);
  ~StagedSave();

  // Writes `data` as `name` in the staging folder (fsync'ed) and records it for the MANIFEST.
  Status add_file(const std::string& name, const std::string& data, uint64_t records);
  // Writes the MANIFEST (kind, properties and the files added) and swaps the save in.
  Status commit(const std::string& kind, const std::map<std::string, std::string>& properties);
  // Whether commit swapped the save in (it may have failed after that: the parent folder's sync).
  bool committed() const { return committed_; }
  // Whether the save may be in place after a failed commit: it swapped the save in, or it tried to
  // exchange it with an earlier save (an exchange without RENAME_EXCHANGE is three renames, and
  // the last may fail with the new save already at the path). A failed plain rename changed
  // nothing.
  bool may_be_in_place() const { return committed_ || exchange_tried_; }

 private:
  StagedSave(FileEnv* env, std::string path) : env_(env), path_(std::move(path)) {}
  FileEnv* env_;
  std::string path_;
  Mutex files_mu_;  // add_file may run from several threads (one per shard)
  std::vector<ManifestFile> files_ GPUBOX_GUARDED_BY(files_mu_);
  bool committed_ = false;
  bool exchange_tried_ = false;
};

// Reads and checks `<path>/MANIFEST`; `kind` must match. A missing MANIFEST means no complete
// save is there (NotFound). `*text` (when given) receives the MANIFEST's bytes.
StatusOr<Manifest> read_manifest(FileEnv* env, const std::string& path, const std::string& kind,
                                 std::string* text = nullptr);

// Checks that every file `manifest` lists is in `path` with the size it lists (no checksum: a
// cheap look before a load, which verifies them); Corruption naming the first that is not.
Status check_file_sizes(FileEnv* env, const std::string& path, const Manifest& manifest);

// Reads `<path>/<file.name>` and checks its size and checksum against the MANIFEST entry. The
// size is checked before reading: a file larger than the entry says is refused unread.
StatusOr<std::string> read_verified(FileEnv* env, const std::string& path,
                                    const ManifestFile& file);

// A consumer of read_verified_chunks: given the bytes not taken yet (those left over from the
// previous call first) and whether they run to the file's end, it returns how many it took
// from the front (whole records); the last call must take them all.
using ChunkConsumer =
    std::function<StatusOr<std::size_t>(const char* data, std::size_t n, bool last)>;
// read_verified for files too large to hold: streams `<path>/<file.name>` through `consume`,
// reading `chunk_bytes` at a time, so a reader holds one chunk and a record left over, whatever
// the file's size. The size is checked against the entry before reading and as it reads, the
// checksum at the end (the consumer has then seen bytes not yet verified: a loader verifies in
// one pass and applies in a second). When the size or checksum is wrong that is the error, even
// if the consumer refused some bytes first (they were damaged, not misread); a record longer
// than a chunk is refused.
Status read_verified_chunks(FileEnv* env, const std::string& path, const ManifestFile& file,
                            std::size_t chunk_bytes, const ChunkConsumer& consume);

// read_verified_chunks a chunk at a time, for a reader that takes a file's records as another
// file's come (a load's unseen-<shard> along with its part-<shard>): open, next until it says
// the end was given, then finish for the size and checksum (and the consumer's error).
// Thread-safety: one owner (the loading thread of its shard); not shared.
class VerifiedChunkReader {
 public:
  static StatusOr<std::unique_ptr<VerifiedChunkReader>> open(FileEnv* env, const std::string& path,
                                                             const ManifestFile& file,
                                                             std::size_t chunk_bytes);
  // Reads the next chunk and gives `consume` the bytes not taken yet (once the consumer refused
  // some, only the checksum is kept up); false, reading nothing, once the end has been given.
  StatusOr<bool> next(const ChunkConsumer& consume);
  // After next said false: the size, the checksum, then the consumer's error.
  Status finish();

 private:
  VerifiedChunkReader(std::string where, const ManifestFile& file, std::size_t chunk_bytes,
                      std::unique_ptr<SequentialFile> in);
  const std::string where_;
  const ManifestFile file_;
  const std::size_t chunk_bytes_;
  std::unique_ptr<SequentialFile> in_;
  struct FreeHash {
    void operator()(XXH64_state_s* state) const;
  };
  std::unique_ptr<XXH64_state_s, FreeHash> hash_;
  std::string buffer_;  // bytes read and not yet taken by the consumer
  uint64_t read_ = 0;
  bool ended_ = false;
  Status refused_;  // the consumer's error: returned when the bytes prove sound
};

}  // namespace gpubox::table::io
