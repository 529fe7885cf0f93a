// hyper_parameters.dnn_dropout (DenseModelConfig::dnn_dropout, trainer/nn/dropout.hpp): the rate
// a config asks for or, not set, the one PaddleRec's model folder's network hard-codes, and what
// the network must have for it.
#pragma once

#include <string>

#include "common/status.hpp"
#include "trainer/config/trainer_config.hpp"

namespace gpubox {
namespace config {
class ConfigDocument;
}
namespace trainer {

// The highest rate (check_dnn_dropout): a hidden unit kept with probability (1-p)^2 >= 1e-6.
// flen's is lower, about 0.990: its (1-p)^3 must be at least kMinDropoutKeep.
inline constexpr double kMaxDnnDropout = 0.999;

// PaddleRec's net's Dropout rate of its DNN in the model folder `model` (paddlerec_model_name):
// dcn_v2 0.5, deepfefm 0.2, fat_deepffm 0.5, flen 0.2; 0 elsewhere (autoint's net registers a
// Dropout and never calls it).
double paddlerec_dnn_dropout(const std::string& model);

// PaddleRec's folder's rate (paddlerec_dnn_dropout) when the network trained (resolve_network) is
// the folder's own; 0 for another network (dnn trained in the dcn_v2 folder, fm in deepfefm's).
double folder_dnn_dropout(const config::ConfigDocument& doc);

// The key when set, else folder_dnn_dropout, or 0 with hyper_parameters.dnn_batch_norm (dropout is
// not built with it; dnn_dropout_note says so). Reads the key either way.
double dnn_dropout_of(const config::ConfigDocument& doc);

// InvalidArgument naming the key when the rate is not in [0, kMaxDnnDropout], keeps a hidden unit
// with probability below kMinDropoutKeep (flen above about 0.990), or is set (or the folder's) for
// a network without a dnn, or with dnn_batch_norm (not built).
Status check_dnn_dropout(const TrainerConfig& c, const config::ConfigDocument& doc);

// The rate as a save's MODEL_MANIFEST records it, written as ConfigDocument::value_text writes the
// key ("0" as a save made before the key, which trained without dropout).
std::string dnn_dropout_text(double p);

// Records the rate trained in c->model_keys (dnn_dropout_text) and, when the folder's rate set it,
// in c->derived_model_keys: a resume of a save made at another rate (one made before the key, in
// these folders, at 0) names the -o that resumes it (check_saved_derived_keys). A load does not
// compare it (the rate changes no parameter and no prediction).
void record_dnn_dropout(const config::ConfigDocument& doc, TrainerConfig* c);

// gpubox_train's start line when the folder's rate (not the config) turned dropout on, or would
// have but for hyper_parameters.dnn_batch_norm; "" else.
std::string dnn_dropout_note(const config::ConfigDocument& doc);

}  // namespace trainer
}  // namespace gpubox
