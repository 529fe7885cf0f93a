// Where gpubox_train --mode infer --predictions_out writes "label prediction" per instance, and
// what it must never write over: the evaluation's own inputs.
#pragma once

#include <string>
#include <vector>

#include "common/temp_file.hpp"
#include "trainer/main/run_job.hpp"

namespace gpubox::trainer {

// Throws gpubox::Error naming the flag and the input when `path` (--predictions_out) is one of
// the evaluation's inputs: a data file of `inputs` (the same file by device and inode, a link to
// it too), the config `config_path`, or a path inside a save of `inputs` (a save's files, or a
// new file that would make it a save of other contents). Each was replaced with exit 0: the test
// data by its predictions, a save's MODEL_MANIFEST (the save unreadable after), the config.
void check_not_an_input(const std::string& path, const InferInputs& inputs,
                        const std::string& config_path);

// Opened before the evaluation so a path that cannot be written fails first; written whole as a
// ReplacedFile (common/temp_file.hpp: a regular file replaced by a rename, a symlink's target
// replaced, a FIFO or /dev/stdout written in place).
class PredictionsOut {
 public:
  explicit PredictionsOut(const std::string& path);
  PredictionsOut(const PredictionsOut&) = delete;
  PredictionsOut& operator=(const PredictionsOut&) = delete;

  // Writes "label prediction" per line and closes; throws naming the flag when it cannot. Each
  // float is the shortest text that reads back to it exactly (a stream's default 6 significant
  // digits lost up to 5e-7 of a prediction: a calibration or a comparison with another system
  // would see values the model never computed).
  void write(const EvalResult& result);

 private:
  std::string flag_path_;
  ReplacedFile out_;
};

}  // namespace gpubox::trainer
