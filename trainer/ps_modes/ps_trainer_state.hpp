// PsTrainer's state, shared by the files that hold its parts (ps_trainer.cpp: the job;
// ps_trainer_pass.cpp: the passes and evaluations; ps_trainer_saves.cpp: saves and loads). Not a
// public interface.
#pragma once

#include <iterator>
#include <memory>
#include <vector>

#include "dataset/pass_data_cache.hpp"
#include "heterps/device/card.hpp"
#include "table/server/ps_protocol.hpp"
#include "table/server/remote_host_tier.hpp"
#include "trainer/ps_modes/job_steady_loss.hpp"
#include "trainer/ps_modes/merged_pushes.hpp"
#include "trainer/ps_modes/ps_job_settings.hpp"
#include "trainer/ps_modes/ps_peer_watch.hpp"
#include "trainer/ps_modes/ps_step_hooks.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/ps_modes/ps_worker.hpp"
#include "trainer/ps_modes/sync_barriers.hpp"
#include "trainer/schedule/checkpoint.hpp"
#include "trainer/schedule/schedule.hpp"
#include "trainer/schedule/servers_owner.hpp"

namespace gpubox::trainer::ps_modes {

// Sync mode's small table on the servers of the batches of each pass, per trainer (so every
// trainer takes the same steps); its barriers' table is SyncBarriers'.
inline constexpr const char* kBatchesTable = "ps_sync_batches";

// How trainer 0 calls the servers' dense table "dense" in its part of a meeting (the job's start,
// a save, a load): each frame answered counts as the part's progress, as the SAVE's and LOAD's
// PROGRESS frames do, so that the others waiting for a long one see it move
// (trainer_zero_work.hpp). Bounded as any call (runner.server_timeout_s a frame window).
inline table::server::DenseCall dense_call_of_part() {
  table::server::DenseCall call;
  call.progress = true;
  return call;
}

// Every dense table a PS job keeps on the servers, all on server 0 (it holds every dense table),
// which holds at most kMaxDenseTables of them: a new table goes into this list, and past the
// limit a job would be refused its last one. ps_trainer.cpp's kOutcomeTable and kJobTokenTable,
// ps_trainer_recovery.cpp's kRestartVotesTable and kRecoveryTable are named by their text.
inline constexpr const char* kJobDenseTables[] = {kDenseTableName,
                                                  kGradientTableNames[0],
                                                  kGradientTableNames[1],
                                                  SyncBarriers::kProgressTable,
                                                  kBatchesTable,
                                                  kSteadyLossTable,
                                                  kStopTable,
                                                  PsPeerWatch::kAliveTable,
                                                  PsPeerWatch::kFailureTable,
                                                  "ps_outcome",
                                                  "ps_sync_job",
                                                  "ps_restart_votes",
                                                  "ps_recovery",
                                                  TrainerZeroWork::kTable,
                                                  kSettingsTable,
                                                  kOwnerTable};
static_assert(std::size(kJobDenseTables) <= table::server::kMaxDenseTables,
              "a PS job's dense tables must fit on server 0 (kMaxDenseTables)");

struct PsTrainer::State {
  device::CardSet cards;
  std::unique_ptr<table::server::RemoteHostTier> servers;
  std::vector<std::unique_ptr<PsWorker>> workers;
  std::vector<float> batches_seen;  // sync: kBatchesTable as this trainer last read it
  std::unique_ptr<SaveLineage> lineage;
  std::vector<double> metric_sums;  // the last pass's, over this trainer's threads
  PsPeerWatch* watch = nullptr;     // while train() runs a job of several trainers
  StepHooks hooks;                  // set_step_hooks: the stop flag and the progress callback
  std::unique_ptr<dataset::PassDataCache> pass_cache;  // runner.pass_cache_mb; null when off
  std::unique_ptr<MergedPushes> pushes;  // sync: the threads' pushes of a step merged per key
  bool failure_marked = false;  // this trainer's failure is marked for the job (PsPeerWatch)
  // How many train() calls of this object began (counted as each begins, before anything that
  // can throw): while one runs, its number (1 for the first). The same on every trainer of the
  // job, whose failure marks hold it (PsPeerWatchOptions::run), so that an earlier train()'s
  // mark is told apart. 0 before the first train() (the constructor's meetings).
  int run = 0;
  // Trainer 0: the servers claimed for this job (trainer/schedule/servers_owner.hpp), from the
  // job's start; its beats stop and the claim is released before the servers' client goes.
  std::unique_ptr<ServersOwner> owner;
};

}  // namespace gpubox::trainer::ps_modes
