// What gpubox_train's --mode train and --mode infer run, as a library: gpubox_train's main and
// the Python package (python/, gpubox._core) call the same code, so a Python run is the
// binary's run.
//
// Thread-safety: one controlling thread per call (training threads live inside).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "trainer/config/trainer_config.hpp"
#include "trainer/metrics/metric_values.hpp"
#include "trainer/schedule/epoch_loop.hpp"
#include "trainer/schedule/schedule.hpp"
#include "trainer/schedule/trainer_env.hpp"

namespace gpubox::trainer {

// The schedule runner.sync_mode picks: gpubox / Collective (Trainer, the cards of `env`) or the
// parameter-server modes async, sync and geo (PsTrainer, against the servers `env` names).
std::unique_ptr<Schedule> make_schedule(const TrainerConfig& config, const TrainerEnv& env);

// --mode train: every pass of the config on the schedule it picks, from the save `load` ("" =
// the config's start), with the dataset's cost hints logged first. Throws gpubox::Error as the
// engine does. Returns the reports of the passes trained.
std::vector<PassReport> train_job(const TrainerConfig& config, const TrainerEnv& env,
                                  const std::string& load, const RunHooks& hooks = {});

}  // namespace gpubox::trainer
