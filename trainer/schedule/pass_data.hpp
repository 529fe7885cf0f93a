// What every schedule says of the data it read: the load's messages, and the one error for data
// that holds no valid instance (a pass, an evaluation, in every mode and for both readers), so
// a run never trains on nothing, saves it and exits 0. And the run's pass data cache, which every
// schedule gives the data sets it loads (runner.pass_cache_mb).
//
// Host-only, no state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/memory_limit.hpp"
#include "dataset/dataset_types.hpp"
#include "dataset/pass_data_cache.hpp"
#include "trainer/config/trainer_config.hpp"
#include "trainer/schedule/schedule.hpp"

namespace gpubox::trainer {

// Logs what the load of `files` tells its user (load_report.hpp), prefixed with `what` ("pass 3",
// "evaluation data"); throws when it read no valid instance, naming `what`, the files (the first
// ten), the lines read and why they were skipped, with counts; and when more than
// `max_malformed_share` of its lines were malformed (runner.max_malformed_share: a float label
// made 1,999 of 2,000 lines malformed, and the pass trained and saved one instance, exit 0),
// naming the counts, the first of them and the key.
void report_read(const dataset::LoadStats& stats, const std::vector<std::string>& files,
                 const std::string& what, double max_malformed_share);

// What runner.pass_cache_mb gives the cache of one trainer process, and where it came from (for
// the start log): its MiB; with -1 an eighth of `memory` (the machine's physical memory, or its
// cgroup's limit when lower: common/memory_limit.hpp) divided by `trainers`, the trainer
// processes of the job (each may share this host with the others; gpubox_server takes half of
// the same memory by default).
struct PassCacheBudget {
  std::size_t bytes = 0;
  std::string source;
};
PassCacheBudget pass_cache_budget(const RunnerConfig& runner, int trainers,
                                  const UsableMemory& memory);
// The run's pass data cache (dataset/pass_data_cache.hpp) of a run that loads each file list
// `loads` times (the epochs left to train after a resume, the saves --mode infer evaluates), its
// budget logged with its source; null when runner.pass_cache_mb is 0, when `loads` <= 1 (nothing
// would be served), with a pipe_command (whose output the cache does not keep) and with
// reader_type QueueDataset (which streams a pass to hold no more of it than its keys: a cache
// of parsed records would undo that).
std::unique_ptr<dataset::PassDataCache> make_pass_cache(const TrainerConfig& config, int trainers,
                                                        int64_t loads, const UsableMemory& memory);
std::unique_ptr<dataset::PassDataCache> make_pass_cache(const TrainerConfig& config, int trainers,
                                                        int64_t loads);
// How many times a training run from pass `first` of `plan` loads each file list: the epochs
// left, the one `first` is in counted whole.
int64_t epochs_left(const RunPlan& plan, int64_t first);
// Logs what `cache` (null: none) served over the run and what it holds, and the step plans
// served kept (Schedule::step_plans_served; -1: not said): once, at its end.
void report_pass_cache(const dataset::PassDataCache* cache, int64_t step_plans_served = -1);

// Reports `cache` (report_pass_cache) when it leaves scope: at the end of a run (run_epochs) or
// of an infer (infer_job), and when either ends by an error or a stop, what the cache served
// until then, with the step plans `schedule` (null: none) served kept. Both must outlive it.
class PassCacheReport {
 public:
  explicit PassCacheReport(const dataset::PassDataCache* cache, const Schedule* schedule = nullptr)
      : cache_(cache), schedule_(schedule) {}
  ~PassCacheReport();
  PassCacheReport(const PassCacheReport&) = delete;
  PassCacheReport& operator=(const PassCacheReport&) = delete;

 private:
  const dataset::PassDataCache* cache_;
  const Schedule* schedule_;
};

}  // namespace gpubox::trainer
