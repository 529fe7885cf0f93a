// The sparse table's shrink as the epoch loop runs it (runner.shrink_every): one "day" of the
// accessor's rules (HostTier::shrink: show/click decay, deletion by delete_threshold and
// delete_after_unseen_days, rows unseen runner.cold_after_days moved to disk), logged at INFO.
#pragma once

#include <cstdint>

#include "table/host_tier.hpp"
#include "trainer/config/trainer_config.hpp"

namespace gpubox::trainer {

struct ShrinkOutcome {
  uint64_t rows_deleted = 0;
  // Rows moved from memory to the disk tier (the in-process table counts them exactly; for a
  // remote tier, the growth of its rows on disk, which deletions on disk may hide).
  uint64_t rows_to_disk = 0;
  double seconds = 0;
};

// Whether runner.shrink_every shrinks the table after pass `pass` (`ends_epoch`: it is its
// epoch's last).
bool shrinks_after(const RunnerConfig& runner, bool ends_epoch);

// The end (exclusive) of the passes that may be read and staged while pass `pass` trains: the
// first pass after the next shrink (staging pulls rows, which resets their unseen days before
// the shrink ages them), or `total` when none comes. Passes `per_epoch` an epoch.
int64_t staged_ahead_end(const RunnerConfig& runner, int64_t per_epoch, int64_t total,
                         int64_t pass);

// Shrinks `tier` once (one day), after pass `pass`, and logs what it did at INFO. Throws
// gpubox::Error naming the pass when the tier fails. The caller makes sure that no card holds
// rows the tier would delete (they are written back and dropped first).
ShrinkOutcome shrink_logged(table::HostTier& tier, int64_t pass);

}  // namespace gpubox::trainer
