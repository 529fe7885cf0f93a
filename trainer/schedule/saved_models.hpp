// Which saves `gpubox_train --mode infer` evaluates, picked as PaddleRec's infer scripts pick
// them (tools/infer.py, tools/static_infer.py): a save per epoch, <infer_load_path>/<epoch>, for
// infer_start_epoch <= epoch < infer_end_epoch. Host-only, no state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gpubox::trainer {

// Whether `dir` holds a GPUBox save (Trainer::save: its sparse/ and dense/ halves, or a model
// manifest).
bool is_save_folder(const std::string& dir);

// The pass of a save folder named `name` as a save spells it ("2"); nullopt for any other name,
// leading zeros included ("02", "0005": no save is named so).
std::optional<int64_t> save_folder_pass(const std::string& name);

struct SaveToEvaluate {
  std::string dir;
  int64_t epoch = -1;  // the save's epoch (its folder's number); -1 when it is not numbered
};

// `load_path` itself when it is a save (GPUBox's own layout: runner.infer_load_path or --load
// naming one save); otherwise every <load_path>/<epoch> for start_epoch <= epoch < end_epoch,
// in order, or, with end_epoch -1, every numbered save from start_epoch to the last one there.
// Throws naming the path, the range and the saves present when a save of the range is missing
// or the range holds none, and naming both saves when the range mixes two runs (a save of a
// lower model-manifest sequence after one of a higher: an earlier run's, left beside a later
// run's).
std::vector<SaveToEvaluate> saves_to_evaluate(const std::string& load_path, int64_t start_epoch,
                                              int64_t end_epoch);

}  // namespace gpubox::trainer
