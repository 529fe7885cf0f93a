// What the trainers of one job must share: the trainer count, each trainer's parallelism (its
// cards, or a PS trainer's training threads) and every key that shapes the model or the job
// (TrainerConfig::model_keys and job_keys), less those a trainer sets for its own machine
// (memory budgets, the disk tier's folder, its reader threads in the gpubox mode). The gpubox mode
// compares them through the rendezvous store (trainer/engine/job_agreement.hpp), the PS modes
// through the first server (ps_modes/ps_trainer.cpp): a trainer started with another learning
// rate, row width, input layout, mode or count is refused naming the key and both values.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "trainer/config/trainer_config.hpp"
#include "trainer/schedule/trainer_env.hpp"

namespace gpubox::trainer {

using JobSettings = std::map<std::string, std::string>;  // what -> its value as text

// What to do when they differ (the end of every such refusal).
inline constexpr const char* kGiveTheSameSettings =
    "every trainer of a job trains one model, so give each the same config, -o overrides, "
    "trainer count and data files (each trains its share of the list all of them make)";

// This trainer's settings; `parallelism` names its per-trainer parallelism (e.g. "cards per
// trainer (FLAGS_selected_gpus)"; "": not compared) and `units` is its count. In a job of several
// trainers also what shapes its meetings though no result (passes an epoch, whether it evaluates
// and saves, the gpubox mode's AUC buckets) and the data files of which each reads its share
// (name and size; a data set in memory by its digest): in the gpubox mode those it trains and
// evaluates, or only evaluates (TrainerConfig::evaluated_files), in the PS modes those it trains
// under runner.split_file_list. `threads_shape_job`: runner.thread_num is compared (the PS modes'
// training threads) rather than left to each machine (the gpubox mode's reader threads).
JobSettings job_settings(const TrainerConfig& config, const TrainerEnv& env,
                         const std::string& parallelism, int units, bool threads_shape_job);

// As text (a line per setting, tabs, newlines and backslashes escaped) and back.
std::string encode_settings(const JobSettings& settings);
JobSettings decode_settings(const std::string& text);

// A digest of the settings' text (XXH3): equal settings, equal digests, on any machine.
uint64_t settings_digest(const JobSettings& settings);

// "" when `mine` (trainer `me`) and `theirs` (trainer `other`) are the same settings; else
// "key: trainer <other> has A, trainer <me> (this one) B; ..." for the first few that differ
// ("; and N more" after).
std::string settings_differences(const JobSettings& mine, int me, const JobSettings& theirs,
                                 int other);

}  // namespace gpubox::trainer
