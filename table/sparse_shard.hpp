// One shard of the host tier: a key -> row index map over chunked row storage in memory, with
// its slice of the disk tier underneath. Every method takes the shard's mutex for its whole
// run, so a shard is thread-safe. A row is in memory or on disk; a row read back from disk keeps
// its disk copy, marked clean until the memory row changes (RowArena::set_epoch), so that
// evicting it unchanged writes nothing. Memory wins: a disk copy of a memory row is never read
// (lookups try memory first, scans skip keys in memory), and eviction writes a changed row over it.
// Bulk methods get the caller's whole arrays plus `pos`, the positions of the keys this shard
// owns (SparseTable groups a batch by host_shard and runs shards in parallel).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.hpp"
#include "common/thread_annotations.hpp"
#include "table/detail/row_arena.hpp"
#include "table/disk_tier.hpp"
#include "table/host_memory_plan.hpp"
#include "table/host_tier.hpp"
#include "table/key_index_map.hpp"
#include "table/row_codec.hpp"
#include "table/sparse_row/accessor.hpp"

namespace gpubox::table {

// Modification epochs shared by the shards of one table. A row changed at epoch e is "dirty"
// for a delta save while e > saved_through.
struct TableEpochs {
  std::atomic<uint32_t> current{1};
  std::atomic<uint32_t> saved_through{0};
  // Deletions are only remembered once a save or load has given deltas a base to apply to.
  std::atomic<bool> track_deletions{false};
};

struct ShardStats {
  uint64_t rows_in_memory = 0;
  uint64_t rows_on_disk = 0;
  uint64_t memory_bytes = 0;
  uint64_t rows_evicted = 0;          // moved memory -> disk since the shard began (budget, shrink)
  uint64_t rows_read_back = 0;        // moved disk -> memory since the shard began
  uint64_t rows_written_through = 0;  // pushed straight over their disk copy since it began
  uint64_t rows_evicted_clean = 0;    // of rows_evicted: unchanged since read back, not written
  uint64_t disk_copies = 0;           // rows in memory whose disk copy is kept (clean or stale)
  uint64_t index_slots = 0;           // of the key index
  uint64_t write_through_slots = 0;   // of the write-through set
};

// One shard's contribution to a save.
struct ShardSnapshot {
  std::string part;  // encoded records
  uint64_t rows = 0;
  std::string deletes;  // encoded keys deleted since the last save (delta only)
  uint64_t deleted = 0;
  // Base and delta: each row of `part`, in its order, as a record of one float, its unseen days
  // (model records do not hold them; a checkpoint's full rows do).
  std::string unseen;
};

// Which rows a delta snapshot holds: those changed after epoch `saved_through`, or every row
// (`every_row`: after a shrink that failed part way, whose aging no loader can replay); its
// deletions are those after `saved_through` either way.
struct DeltaRows {
  uint32_t saved_through = 0;
  bool every_row = false;
};

// One day of shrink's aging of a table row (HostTier::shrink): show and click times
// `decay_rate`, unseen days plus one. True when the rules of `cfg` delete the row. A shrink and a
// loader replaying a delta's recorded shrinks (SparseShard::replay_shrinks) both age through it,
// so that the two give the same bits.
bool age_row_one_day(float* row, const AccessorConfig& cfg, float decay_rate);

class SparseShard {
 public:
  // `disk` may be null (no disk tier). From `plan`: rows_per_shard = rows kept in memory at most
  // and row_bytes_per_shard = their floats and epochs at most (0: no limit; with a disk tier);
  // rows are stored in chunks of rows_per_chunk (a power of two, RowArena). Under a byte budget
  // (row_bytes_per_shard > 0) the index is reserved at index_slots and the write-through set at
  // write_through_slots, at open and again by clear(), so neither grows; a row budget alone
  // reserves nothing (a cap, not memory to take up front). Eviction remembers up to
  // write_through_keys_per_shard keys of pinned rows it sends to disk (0: none).
  SparseShard(uint32_t id, const RowLayout& layout, const AccessorConfig& cfg, DiskTier* disk,
              const HostMemoryPlan& plan, TableEpochs* epochs);

  // pull pins the rows it returns and push unpins the rows it writes: a pinned row is part of a
  // pass in flight (on a card, to be written back at end_pass), and eviction takes it only when
  // every unpinned row has gone to disk. A row pulled and never pushed stays pinned until clear().
  Status pull(const uint64_t* keys, const int32_t* slots, const uint32_t* pos, std::size_t m,
              float* rows, std::size_t* created);
  // HostTier::peek for keys[pos[j]]: reads memory and disk rows as they are, fills the row of a
  // key held nowhere with init_row (not stored), counts those in *unknown. Changes nothing.
  Status peek(const uint64_t* keys, const int32_t* slots, const uint32_t* pos, std::size_t m,
              float* rows, std::size_t* unknown);
  // A key in the write-through set (its row went to disk while pinned) is written over its disk
  // copy without a read; the others are located (read back or created) and overwritten in memory.
  // The row of keys[pos[j]] is rows.row(pos[j]), read to its own width class's stride.
  Status push(const uint64_t* keys, const uint32_t* pos, std::size_t m, PushedRows rows);
  // push of rows packed a record (layout().stride()) apart.
  Status push(const uint64_t* keys, const uint32_t* pos, std::size_t m, const float* rows) {
    return push(keys, pos, m, PushedRows::packed(rows, static_cast<std::size_t>(layout_.stride())));
  }
  Status erase(const uint64_t* keys, const uint32_t* pos, std::size_t m);
  // Decay, age and delete (see HostTier::shrink); then moves rows unseen for at least
  // `cold_after_days` (> 0) to disk. Returns the number of rows deleted. `on_progress` (when set)
  // is called every kShrinkProgressRows entries looked at (disk entries scanned, memory rows
  // aged) and after each disk batch written (deletions, cold rows), under the shard's lock, which
  // the whole shrink of the shard holds: a shard of many rows takes long, and a PULL or PUSH of
  // the shard waits for it.
  static constexpr uint64_t kShrinkProgressRows = 65536;
  // A shrink ages a row without marking it changed (a delta save records the shrink instead,
  // and its loader replays it); a row the shrink deletes is marked.
  StatusOr<uint64_t> shrink(int32_t cold_after_days,
                            const std::function<void()>& on_progress = nullptr);
  // A delta's loader: ages every row (memory and disk) one day per rate of `decay_rates`, in
  // order, all of them in one pass over the rows (to the bits of age_row_one_day a rate), deleting
  // none (the delta's deletions hold the rows its saver's
  // shrinks deleted, and were applied before) and keeping each row's epoch. `on_progress` as
  // shrink's.
  Status replay_shrinks(const std::vector<float>& decay_rates,
                        const std::function<void()>& on_progress = nullptr);

  ShardStats stats();
  // Encodes the rows a save of `mode` holds (delta: changed since epoch `saved_through`).
  // `on_progress` (when set) is called every kSnapshotProgressRows rows looked at: a shard of
  // gigabytes, or of many rows on disk, takes long between file operations.
  static constexpr uint64_t kSnapshotProgressRows = 65536;
  Status snapshot(SaveKind mode, SaveForm form, DeltaRows delta_rows, ShardSnapshot* out,
                  const std::function<void()>& on_progress = nullptr);
  // Forgets deletions a committed save at epoch `through` has recorded.
  void forget_deletions(uint32_t through);
  // Drops every row and remembered deletion.
  Status clear();
  // Writes records (of `kind`) for keys[i] as a load does; loaded rows count as saved. `days`
  // (when set) holds each row's unseen days (a base or delta save's unseen-<shard>), written with
  // it; without, a new row's are 0 and a row held keeps its own.
  Status load_records(RecordKind kind, const uint64_t* keys, const float* recs, const float* days,
                      std::size_t n);
  // Deletes keys (a delta's deletions) without remembering them for the next delta.
  Status load_deletions(const uint64_t* keys, std::size_t n);
  // fn(key, row) for every row, memory and disk.
  Status for_each_row(const std::function<void(uint64_t, const float*)>& fn);

 private:
  // Finds the memory row of each keys[pos[j]], bringing rows back from disk; when `create`,
  // creates missing rows with init_row (slot from slots[pos[j]] or 0). idx[j] = row index or
  // KeyIndexMap::kAbsent. Requires mu_.
  Status locate(const uint64_t* keys, const int32_t* slots, const uint32_t* pos, std::size_t m,
                bool create, std::vector<uint32_t>* idx, std::size_t* created) GPUBOX_REQUIRES(mu_);
  // A new row of width class `width_class` for `key`.
  uint32_t insert_row(uint64_t key, uint32_t epoch, uint32_t width_class) GPUBOX_REQUIRES(mu_);
  // The width class of the rows of `slot`, and of `row` (a record or a stored row); a width this
  // config has no class for is an error naming `key`.
  uint32_t slot_class(int32_t slot) const;
  StatusOr<uint32_t> row_class(uint64_t key, const float* row) const;
  // Copies `row` (own layout) over the stored row of `key` at handle `index`, moving it to the
  // right width class first when it is in another; returns the (possibly new) handle.
  uint32_t store_row(uint64_t key, uint32_t index, uint32_t width_class, const float* row)
      GPUBOX_REQUIRES(mu_);
  // Drops the memory row (its disk copy, if any, stays: eviction's case).
  void remove_row(uint64_t key, uint32_t index) GPUBOX_REQUIRES(mu_);
  // Deletes rows (key, handle) from memory and their disk copies from disk, disk first in
  // batches. When a batch fails, every row stays in memory; those whose copies an earlier batch
  // deleted have no disk copy on record any more. `on_batch` (when set) is called after each
  // batch written (shrink's progress: one batch is up to kDiskBatchEntries erases).
  Status delete_rows(const std::vector<std::pair<uint64_t, uint32_t>>& rows,
                     const std::function<void()>& on_batch = nullptr) GPUBOX_REQUIRES(mu_);
  void note_deleted(uint64_t key) GPUBOX_REQUIRES(mu_);
  // Reserves the maps at their planned sizes (index_reserve_, write_through_reserve_).
  void reserve_maps() GPUBOX_REQUIRES(mu_);
  void mark(uint32_t index) GPUBOX_REQUIRES(mu_) {
    arena_.set_epoch(index, epochs_->current.load());
  }
  // Keys a bulk call handles at a time (all m without a memory limit): the 1/8 of the limits
  // (rows, and bytes at the widest row) that eviction frees (at least 1), so that a piece fits
  // after enforce_memory_limit of it.
  std::size_t piece_keys(std::size_t m) const;
  // What locating keys[pos[0..m)] may add to memory: `rows` not in memory (a repeated key counts
  // each time), and `bytes`, the widest row's for each of them and, with `pushed` (the rows of
  // a push), a row of the new class for each row the push moves to another width class. m rows
  // and m widest rows when that cannot reach a limit. Requires mu_.
  struct Incoming {
    std::size_t rows;
    uint64_t bytes;
  };
  Incoming incoming(const uint64_t* keys, const uint32_t* pos, std::size_t m,
                    const PushedRows* pushed) const GPUBOX_REQUIRES(mu_);
  // Before rows come in: when they could take memory over a limit (rows, or the row storage's
  // allocated bytes), compacts the row storage (byte limit), then moves rows to disk, unpinned
  // before pinned and lowest score first (then longest unseen), until at most min(7/8 of the
  // limit, limit - incoming) stay, for rows and for bytes, and compacts again. Requires mu_.
  Status enforce_memory_limit(Incoming in) GPUBOX_REQUIRES(mu_);
  // Gives back the row storage's chunks beyond what the live rows need (RowArena::compact),
  // re-pointing the index at the rows it moves. Requires mu_; invalidates handles held.
  void compact_arenas() GPUBOX_REQUIRES(mu_);
  // Writes the keys of keys[pos[0..m)] that are in the write-through set straight to disk (the
  // row as pushed, unseen days 0, this epoch) and drops them from the set; moves the positions
  // of the other keys to the front of *rest (resized to their count). Requires mu_.
  Status write_through(const uint64_t* keys, const uint32_t* pos, std::size_t m, PushedRows rows,
                       std::vector<uint32_t>* rest) GPUBOX_REQUIRES(mu_);
  // Applies the shrink rules to one row in place (age_row_one_day at this config's decay rate);
  // true when the row must be deleted.
  bool age_row(float* row) const { return age_row_one_day(row, cfg_, cfg_.show_click_decay_rate); }
  // shrink's part on disk: ages the rows only on disk (not those with a memory row, aged in
  // memory), deleting those the rules delete; returns how many.
  // `aged` is called once per disk entry scanned, a copy of a memory row too (shrink's progress
  // count: a disk tier of many copies is a long scan that ages nothing).
  StatusOr<uint64_t> age_disk_rows(const std::function<void()>& aged) GPUBOX_REQUIRES(mu_);
  // A memory row leaving for the disk tier.
  struct Victim {
    uint64_t key;
    uint32_t index;
    bool pinned;  // its pass writes it back: later pushes of it go to disk (write_through_)
  };
  // enforce_memory_limit's choice: at least `rows` rows, and rows whose storage adds up to at
  // least `bytes`, unpinned before pinned, lowest score then longest unseen first; in key order.
  std::vector<Victim> coldest_rows(std::size_t rows, uint64_t bytes) GPUBOX_REQUIRES(mu_);
  // Writes `victims` (in key order: RocksDB's memtable inserts walk forward, and its files come
  // out with fewer overlaps to compact) to disk in batches, a clean disk copy left as it is, and
  // drops their memory rows. `on_batch` (when set) is called after each batch written.
  Status evict(const std::vector<Victim>& victims, const std::function<void()>& on_batch = nullptr)
      GPUBOX_REQUIRES(mu_);
  // Disk batches are written in pieces of this many entries, so a shrink over a large disk tier
  // does not build one huge batch.
  static constexpr std::size_t kDiskBatchEntries = 1 << 16;

  const uint32_t id_;
  const RowLayout layout_;  // the records' (widest class's); rows are stored at their own width
  const AccessorConfig& cfg_;
  DiskTier* const disk_;
  const uint64_t memory_limit_;  // rows
  const uint64_t byte_limit_;    // floats and epochs of the rows' storage as allocated (0: none)
  // Slots the key index and the write-through set are reserved at, at open and after clear()
  // (0: not reserved, they grow with their keys).
  const std::size_t index_reserve_;
  const std::size_t write_through_reserve_;
  TableEpochs* const epochs_;
  const WidthClasses classes_;

  Mutex mu_;
  KeyIndexMap index_ GPUBOX_GUARDED_BY(mu_);  // key -> detail::RowArenas handle
  detail::RowArenas arena_ GPUBOX_GUARDED_BY(mu_);
  const std::size_t widest_row_bytes_;  // floats and epoch of a row of the widest class
  uint64_t rows_on_disk_ GPUBOX_GUARDED_BY(mu_) = 0;
  uint64_t rows_evicted_ GPUBOX_GUARDED_BY(mu_) = 0;
  uint64_t rows_read_back_ GPUBOX_GUARDED_BY(mu_) = 0;
  uint64_t rows_written_through_ GPUBOX_GUARDED_BY(mu_) = 0;
  uint64_t rows_evicted_clean_ GPUBOX_GUARDED_BY(mu_) = 0;
  uint64_t disk_copies_ GPUBOX_GUARDED_BY(mu_) =
      0;  // memory rows with a disk copy (detail::RowArena::disk_copy)
  std::vector<std::pair<uint64_t, uint32_t>> deleted_ GPUBOX_GUARDED_BY(mu_);  // (key, epoch)
  // Keys on disk whose rows were pinned when evicted (their pass will push them whole); the
  // value is unused. Invariant: every key here is on disk and not in memory (a read-back,
  // deletion or clear drops it).
  const uint64_t write_through_limit_;
  KeyIndexMap write_through_ GPUBOX_GUARDED_BY(mu_);
};

}  // namespace gpubox::table
