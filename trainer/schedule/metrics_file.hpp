// This trainer's runner.metrics_path (trainer_metrics_path): the JSON lines of its passes and
// evaluations, appended (epoch_loop.cpp writes them; metrics_format.hpp spells them).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace gpubox::trainer {

// The name of the file a save folder keeps its pass's metrics line in (trainer 0's; trainer N's
// adds ".trainerN"), a part of the save (earlier_saves.cpp's foreign_entry).
inline constexpr const char* kPassLineFile = ".gpubox_pass_line";

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

  // A pass's line kept in its save folder `save_dir` before the save is made (kPassLineFile,
  // this trainer's), then appended once the save is: a run killed between the two left the save
  // without its line, and the rerun, resuming after that save, never wrote it (a helper's
  // probe). restore_pass_line, at a resume after that save, appends the kept line when the file
  // does not hold it, as the killed run wrote it (its "run" included). No-ops when no file is
  // kept.
  void keep_pass_line(const std::string& save_dir, const std::string& json) const;
  void restore_pass_line(const std::string& save_dir);

 private:
  std::string line(const std::string& json) const;
  std::string kept_line_path(const std::string& save_dir) const;
  void write(const std::string& line);

  int trainer_id_ = 0;
  std::string path_;
  std::string run_;
  std::ofstream out_;
};

}  // namespace gpubox::trainer
