#include "trainer/schedule/pass_data.hpp"

#include <unistd.h>

#include "common/error.hpp"
#include "common/logging.hpp"
#include "dataset/load_report.hpp"

namespace gpubox::trainer {

void report_read(const dataset::LoadStats& stats, const std::vector<std::string>& files,
                 const std::string& what) {
  const dataset::LoadMessages messages = dataset::load_messages(stats);
  for (const std::string& line : messages.info) GPUBOX_LOG(INFO) << what << ": " << line;
  for (const std::string& line : messages.warnings) GPUBOX_LOG(WARNING) << what << ": " << line;
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

std::size_t pass_cache_bytes(const RunnerConfig& runner) {
  if (runner.pass_cache_mb >= 0) return static_cast<std::size_t>(runner.pass_cache_mb) << 20;
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_bytes = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_bytes <= 0) return 0;
  return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_bytes) / 8;
}

std::unique_ptr<dataset::PassDataCache> make_pass_cache(const TrainerConfig& config) {
  const std::size_t bytes = pass_cache_bytes(config.runner);
  // One epoch reads every pass once, and evaluates once: nothing would be served.
  if (bytes == 0 || config.runner.epochs <= 1) return nullptr;
  if (!config.dataset.pipe_command.empty()) {
    GPUBOX_LOG(INFO) << "runner.pass_cache_mb: no pass data cache with runner.pipe_command set "
                        "(its output need not be the same every epoch): every epoch runs it";
    return nullptr;
  }
  GPUBOX_LOG(INFO) << "runner.pass_cache_mb: up to " << (bytes >> 20)
                   << " MiB of parsed records kept, so the next epochs copy the passes (and test "
                      "data) that fit instead of reading and parsing their files again";
  return std::make_unique<dataset::PassDataCache>(bytes);
}

void report_pass_cache(const dataset::PassDataCache* cache) {
  if (cache == nullptr) return;
  const dataset::PassCacheCounts counts = cache->counts();
  GPUBOX_LOG(INFO) << "pass data cache: " << counts.loads_served << " loads ("
                   << counts.instances_served << " instances) served instead of read; it holds "
                   << counts.entries << " file lists in " << (counts.bytes >> 20) << " MiB of "
                   << (cache->budget_bytes() >> 20) << " (runner.pass_cache_mb)";
}

}  // namespace gpubox::trainer
