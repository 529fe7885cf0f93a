// Where a trainer runs, from the launcher's environment, and how a job splits its files and
// metrics files among its trainers: shared by every schedule (gpubox, collective, PS modes).
// Host-only, no state.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/memory_limit.hpp"
#include "dataset/dataset_types.hpp"

namespace gpubox::trainer {

// Where the trainer runs: its cards and the servers, from the launcher's environment.
//
// Several trainers (PADDLE_TRAINERS_NUM > 1): one job of T processes x C cards each (every
// trainer the same C); card ranks are global (trainer_id * C + card) and the communicator spans
// them all (Gloo on cpu, NCCL on cuda), meeting through the rendezvous store. Each trainer
// trains its share of each pass's files (trainer_file_share); keys are owned by one card of the
// job; dense gradients and metrics are summed over every card of every trainer. Trainer 0 prints
// the pass lines; every trainer appends its own line to its metrics file (trainer_metrics_path).
struct TrainerEnv {
  std::string selected_cards = "0";  // FLAGS_selected_gpus (cpu build: simulated cards)
  std::string selected_cards_from = "FLAGS_selected_gpus";  // or GPUBOX_SELECTED_GPUS: its errors
  std::string servers;  // PADDLE_PSERVERS_IP_PORT_LIST; empty: in-process host tier
  int trainer_id = 0;   // PADDLE_TRAINER_ID
  int trainers = 1;     // PADDLE_TRAINERS_NUM
  std::string trainers_from = "PADDLE_TRAINERS_NUM";  // the variable read: its errors name it
  int threads_per_card = 0;                           // cpu backend; 0 = cores / cards
  std::string rendezvous;  // GPUBOX_RENDEZVOUS (file:///shared/dir); needed when trainers > 1
  std::string host = "127.0.0.1";  // POD_IP: where this trainer's peers reach it
  // What this process may still take, asked before a copy that holds a pass twice (a shuffled
  // pass stored in its order; skipped when it would not fit). Tests give their own.
  std::function<uint64_t()> memory_headroom = memory_headroom_bytes;

  // Reads FLAGS_selected_gpus, PADDLE_PSERVERS_IP_PORT_LIST, PADDLE_TRAINER_ID,
  // PADDLE_TRAINERS_NUM (or their GPUBOX_* names; the count also as PaddleRec's scripts name it,
  // PADDLE_TRAINERS), GPUBOX_RENDEZVOUS and POD_IP (or GPUBOX_POD_IP). Without a trainer id or
  // count, a cluster launcher's gives it: OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (mpirun),
  // else SLURM_PROCID / SLURM_NTASKS (srun), as scripts/run_gpubox.sh reads them. A malformed
  // number, a count below 1, an id outside [0, count) and two counts that disagree throw, naming
  // the variables.
  static TrainerEnv from_environment();
};

// Trainer `trainer_id`'s share of a pass's files, as Paddle's fleet.util.get_file_shard splits
// them: contiguous blocks in list order, the first (files % trainers) trainers one file more. A
// trainer may get none (it still joins every step, with empty batches). In-memory data sets
// (dataset/memory_source.hpp; every trainer of the job given the same one) are split by rows
// the same way: each trainer gets its share of each (memory_source_share).
std::vector<std::string> trainer_file_share(const std::vector<std::string>& files, int trainer_id,
                                            int trainers);

// Trainer t's metrics file: runner.metrics_path itself for trainer 0 (and a single trainer),
// "<stem>.trainer<t><extension>" beside it for the others.
std::string trainer_metrics_path(const std::string& metrics_path, int trainer_id);

// Whether data_files logs the entries it skipped unexpectedly (a folder, a broken link, a file met
// before): the run's own listing does; a second listing of the same folders (the job agreement's)
// does not, so each is said once.
enum class SkipWarnings { kLog, kQuiet };

// The data files of a folder (sorted; hidden files and *.json skipped). Throws naming it.
std::vector<std::string> data_files(const std::string& dir,
                                    SkipWarnings warnings = SkipWarnings::kLog);
// The files of every folder of `dirs` in order (each listed as above), or of `dir` alone when
// `dirs` is empty (RunnerConfig::train_data_dirs: a config's list of data folders). A file met
// again in a later folder is read once, under its first name, with a warning; a folder whose
// every file was listed before (named twice) throws naming it.
std::vector<std::string> data_files(const std::string& dir, const std::vector<std::string>& dirs,
                                    SkipWarnings warnings = SkipWarnings::kLog);

// Throws when `files` is an in-memory data set (a DataFrame or arrays) and `dataset_config` names
// a dense transform: its dense values are taken as given (the transform is the file readers'),
// while a save records the transform and its export applies it when serving.
void check_memory_source_transform(const std::vector<std::string>& files,
                                   const dataset::DatasetConfig& dataset_config);

}  // namespace gpubox::trainer
