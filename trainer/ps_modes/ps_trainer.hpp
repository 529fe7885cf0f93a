// PsTrainer: the pass loop of the parameter-server modes (runner.sync_mode async | sync | geo;
// ARCHITECTURE §7), PaddleRec's CPU ParameterServer schedules on GPUBox's parts. The sparse rows
// and a dense table live on the gpubox_server processes the launcher names
// (PADDLE_PSERVERS_IP_PORT_LIST, scripts/launch.sh); a trainer is runner.thread_num training
// threads (PsWorker, each on its own card: on the cpu backend an execution context), each
// taking its own batches of the trainer's files (with runner.split_file_list, a contiguous block
// of them, as PaddleRec's get_file_shard and the gpubox mode split them; else each reads them all).
//
//   async: every thread steps without waiting for anyone: its batch's rows pulled, gradients
//          pushed (the servers apply the rule on arrival); every runner.dense_sync_steps steps
//          its dense change is added to the servers' dense table and the sum adopted.
//   sync:  the same, and every step ends at a barrier of all trainers (one per step, thread 0
//          of each trainer at the servers, the threads of a trainer among themselves), so each
//          step's updates of every trainer are applied before anyone's next pull. Dense changes
//          are added scaled by 1 / (trainers x threads): the servers' dense table moves by the
//          mean of the threads' updates. Trainers with fewer batches take empty steps, so all
//          take the same number. A trainer missing from a barrier for runner.collective_timeout_s
//          ends the job with an error naming it.
//   geo:   every thread trains its local copy of the rows it touches (GeoRows) and its own
//          dense net; every runner.geo_step steps (and at the end of a pass) it pushes both
//          deltas and adopts the merged values.
//
// Thread-safety: one controlling thread calls the public methods; training threads live inside.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "trainer/config/trainer_config.hpp"
#include "trainer/engine/trainer.hpp"
#include "trainer/metrics/metric_values.hpp"

namespace gpubox::trainer::ps_modes {

class PsTrainer {
 public:
  // Connects to the servers of `env` (required: the PS modes keep no host tier in-process) and
  // makes one training thread per card: runner.thread_num on the cpu backend, the cards of
  // FLAGS_selected_gpus on cuda. Throws naming the servers when they cannot be reached.
  PsTrainer(TrainerConfig config, TrainerEnv env);
  ~PsTrainer();
  PsTrainer(const PsTrainer&) = delete;
  PsTrainer& operator=(const PsTrainer&) = delete;

  // Every pass of the config (one per epoch over runner.train_data_dir, or one per
  // runner.pass_dirs folder), this trainer's share of each; prints gpubox_train's pass line and
  // PaddleRec's epoch lines, appends to runner.metrics_path, evaluates runner.test_data_dir
  // after each epoch. Returns the reports.
  std::vector<PassReport> train();
  // One pass over this trainer's share of `files`.
  PassReport train_pass(const std::vector<std::string>& files);
  // Evaluates `files` (all of them) with the servers' rows and dense table.
  EvalResult evaluate(const std::vector<std::string>& files);

  int threads() const;
  // Thread 0's dense parameters (host copy).
  std::vector<float> dense_values() const;

 private:
  struct State;
  TrainerConfig config_;
  TrainerEnv env_;
  std::unique_ptr<State> state_;
  int64_t pass_id_ = 0;
};

}  // namespace gpubox::trainer::ps_modes
