#include "trainer/schedule/pass_data.hpp"

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

}  // namespace gpubox::trainer
