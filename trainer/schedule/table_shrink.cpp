#include "trainer/schedule/table_shrink.hpp"

#include <algorithm>
#include <chrono>
#include <string>

#include "common/logging.hpp"
#include "common/status.hpp"
#include "table/sparse_table.hpp"

namespace gpubox::trainer {
namespace {

// Rows on the tier's disk, or 0 when its stats fail (the log line only).
uint64_t rows_on_disk(table::HostTier& tier) {
  const auto stats = tier.stats();
  return stats.ok() ? stats->rows_on_disk : 0;
}

}  // namespace

bool shrinks_after(const RunnerConfig& runner, bool ends_epoch) {
  switch (runner.shrink_every) {
    case ShrinkEvery::kNever:
      return false;
    case ShrinkEvery::kPass:
      return true;
    case ShrinkEvery::kEpoch:
      return ends_epoch;
  }
  return false;
}

int64_t staged_ahead_end(const RunnerConfig& runner, int64_t per_epoch, int64_t total,
                         int64_t pass) {
  switch (runner.shrink_every) {
    case ShrinkEvery::kNever:
      return total;
    case ShrinkEvery::kPass:
      return std::min(total, pass + 1);
    case ShrinkEvery::kEpoch:
      // The shrink follows the epoch's last pass, (pass / per_epoch + 1) * per_epoch - 1.
      return std::min(total, (pass / per_epoch + 1) * per_epoch);
  }
  return total;
}

ShrinkOutcome shrink_logged(table::HostTier& tier, int64_t pass) {
  const std::string where = "shrinking the sparse table after pass " + std::to_string(pass);
  auto* table = dynamic_cast<table::SparseTable*>(&tier);
  const uint64_t evicted_before = table != nullptr ? table->disk_traffic().rows_evicted : 0;
  // One look at the tier before (a remote tier's is a request): its rows, and those on disk.
  const auto before = tier.stats();
  const uint64_t rows_before = before.ok() ? before->rows_in_memory + before->rows_on_disk : 0;
  const uint64_t disk_before = table != nullptr || !before.ok() ? 0 : before->rows_on_disk;
  const auto start = std::chrono::steady_clock::now();
  StatusOr<uint64_t> deleted = tier.shrink();
  throw_if_error(deleted.status().with_context(where));
  ShrinkOutcome outcome;
  outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  outcome.rows_deleted = *deleted;
  std::string disk;
  if (table != nullptr) {
    outcome.rows_to_disk = table->disk_traffic().rows_evicted - evicted_before;
    disk = std::to_string(outcome.rows_to_disk) + " rows moved to disk";
  } else {
    // The servers count no moves, only the rows on disk: the shrink's deletions there cancel
    // moves out of that count, so it is said as the count it is (it read as rows moved: 12,145
    // where 19,051 moved).
    const uint64_t disk_after = rows_on_disk(tier);
    outcome.rows_to_disk = disk_after > disk_before ? disk_after - disk_before : 0;
    disk = "rows on the servers' disk tiers " + std::to_string(disk_before) + " before, " +
           std::to_string(disk_after) + " after";
  }
  GPUBOX_LOG(INFO) << "runner.shrink_every: shrank the sparse table after pass " << pass << ": "
                   << outcome.rows_deleted << " rows deleted, " << disk << ", " << outcome.seconds
                   << " s";
  if (rows_before > 0 && outcome.rows_deleted >= rows_before) {
    // A table emptied is what delete_after_unseen_days 0 (or a delete_threshold above every
    // row's score) asks, but rarely what was meant: said, not only counted.
    GPUBOX_LOG(WARNING) << "runner.shrink_every: the shrink after pass " << pass
                        << " deleted every sparse row (" << rows_before
                        << "): a row counts as unseen for one shrink more at each shrink, the "
                           "pass before it included, so hyper_parameters.sparse_optimizer."
                           "delete_after_unseen_days 0 deletes every row, and delete_threshold "
                           "deletes every row whose score is below it; the saves after it hold "
                           "no sparse row";
  }
  return outcome;
}

}  // namespace gpubox::trainer
