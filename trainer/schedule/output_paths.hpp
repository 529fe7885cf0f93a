// Where a run's outputs (runner.metrics_path, --predictions_out) may not be: one of its inputs,
// which the output would overwrite or be read back as (a data file, the config, a save's files).
#pragma once

#include <string>

#include "trainer/config/trainer_config.hpp"
#include "trainer/schedule/schedule.hpp"

namespace gpubox::trainer {

// Whether `a` and `b` name one existing file (links followed).
bool same_file(const std::string& a, const std::string& b);
// Whether `path` (existing or not) lies in the existing folder `dir`, links resolved.
bool inside(const std::string& path, const std::string& dir);

// This trainer's runner.metrics_path file `path` is none of the run's inputs: a data file, a file
// in a data folder (the next run would read its lines as data), the config, or a file inside a
// save (a pass's folder under runner.model_save_path, the save `start_from` the run loads),
// whose checksums its lines would break. Throws naming which.
void check_metrics_path(const std::string& path, const TrainerConfig& config, const RunPlan& plan,
                        const std::string& start_from);

}  // namespace gpubox::trainer
