// What every schedule says of the data it read: the load's messages, and the one error for data
// that holds no valid instance (a pass, an evaluation, in every mode and for both readers), so
// a run never trains on nothing, saves it and exits 0. And the run's pass data cache, which every
// schedule gives the data sets it loads (runner.pass_cache_mb).
//
// Host-only, no state.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "dataset/dataset_types.hpp"
#include "dataset/pass_data_cache.hpp"
#include "trainer/config/trainer_config.hpp"

namespace gpubox::trainer {

// Logs what the load of `files` tells its user (load_report.hpp), prefixed with `what` ("pass 3",
// "evaluation data"); throws when it read no valid instance, naming `what`, the files (the first
// ten), the lines read and why they were skipped, with counts.
void report_read(const dataset::LoadStats& stats, const std::vector<std::string>& files,
                 const std::string& what);

// The bytes runner.pass_cache_mb gives the cache: its MiB, or with -1 an eighth of the machine's
// physical memory.
std::size_t pass_cache_bytes(const RunnerConfig& runner);
// The run's pass data cache (dataset/pass_data_cache.hpp), its setting logged once; null when
// runner.pass_cache_mb is 0, when there is no next epoch to serve, or with a pipe_command (whose
// output the cache does not keep).
std::unique_ptr<dataset::PassDataCache> make_pass_cache(const TrainerConfig& config);
// Logs what `cache` (null: none) served over the run and what it holds: once, at its end.
void report_pass_cache(const dataset::PassDataCache* cache);

}  // namespace gpubox::trainer
