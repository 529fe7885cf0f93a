// PassDataCache: the parsed records of file lists a run already read, so that a later load of
// the same list (the same pass in the next epoch, the evaluation data after every epoch) borrows
// them instead of reading and parsing the files again. InMemoryDataset::load_into_memory uses it
// when given one (set_pass_cache), for every schedule alike.
//
// What is kept: a load's blocks in load order and its LoadStats, exactly as the files gave them;
// the loading dataset appends them as it would have appended a fresh parse, so the pass's shuffle
// (seeded per pass, applied after the load) and everything after it see the same records in the
// same order: training with the cache is bit for bit training without it.
//
// Shared, not copied: the blocks are immutable once loaded (SharedInstanceBlock), so the load
// that offers them keeps them too, and a load served gets the same blocks, not copies (a served
// load costs a pointer a block, whatever the pass's size). No data set writes into its blocks
// (its shuffle permutes its order index; store_in_order copies into new blocks), so what one
// pass does to its instances never reaches what the cache serves the next. Memory: an entry's
// bytes are its blocks' (and its names'), counted once in the budget whether or not data sets
// borrow them meanwhile: what the cache alone keeps alive once those data sets are released
// (InMemoryDataset::shared_bytes() is the part of a data set's memory counted here).
//
// With a load it keeps its unique keys (InMemoryDataset::unique_keys_and_slots, a function of the
// blocks in load order alone) once a data set holding just those blocks computed them
// (remember_unique_keys), when they fit in what the budget has left: a data set served then takes
// them instead of going over every key occurrence of the pass again (the larger part of reading a
// served pass, more than the load itself was). Records first: the keys count in the budget, and a
// load whose records do not fit in what is left takes the room of other loads' keys (dropped,
// those loads still served their records) when that makes it fit, so the budget keeps the records
// of as many loads as it would without the keys.
//
// When a load is served: the same file list, in the same order, parsed with the same parse
// settings (parse_fingerprint), each file still the file that was read (a regular file of the
// same size, modification and status-change time, inode and device; a file rewritten or replaced
// between epochs is read again, and its entry dropped; a file gone drops every entry of its
// list). The status-change time moves on every write (touch or cp -p may set the modification
// time back, not it); a file rewritten to the same size within one tick of the kernel's file
// clock is not seen. A load during which a file changed (its identity taken again after the
// read differs) is not kept.
//
// What is not kept: loads through a pipe_command (its output need not be a function of the file:
// a command may sample, read other files or fetch remote data, and PaddleRec runs it every
// epoch), in-memory sources, loads that failed or were stopped, and any load whose records do not
// fit in what the budget has left (with the room of the keys kept). Records are never evicted to
// make room: the passes of a run come round in the same order every epoch, and for such a cycle
// keeping the first passes that fit serves as many loads as any eviction policy would, without
// reading them again.
//
// Thread-safety: every member may be called concurrently (a pass read ahead on the staging
// thread while the evaluation data loads on the controlling one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/thread_annotations.hpp"
#include "dataset/dataset_types.hpp"
#include "dataset/instance_block.hpp"

namespace gpubox::dataset {

// What identifies one file's content between epochs.
struct FileIdentity {
  std::uint64_t size = 0;
  std::int64_t mtime_ns = 0;
  std::int64_t ctime_ns = 0;
  std::uint64_t inode = 0;
  std::uint64_t device = 0;
  bool operator==(const FileIdentity& o) const {
    return size == o.size && mtime_ns == o.mtime_ns && ctime_ns == o.ctime_ns && inode == o.inode &&
           device == o.device;
  }
  bool operator!=(const FileIdentity& o) const { return !(*this == o); }
};

// The identities of `files`, in order; false when one is not a regular file that stat can see
// (such a list is not cached).
bool identify_files(const std::vector<std::string>& files, std::vector<FileIdentity>* out);

// The settings that decide what records (and load statistics) a file parses to: the format, the
// slots, dense_dim and the names, the parse options, the split of large files into blocks. Two
// configs with the same fingerprint parse every file alike; it is exact (the settings' text).
std::string parse_fingerprint(const DatasetConfig& config);

// What a cached load is kept under: the parse settings' fingerprint and the file list, in order.
struct PassKey {
  std::string parse;
  std::vector<std::string> files;
  bool operator<(const PassKey& o) const {
    return parse != o.parse ? parse < o.parse : files < o.files;
  }
};

// What a cache served and kept over its life.
struct PassCacheCounts {
  std::uint64_t loads_served = 0;        // loads answered from the cache
  std::uint64_t instances_served = 0;    // their instances
  std::uint64_t unique_keys_served = 0;  // of those loads, the ones that took their unique keys too
  std::size_t entries = 0;               // file lists held
  std::size_t bytes = 0;  // what they take: records, blocks, file names, identities, unique keys
  std::size_t unique_keys_bytes = 0;  // of `bytes`, the unique keys'
};

class PassDataCache {
 public:
  // Holds at most `budget_bytes` of records and unique keys (0: holds nothing, every load reads
  // its files).
  explicit PassDataCache(std::size_t budget_bytes) : budget_bytes_(budget_bytes) {}
  PassDataCache(const PassDataCache&) = delete;
  PassDataCache& operator=(const PassDataCache&) = delete;

  std::size_t budget_bytes() const { return budget_bytes_; }

  // What a load served gets.
  struct Served {
    std::vector<SharedInstanceBlock> blocks;  // the load's, in load order (shared, not copied)
    LoadStats stats;                          // the load's statistics
    // The unique keys of a data set holding just `blocks`; null until remembered (and when not
    // asked for).
    std::shared_ptr<const UniqueKeys> unique_keys;
  };
  // When `key` (with these identities, taken now) was loaded before and no file changed: sets
  // `*served` to what was kept of it, its unique keys only `with_unique_keys` (the caller will
  // hold just this load: counted as served then), and returns true. An entry whose files changed
  // is dropped (the load that follows reads them and offers them again).
  bool lookup(const PassKey& key, const std::vector<FileIdentity>& identities,
              bool with_unique_keys, Served* served);
  // Drops every entry of `files` (one of them could not be identified: gone, or no longer a
  // regular file), so that it holds none of the budget.
  void forget(const std::vector<std::string>& files);
  // What offer did with a load.
  struct Offered {
    bool kept = false;  // its blocks are the entry of its key now (shared with the offering load)
    std::string note;   // why not kept, for the load's report: only the first load that did not fit
  };
  // Keeps a finished load of `key` (`identities` taken before it read the files, and the same
  // after), sharing its blocks, when its records fit in what the budget has left once the unique
  // keys of other loads are dropped as needed, and no load of `key` is held already.
  Offered offer(const PassKey& key, const std::vector<FileIdentity>& identities,
                const std::vector<SharedInstanceBlock>& blocks, const LoadStats& stats);
  // Keeps `unique_keys`, those of a data set holding just `blocks` (a load of `key` it was served
  // or that was kept), with the entry of `key` while that entry holds these same blocks, when
  // they fit in what the budget has left and none are kept yet; later lookups serve them, until
  // a load's records need their room (offer).
  void remember_unique_keys(const PassKey& key, const std::vector<SharedInstanceBlock>& blocks,
                            std::shared_ptr<const UniqueKeys> unique_keys);

  PassCacheCounts counts() const;

 private:
  struct Entry {
    std::vector<FileIdentity> identities;
    std::vector<SharedInstanceBlock> blocks;
    LoadStats stats;
    std::shared_ptr<const UniqueKeys> unique_keys;  // null until remembered
    std::size_t unique_keys_bytes = 0;              // their part of `bytes`
    std::size_t bytes = 0;                          // all of the above
  };
  using Entries = std::map<PassKey, std::shared_ptr<const Entry>>;

  // The bytes an entry of `key` holding `blocks` counts in the budget.
  static std::size_t entry_bytes(const PassKey& key,
                                 const std::vector<SharedInstanceBlock>& blocks);
  // Drops the entry at `it` and returns the next.
  Entries::iterator erase_entry(Entries::iterator it) GPUBOX_REQUIRES(mu_);
  // Drops remembered unique keys until `bytes` fit in what the budget has left (records first);
  // false, dropping none, when even all of them would not make room.
  bool make_room(std::size_t bytes) GPUBOX_REQUIRES(mu_);

  const std::size_t budget_bytes_;
  mutable Mutex mu_;
  Entries entries_ GPUBOX_GUARDED_BY(mu_);
  std::size_t held_bytes_ GPUBOX_GUARDED_BY(mu_) = 0;
  std::size_t unique_keys_bytes_ GPUBOX_GUARDED_BY(mu_) = 0;  // of held_bytes_
  bool refusal_noted_ GPUBOX_GUARDED_BY(mu_) = false;
  std::uint64_t loads_served_ GPUBOX_GUARDED_BY(mu_) = 0;
  std::uint64_t instances_served_ GPUBOX_GUARDED_BY(mu_) = 0;
  std::uint64_t unique_keys_served_ GPUBOX_GUARDED_BY(mu_) = 0;
};

}  // namespace gpubox::dataset
