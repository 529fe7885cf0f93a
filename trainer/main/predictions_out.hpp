// Where gpubox_train --mode infer --predictions_out writes "label prediction" per instance, and
// what it must never write over: the evaluation's own inputs.
#pragma once

#include <string>
#include <vector>

#include "trainer/main/run_job.hpp"

namespace gpubox::trainer {

// Throws gpubox::Error naming the flag and the input when `path` (--predictions_out) is one of
// the evaluation's inputs: a data file of `inputs` (the same file by device and inode, a link to
// it too), the config `config_path`, or a path inside a save of `inputs` (a save's files, or a
// new file that would make it a save of other contents). Each was replaced with exit 0: the test
// data by its predictions, a save's MODEL_MANIFEST (the save unreadable after), the config.
void check_not_an_input(const std::string& path, const InferInputs& inputs,
                        const std::string& config_path);

// Opened before the evaluation so a path that cannot be written fails first. A regular file (or a
// new one) is written under <file>.tmp and renamed over it, so a failed run leaves an earlier
// file whole; a symlink to one replaces its target, not the link. Anything else (a FIFO,
// /dev/stdout, a file in a folder gpubox_train cannot write in) is written in place, opened
// without truncating, and truncated only when the lines are ready.
class PredictionsOut {
 public:
  explicit PredictionsOut(const std::string& path);
  PredictionsOut(const PredictionsOut&) = delete;
  PredictionsOut& operator=(const PredictionsOut&) = delete;
  ~PredictionsOut();

  // Writes "label prediction" per line and closes; throws naming the flag when it cannot. Each
  // float is the shortest text that reads back to it exactly (a stream's default 6 significant
  // digits lost up to 5e-7 of a prediction: a calibration or a comparison with another system
  // would see values the model never computed).
  void write(const EvalResult& result);

 private:
  void check_open(const std::string& opened) const;
  std::string failed(const char* step) const;

  std::string flag_path_;
  std::string target_;  // the file written: symlinks to a regular file resolved
  std::string tmp_;     // empty: target_ is written in place
  bool regular_in_place_ = false;
  int fd_ = -1;
};

}  // namespace gpubox::trainer
