#include "trainer/main/predictions_out.hpp"

#include <cstdio>

#include "common/error.hpp"
#include "dataset/text_number.hpp"
#include "trainer/schedule/output_paths.hpp"

namespace gpubox::trainer {

void check_not_an_input(const std::string& path, const InferInputs& inputs,
                        const std::string& config_path) {
  const std::string refused = "--predictions_out '" + path + "' is ";
  const std::string remedy = ": it would be replaced by the predictions; name another file";
  for (const std::string& file : inputs.files) {
    GPUBOX_EXPECTS(!same_file(path, file), refused, "the data file '", file,
                   "' the evaluation reads", remedy);
  }
  GPUBOX_EXPECTS(config_path.empty() || !same_file(path, config_path), refused, "the config '",
                 config_path, "'", remedy);
  for (const SaveToEvaluate& save : inputs.saves) {
    GPUBOX_EXPECTS(!inside(path, save.dir), refused, "inside the save '", save.dir,
                   "' the evaluation loads (a save holds its own files only): name a file "
                   "outside it");
  }
}

PredictionsOut::PredictionsOut(const std::string& path) : flag_path_(path) {
  const Status opened = out_.open(path);
  GPUBOX_EXPECTS(opened.ok(), "cannot write --predictions_out '", flag_path_, "' (",
                 opened.message(), ")");
}

void PredictionsOut::write(const EvalResult& result) {
  std::string text;
  for (std::size_t i = 0; i < result.predictions.size(); ++i) {
    dataset::append_float(&text, result.labels[i]);
    text += ' ';
    dataset::append_float(&text, result.predictions[i]);
    text += '\n';
  }
  std::fflush(stdout);
  Status written = out_.write(text.data(), text.size());
  if (written.ok()) written = out_.commit();
  GPUBOX_EXPECTS(written.ok(), "writing --predictions_out '", flag_path_, "' failed (",
                 written.message(), ")");
}

}  // namespace gpubox::trainer
