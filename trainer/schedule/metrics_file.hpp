// This trainer's runner.metrics_path (trainer_metrics_path): the JSON lines of its passes and
// evaluations, appended (epoch_loop.cpp writes them; metrics_format.hpp spells them).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace gpubox::trainer {

// Opened for appending at the start of the run (a path that cannot be written fails the run
// before any pass, not after it). A line that cannot be written (a full disk) stops the job
// naming the file: the pass's save, when it saves, was written before its line (record_pass runs
// after it), so nothing trained is lost and a resume goes on from it.
class MetricsFile {
 public:
  MetricsFile(const std::string& metrics_path, int trainer_id);
  // One JSON object, one line (metrics_format.hpp's formatters: NaN is null), with this run's
  // "run" last: runs appended to one file (the default log/metrics.jsonl) are told apart, a
  // resumed run from the one it continues.
  void append(const std::string& json);
  // "<UTC start, to the second>/<pid>", this run's "run".
  const std::string& run() const { return run_; }
  // Whether the file's last line is epoch `epoch`'s test line (format_test_json): a run killed
  // after writing it and before its evaluation's mark evaluates the epoch again on rerun, which
  // then does not write the line twice. False when no file is kept.
  bool ends_with_test_line(int64_t epoch) const;

 private:
  std::string path_;
  std::string run_;
  std::ofstream out_;
};

}  // namespace gpubox::trainer
