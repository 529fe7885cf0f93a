#include "trainer/schedule/pass_data.hpp"

#include <algorithm>
#include <cstdio>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "dataset/load_report.hpp"

namespace gpubox::trainer {

void report_read(const dataset::LoadStats& stats, const std::vector<std::string>& files,
                 const std::string& what, double max_malformed_share) {
  const dataset::LoadMessages messages = dataset::load_messages(stats);
  for (const std::string& line : messages.info) GPUBOX_LOG(INFO) << what << ": " << line;
  for (const std::string& line : messages.warnings) GPUBOX_LOG(WARNING) << what << ": " << line;
  if (stats.instances > 0 && dataset::no_key_in_any_slot(stats)) {
    // The model would train its dense part alone and exit 0.
    std::string why;
    for (const std::string& line : messages.warnings) why += "; " + line;
    GPUBOX_FAIL(what, ": no key in any of the config's ", stats.slot_keys.size(),
                " sparse slots in ", files.size(), " file(s) (", stats.slot_counted_instances,
                " instances)", why);
  }
  // By lines, and by bytes: a file whose lines end in CR alone, or binary, is one malformed line
  // of many bytes (it was lost beside the other files under any share).
  const auto malformed = static_cast<double>(stats.skipped_lines());
  const double line_share = stats.lines > 0 ? malformed / static_cast<double>(stats.lines) : 0;
  const double byte_share =
      stats.bytes > 0 ? static_cast<double>(stats.skipped_bytes) / static_cast<double>(stats.bytes)
                      : 0;
  if (stats.instances > 0 &&
      (line_share > max_malformed_share || byte_share > max_malformed_share)) {
    std::string first;
    for (std::size_t i = 0; i < stats.errors.size() && i < 3; ++i) {
      first += (i ? "; " : "") + stats.errors[i].to_string();
    }
    char share[96];
    std::snprintf(share, sizeof(share), "%.1f%%; %.1f%% of its %llu bytes", 100.0 * line_share,
                  100.0 * byte_share, static_cast<unsigned long long>(stats.bytes));
    // A pass's data trains the model; an evaluation's measures it.
    const bool trains = what.rfind("pass ", 0) == 0;
    GPUBOX_FAIL(
        what, ": ", stats.skipped_lines(), " of its ", stats.lines, " lines (", share,
        ") are malformed, over runner.max_malformed_share's ", max_malformed_share,
        trains ? ": the model would learn from the " : ": the figures would be measured on the ",
        stats.instances, " instances left as if they were the data (first: ", first,
        "); fix the data or the reading settings (runner.data_format, the slots), or raise "
        "runner.max_malformed_share to train on what parses");
  }
  if (stats.instances > 0) return;
  // Nothing to learn from or to measure: the metrics would be NaN and a save would store an
  // unchanged model as if a pass had run.
  std::string names;
  for (std::size_t i = 0; i < files.size() && i < 10; ++i) names += (i ? ", " : "") + files[i];
  if (files.size() > 10) names += ", ...";
  std::string why;
  for (const std::string& line : messages.warnings) why += "; " + line;
  GPUBOX_FAIL(what, ": no valid instance in ", files.size(), " file(s) (", stats.lines, " lines, ",
              stats.skipped_lines(), " malformed): ", names, why);
}

PassCacheBudget pass_cache_budget(const RunnerConfig& runner, int trainers,
                                  const UsableMemory& memory) {
  if (runner.pass_cache_mb >= 0) {
    return {static_cast<std::size_t>(runner.pass_cache_mb) << 20, "runner.pass_cache_mb"};
  }
  const uint64_t share = std::max(trainers, 1);
  std::string source = "runner.pass_cache_mb: -1, an eighth of the " +
                       std::to_string(memory.bytes >> 20) + " MiB of " + memory.source;
  if (share > 1) source += ", divided by the job's " + std::to_string(share) + " trainers";
  return {static_cast<std::size_t>(memory.bytes / 8 / share), source};
}

std::unique_ptr<dataset::PassDataCache> make_pass_cache(const TrainerConfig& config, int trainers,
                                                        int64_t loads, const UsableMemory& memory) {
  const PassCacheBudget budget = pass_cache_budget(config.runner, trainers, memory);
  // Each list read once (one epoch left, one save to evaluate): nothing would be served.
  if (budget.bytes == 0 || loads <= 1) return nullptr;
  if (!config.dataset.pipe_command.empty()) {
    GPUBOX_LOG(INFO) << "runner.pass_cache_mb: no pass data cache with runner.pipe_command set "
                        "(its output need not be the same every epoch): every epoch runs it";
    return nullptr;
  }
  if (config.runner.reader_type == config::ReaderType::kQueueDataset) {
    GPUBOX_LOG(INFO) << "runner.pass_cache_mb: no pass data cache with runner.reader_type "
                        "QueueDataset (it streams each pass to hold no more of it than its "
                        "keys): every epoch reads the files";
    return nullptr;
  }
  GPUBOX_LOG(INFO) << "pass data cache: up to " << (budget.bytes >> 20) << " MiB (" << budget.source
                   << ") of parsed records kept, so the " << loads - 1
                   << " later loads of a pass (or of the test data) that fits share it "
                      "instead of reading and parsing its files again";
  return std::make_unique<dataset::PassDataCache>(budget.bytes);
}

std::unique_ptr<dataset::PassDataCache> make_pass_cache(const TrainerConfig& config, int trainers,
                                                        int64_t loads) {
  return make_pass_cache(config, trainers, loads, usable_memory());
}

int64_t epochs_left(const RunPlan& plan, int64_t first) {
  const int64_t per_epoch = std::max<int64_t>(plan.per_epoch, 1);
  const int64_t epochs = (plan.total + per_epoch - 1) / per_epoch;
  return std::max<int64_t>(epochs - first / per_epoch, 0);
}

void report_pass_cache(const dataset::PassDataCache* cache, int64_t step_plans_served) {
  if (cache == nullptr) return;
  const dataset::PassCacheCounts counts = cache->counts();
  std::string plans;
  if (step_plans_served >= 0) {
    plans = ", " + std::to_string(step_plans_served) + " their step plans";
  }
  GPUBOX_LOG(INFO) << "pass data cache: " << counts.loads_served << " loads ("
                   << counts.instances_served << " instances) served instead of read; it holds "
                   << counts.entries << " file lists in " << (counts.bytes >> 20) << " MiB of "
                   << (cache->budget_bytes() >> 20) << " (runner.pass_cache_mb); "
                   << counts.unique_keys_served << " of those loads were served their unique keys"
                   << plans;
}

PassCacheReport::~PassCacheReport() {
  try {
    report_pass_cache(cache_, schedule_ == nullptr ? -1 : schedule_->step_plans_served());
  } catch (...) {  // a log line that failed must not end the process while an error unwinds
  }
}

}  // namespace gpubox::trainer
