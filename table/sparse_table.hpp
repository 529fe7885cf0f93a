// SparseTable: the in-process host tier. Rows are sharded by host_shard(key); each shard keeps
// a key -> row index map over chunked row storage (rows never move), and, with a disk tier
// configured, spills cold rows to RocksDB and brings them back on pull. Bulk calls group keys by
// shard and run shards in parallel.
//
// Thread-safety: every method may be called from any thread at once. Each bulk call is atomic
// per shard, not across shards; save() sees each shard at one instant (quiesce pushes first for
// a table-wide snapshot). save/load calls are serialized among themselves.
//
// Save folders (see table/io/save_dir.hpp for the MANIFEST and the atomic commit):
//   part-<shard>    records of that shard (table/row_codec.hpp): model records for base and
//                   delta, full rows for checkpoint; text or binary per HostTableConfig::save_form
//   delete-<shard>  delta only: keys deleted (erase/shrink) since the previous save
//   unseen-<shard>  base and delta: each row of part-<shard>'s unseen days, a record of one float
//                   (MANIFEST property unseen_files=1; a checkpoint's full rows hold them)
// A shrink ages rows without marking them changed. A delta save after shrinks records them
// instead (MANIFEST mode delta+shrinks, shrinks = how many, shrink_decay_rates = their
// show_click_decay_rate in order), so that it holds only the rows written since plus deletions;
// after a shrink that failed part way, or a save whose commit failed or threw once its rename
// may have put it in place, the next delta holds every row (every_row=1).
// A base or checkpoint load replaces the table; a delta load applies onto it: deletions, then
// the recorded shrinks replayed on every row the table holds (SparseShard::replay_shrinks), then
// its rows, each written with its unseen days (read along from unseen-<shard>: UnseenAlong). A save
// without unseen files (from before them) loads its rows' unseen days as 0 (a delta's rows already
// held keep theirs), said once per load. Loading into a table with another shard count is fine
// (keys are re-sharded); the row layout must match. load reads and checks every file before it
// changes the table, so a corrupt, partial or foreign save is refused with the table untouched;
// only an I/O or disk-tier error while applying an already verified save can leave the table partly
// loaded (the error says so); such a table refuses a delta load until a base or checkpoint load
// succeeds.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/thread_annotations.hpp"
#include "table/disk_tier.hpp"
#include "table/host_memory_plan.hpp"
#include "table/host_table_types.hpp"
#include "table/host_tier.hpp"
#include "table/io/file_env.hpp"
#include "table/sparse_shard.hpp"

namespace gpubox::table {
namespace io {
struct Manifest;
}  // namespace io

class SparseTable final : public HostTier {
 public:
  // Checks the options (check_options) and opens the disk tier when configured.
  static StatusOr<std::unique_ptr<SparseTable>> open(const AccessorConfig& optimizer,
                                                     const HostTableConfig& config);
  // The checks open() makes before any I/O: shards > 0, mf_dim >= 0, and a disk tier for a row
  // or byte budget or cold_after_days (the trainer makes them before it plans the cards, so a
  // budget without rocksdb_path is named first).
  static Status check_options(const AccessorConfig& optimizer, const HostTableConfig& config);
  ~SparseTable() override;

  const RowLayout& layout() const override { return layout_; }
  const AccessorConfig& config() const override { return optimizer_; }
  const HostTableConfig& table_config() const { return config_; }

  Status pull(const uint64_t* keys, const int32_t* slots, std::size_t n, float* rows,
              std::size_t* created) override;
  Status peek(const uint64_t* keys, const int32_t* slots, std::size_t n, float* rows,
              std::size_t* unknown) override;
  Status push(const uint64_t* keys, std::size_t n, const float* rows) override;
  bool pushes_by_address() const override { return true; }
  // Reads each row where it lies (no packing): push and push_at are one algorithm over a
  // PushedRows view.
  Status push_at(const uint64_t* keys, std::size_t n, const float* const* rows) override;
  Status erase(const uint64_t* keys, std::size_t n) override;
  StatusOr<HostTierStats> stats() override;
  // One day passes: decay, age, delete (HostTier::shrink), then rows unseen for at least
  // cold_after_days move to disk. Advances day(). Serialized with save and load (io_mu_): the
  // shrinks a delta records are those between two saves. A shrink that fails part way makes
  // the next delta save hold every row. `on_progress`: after each shard, and within one
  // (under its lock) every SparseShard::kShrinkProgressRows entries and after each disk batch.
  // A shard is locked for its whole shrink: PULL and PUSH of it wait, on the server's network
  // threads; when they all wait, no PROGRESS frame is sent (see HostTier::shrink).
  using HostTier::shrink;
  StatusOr<uint64_t> shrink(const std::function<void()>& on_progress) override
      GPUBOX_EXCLUDES(io_mu_);

  using HostTier::load;
  using HostTier::save;
  // Saves in config().save_form. `env` null: the table's own (HostTableConfig::env).
  Status save(const std::string& path, SaveKind mode, io::FileEnv* env) override {
    return save(path, mode, config_.save_form, env);
  }
  Status save(const std::string& path, SaveKind mode, SaveForm form, io::FileEnv* env = nullptr)
      GPUBOX_EXCLUDES(io_mu_);
  Status load(const std::string& path, io::FileEnv* env) override GPUBOX_EXCLUDES(io_mu_);

  // Day counter: shrinks since the table began (checkpoints keep it).
  int64_t day() const { return day_.load(); }
  void set_day(int64_t day) { day_.store(day); }

  // Rows in memory and on disk.
  StatusOr<uint64_t> size();
  // Rows moved between memory and the disk tier since open, all shards.
  struct DiskTraffic {
    uint64_t rows_evicted = 0;          // memory -> disk (the budget, shrink's cold rows)
    uint64_t rows_read_back = 0;        // disk -> memory (pull, push, load, erase of a disk row)
    uint64_t rows_written_through = 0;  // pushed over their disk copy, not read back
    uint64_t rows_evicted_clean = 0;    // of rows_evicted: unchanged since read back, not written
    DiskTier::Traffic disk;             // puts, deletes and bytes put into RocksDB
  };
  DiskTraffic disk_traffic();
  // fn(key, row) for every row (memory and disk), one shard at a time under its lock. fn must
  // not call back into the table.
  Status for_each_row(const std::function<void(uint64_t, const float*)>& fn);
  // The disk tier (null without one), for tests' fault injection (DiskTier::fail_writes_after).
  DiskTier* disk_tier_for_tests() { return disk_.get(); }
  // Fault injection for tests (as DiskTier::fail_writes_after): once `ok_pulls` more pull()s
  // have succeeded, the next `failing` ones fail (IOError, nothing read or created), and the
  // ones after succeed again; ok_pulls -1 (the default): never. One atomic load a pull when off.
  void fail_pulls_after(int64_t ok_pulls, int64_t failing = 1) {
    failing_pulls_.store(failing);
    pulls_before_fault_.store(ok_pulls);
  }

 private:
  // The save's slot_dims (MANIFEST) against this table's: an error naming the first slot whose
  // width differs.
  Status check_slot_dims(const io::Manifest& manifest, const std::string& where) const;
  // The save's record layout (MANIFEST: storage, slot widths, mf_dim, record size, and a
  // checkpoint's optimizer) against this table's: an error naming the first that differs.
  Status check_saved_layout(const io::Manifest& manifest, RecordKind kind,
                            const std::string& where) const;
  SparseTable(const AccessorConfig& optimizer, const HostTableConfig& config,
              const HostMemoryPlan& plan, std::unique_ptr<DiskTier> disk);
  // push and push_at: the keys grouped by shard, each shard's rows written by its push (the
  // shards in parallel from kParallelKeys keys).
  Status push_rows(const uint64_t* keys, std::size_t n, PushedRows rows);
  // Below this many keys (or rows) a call runs its shards inline: starting a thread team costs
  // more than it saves, and much more on an oversubscribed machine.
  static constexpr std::size_t kParallelKeys = 4096;
  uint64_t rows_now();
  // Runs fn(shard) for every shard with work (in parallel when `parallel`); first error wins.
  Status for_shards(bool parallel, const std::function<Status(uint32_t)>& fn);
  // Groups positions 0..n-1 by shard: positions of shard s are pos[offsets[s] .. offsets[s+1]).
  void group(const uint64_t* keys, std::size_t n, std::vector<uint32_t>* offsets,
             std::vector<uint32_t>* pos) const;
  // pull (`create`) or peek: the shards' `access` over the keys grouped by shard.
  template <class Access>
  Status for_keys_by_shard(const char* what, const uint64_t* keys, std::size_t n, float* rows,
                           std::size_t* counted, Access access);
  // A part file's records, with their rows' unseen days (`days`, a record's at its place; null:
  // a save without unseen files).
  Status apply_part(RecordKind kind, const std::vector<uint64_t>& keys,
                    const std::vector<float>& recs, const std::vector<float>* days);
  Status apply_deletions(const std::vector<uint64_t>& keys);
  // A delta's MANIFEST properties for the shrinks since the last save (sparse_table_io.cpp).
  void add_shrinks(bool every_row, std::map<std::string, std::string>* props) const
      GPUBOX_REQUIRES(io_mu_);
  // Refuses a delta (`delta`) load at `path` onto a table partly loaded (partly_loaded_).
  Status check_base_of(const std::string& path, bool delta) const GPUBOX_REQUIRES(io_mu_);
  // A load's replay of a delta's recorded shrinks on every row held, each shard a step.
  Status replay_shrinks(const std::vector<float>& decay_rates, io::FileEnv* fs)
      GPUBOX_REQUIRES(io_mu_);
  // A load's changes to the table (`apply`) and their outcome: on success the table is the save
  // at `path` (of day `day`); on failure the table holds part of it (partly_loaded_), or, when it
  // had `nothing_to_lose`, is emptied again.
  Status apply_load(const std::string& path, int64_t day, bool nothing_to_lose, io::FileEnv* fs,
                    const std::function<Status()>& apply) GPUBOX_REQUIRES(io_mu_);
  // A base or checkpoint load's clear of every shard, each shard a step (fs->note_progress).
  Status clear_for_load(io::FileEnv* fs) GPUBOX_REQUIRES(io_mu_);

  const AccessorConfig optimizer_;
  const HostTableConfig config_;
  const RowLayout layout_;
  io::FileEnv* const env_;
  std::unique_ptr<DiskTier> disk_;
  TableEpochs epochs_;
  std::vector<std::unique_ptr<SparseShard>> shards_;
  std::atomic<int64_t> day_{0};
  std::atomic<int64_t> pulls_before_fault_{-1};  // fail_pulls_after
  std::atomic<int64_t> failing_pulls_{0};
  // Held by a save, load or shrink for its whole run: one at a time.
  Mutex io_mu_;
  // The decay rates of the shrinks since the last save or load, in order (recorded once a save
  // or load has given deltas a base): what the next delta's loader replays.
  std::vector<float> shrinks_since_save_ GPUBOX_GUARDED_BY(io_mu_);
  // The next delta holds every row (every_row): a shrink failed part way since the last save or
  // load, whose aging no loader can replay; or a save's commit failed or threw after it may have
  // put the save in place, so that whether the next delta applies onto it or onto the save before
  // is unknown (every row applies onto either).
  bool next_delta_every_row_ GPUBOX_GUARDED_BY(io_mu_) = false;
  // The save whose load failed while applying it (the table holds part of it; "" when none):
  // a delta load on top is refused until a base or checkpoint load succeeds.
  std::string partly_loaded_ GPUBOX_GUARDED_BY(io_mu_);
};

}  // namespace gpubox::table
