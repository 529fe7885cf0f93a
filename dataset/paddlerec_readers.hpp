// What PaddleRec's Python readers make of its model zoo's sample lines (models/rank/<model>/
// *reader*.py), for GPUBox to make the same when it reads those files itself: the feeds of the
// model folder (slot_dnn: the label in slot "1", no dense features, its readers' MultiSlot fields
// "0" (show) and "1" .. "301", after "ins_id" for inmemorydataset_reader.py) and the dense
// transform of the reader a config names in runner.train_reader_path (dcn_v2's reader.py: log(x +
// 1); deepfefm's criteo_reader.py: clipped to [0, 1]; the benchmark_reader.py of dnn, deepfm and
// wide_deep: min-max of raw Criteo TSV, which GPUBox's Criteo format applies). When
// runner.pipe_command is set the reader itself runs and nothing here applies but slot_dnn's field
// order.
#pragma once

#include <string>
#include <vector>

#include "common/config/config_enums.hpp"

namespace gpubox {
namespace config {
class ConfigDocument;
}
namespace dataset {

// slot_dnn's readers (queuedataset_reader.py, inmemorydataset_reader.py) write slots "1" ..
// "301" (slot_reader(slot_num=300), whatever the config's slot_num) after the show field "0".
inline constexpr int kSlotDnnReaderSlots = 300;

struct ReaderProfile {
  std::string model;   // "<name>" of models/rank/<name> (workspace, else the config's folder)
  std::string reader;  // the module of runner.train_reader_path ("reader"), "" when none
  // Set only where the model folder decides them and the config does not set the key.
  std::string label_name;                    // slot_dnn: "1"
  std::vector<std::string> multislot_order;  // slot_dnn: "0", "1", ..., "301"
  // flen's avazu_reader.py: its lines are avazu text, and sparse_inputs_slots counts its fields
  // without the label (its net reads that many), so the data has sparse_inputs_slots slots.
  bool avazu = false;
  // The transform GPUBox applies to slot text and MultiSlot dense values (never kAuto).
  config::DenseTransform dense = config::DenseTransform::kNone;
  // Lines for the start log: what was applied in the reader's place, or which reader's
  // transform was not; none when there is nothing to say (no PaddleRec reader is replaced, or it
  // changes nothing).
  std::vector<std::string> notes;
};

// Reads workspace, runner.train_reader_path, runner.pipe_command, runner.dense_transform,
// runner.criteo_dense and whether runner.label_name, hyper_parameters.dense_input_dim and
// runner.multislot_order are set. slot_dnn's dense features (none) are
// config::resolve_dense_dim's, which the table part shares.
ReaderProfile paddlerec_reader_profile(const config::ConfigDocument& doc);

// x under `transform` as PaddleRec's readers compute it: in double from the text's double value,
// then rounded once to float (numpy's astype("float32")). kAuto and kNone: x.
double dense_transform(double x, config::DenseTransform transform);
// `x` through `transform` as a float, as training reads it (none and auto: x itself); false
// when that is not a finite float (log of a value at or below -1, or beyond float range).
bool transformed_dense(double x, config::DenseTransform transform, float* out);

// "log(x + 1)", "clip to [0, 1]", "none".
const char* describe(config::DenseTransform transform);

}  // namespace dataset
}  // namespace gpubox
