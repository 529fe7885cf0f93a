// PassPipeline: runner.prefetch_passes, PaddleRec GPUBox's pre-build thread. While pass k
// trains, each of the next `depth` passes is read and shuffled, its unique keys collected and
// its host-tier rows staged (tier_owner::CardTier::stage_rows), on a thread of its own; begin_pass
// of the pass then only inserts the staged rows and pulls what changed since.
//
// Exactness: a pass's staging excludes the keys of every pass that trains before it from the
// moment the staging starts (the pass training then, and the passes between): those are the only
// rows whose host-tier value can still change before its begin_pass, and they are on the cards
// or pulled by begin_pass itself. It also skips the keys on the cards when it starts (listed on the
// controlling thread between begin_pass and the steps): begin_pass evicts only keys its pass
// lacks, so those are hits and their staged rows would go unused (a key evicted in between by an
// evaluation pass is pulled). A job starts only after the previous pass's end_pass, so with
// the pipeline on or off every begin_pass places the same values (tested bit for bit).
// Rows new to the host tier are created by the staging (same seeded rules, created earlier).
//
// Memory: at most `depth` passes ahead, each its InMemoryDataset and its staged rows (their
// sizes are logged when the pass is taken, beside runner.host_memory_mb). They are not part of
// the host table's budget (nor is the list of keys on the cards, 8 bytes a key, while a staging
// runs): a trainer's host memory is about host_memory_mb (the table) plus
// (1 + depth) data sets plus depth × (the staged keys × staged_bytes_per_key(stride)), and, with
// runner.shuffle, one data set more while a pass read ahead is copied into its shuffled order
// (InMemoryDataset::store_in_order; skipped, logged, when that copy would not fit in the memory
// left); size host_memory_mb with that room left (docs/user-guide.md, "The pass pipeline"). A
// failure to stage (the host tier) is logged and the pass's begin_pass pulls its rows as without
// the pipeline; a failure to read the pass is thrown by take() for that pass, as reading it then
// would.
//
// Thread-safety: one controlling thread calls the methods; the jobs read the config, the files
// and the host tier only.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <vector>

#include "dataset/dataset_types.hpp"
#include "heterps/pass/pass_types.hpp"
#include "trainer/engine/step_sizes.hpp"

namespace gpubox {
namespace dataset {
class InMemoryDataset;
class QueueDataset;
}  // namespace dataset
namespace tier_owner {
class CardTier;
}
namespace trainer {

// One pass ready for its begin_pass.
struct PreparedPass {
  int64_t pass = 0;
  // runner.reader_type InmemoryDataset: the pass read, its `keys` taken, shuffled and stored in
  // that order. QueueDataset: `stream`, read once for `keys` (scan), streamed again by the steps.
  std::unique_ptr<dataset::InMemoryDataset> data;
  std::unique_ptr<dataset::QueueDataset> stream;
  // Its unique keys and their slots, aligned: as the data set gave them (shared with it and the
  // pass cache, not copied), sorted by prepare_pass when they were not ascending.
  std::shared_ptr<const dataset::UniqueKeys> keys;
  // keys->keys, ascending (shared: the next pass's card work reads them while this pass trains).
  std::shared_ptr<const std::vector<uint64_t>> sorted_keys;
  // Every step's sizes (InmemoryDataset only; null for a stream): the cards size their step
  // buffers for the largest before the first step. Computed with the read, ahead when prefetched.
  std::shared_ptr<const PassStepSizes> step_sizes;
  pass::StagedRows staged;    // rows fetched ahead (empty when not prefetched)
  bool prefetched = false;    // read (and staged) ahead by the pipeline
  double read_seconds = 0;    // reading, shuffling and the keys (in the background if prefetched)
  double waited_seconds = 0;  // what take() waited for it on the controlling thread
};

// Reads pass `pass`'s files (its slice of the schedule, shuffled with that pass's seed) into
// `into`: its `data` or its `stream`, and its `keys` (unsorted is allowed). The trainer's own
// reading, so a pass read ahead is the one read in place.
using ReadPass = std::function<void(int64_t pass, PreparedPass* into)>;

// Reads pass `pass` now, its keys in ascending order (no staging).
std::unique_ptr<PreparedPass> prepare_pass(const ReadPass& read, int64_t pass);

// Host bytes a staged key takes (StagedRows: its row of `stride` floats, the key twice and its
// slot).
std::size_t staged_bytes_per_key(int32_t stride);

class PassPipeline {
 public:
  // `depth` passes ahead at most (0: off, every pass is read by take()). `tier` and `read` are
  // borrowed and must outlive the pipeline. `host_budget_bytes` (runner.host_memory_mb, 0: none)
  // is only printed beside what a pass read ahead holds. `staging_nice` (runner.staging_nice):
  // added to the nice value of each job's thread (and the threads it starts; the host-tier pulls
  // of its staging run on the pass cards' staging threads, lowered as much through
  // PassManagerOptions::staging_nice), so the steps get the cores first; 0: the same priority as
  // the steps.
  PassPipeline(tier_owner::CardTier& tier, int depth, ReadPass read, uint64_t host_budget_bytes = 0,
               int staging_nice = 0);
  // Waits for the jobs in flight.
  ~PassPipeline();
  PassPipeline(const PassPipeline&) = delete;
  PassPipeline& operator=(const PassPipeline&) = delete;

  // Pass `pass`: the one started ahead (waiting for it), or read now when none was.
  std::shared_ptr<PreparedPass> take(int64_t pass);
  // Starts the passes after `current` (begun or about to; the previous pass has ended) up to
  // current.pass + depth and before `end`, those not started yet.
  void start_after(const PreparedPass& current, int64_t end);
  // The sorted unique keys of pass `pass` when it was started ahead (waiting for its read, not
  // for its staging), else null; null too when it could not be read.
  std::shared_ptr<const std::vector<uint64_t>> keys_of(int64_t pass) const;
  // For the cards' work on pass `pass` while the pass before it trains
  // (tier_owner::CardTier::expect_next_pass): a function reporting its staging
  // (pass::StagingProgress: its keys once read and planned, its rows once fetched; nothing when
  // reading it failed, the keys but never the rows when fetching them failed), or an empty function
  // when it was not started ahead. What it reports stays valid while the function (or a copy)
  // lives.
  std::function<pass::StagingProgress()> staged_poll(int64_t pass) const;
  // Waits for the jobs in flight (before a save, so the save sees no staging under way).
  void wait();
  // Waits for pass `pass`'s job (read, planned and fetched, or failed: take() reports it) when it
  // was started ahead.
  void wait_for(int64_t pass) const;
  // Drops every pass started ahead, after waiting for it (before a model load: its staged rows
  // would be stale).
  void clear();
  int depth() const { return depth_; }

 private:
  struct Job {
    int64_t pass = 0;
    std::shared_future<std::shared_ptr<PreparedPass>> ready;
    // Its sorted keys, set once read (before the staging); null when the read failed.
    std::shared_future<std::shared_ptr<const std::vector<uint64_t>>> keys;
    // The pass once its staging is planned (its keys split by card, before the fetch); null
    // when reading or planning failed.
    std::shared_future<std::shared_ptr<PreparedPass>> planned;
  };

  tier_owner::CardTier& tier_;
  int depth_ = 0;
  ReadPass read_;
  uint64_t host_budget_bytes_ = 0;
  int staging_nice_ = 0;
  std::deque<Job> jobs_;  // in pass order
};

}  // namespace trainer
}  // namespace gpubox
