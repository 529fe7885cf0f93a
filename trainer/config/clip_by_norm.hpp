// hyper_parameters.optimizer.clip_by_norm (HyperParameters::clip_by_norm; the clip itself:
// trainer/nn/gradient_clip.hpp): the global norm a config clips every step's gradients to or,
// not set, the one PaddleRec's dcn_v2 trainer clips to, and where it is built.
#pragma once

#include <string>

#include "common/status.hpp"
#include "trainer/config/trainer_config.hpp"

namespace gpubox {
namespace config {
class ConfigDocument;
}
namespace trainer {

// PaddleRec's dcn_v2 dygraph_model.py: ClipGradByGlobalNorm(clip_norm=
// hyper_parameters.optimizer.clip_by_norm, 10.0 when absent). No other folder's trainer clips.
inline constexpr double kPaddleRecDcnV2ClipByNorm = 10.0;

// The key when set; not set, kPaddleRecDcnV2ClipByNorm in PaddleRec's dcn_v2 folder when the
// network is dcn_v2 and the mode builds the clip (runner.sync_mode gpubox, Collective too), else
// 0 (off; clip_by_norm_note says so of the folder's).
double clip_by_norm_of(const config::ConfigDocument& doc);

// InvalidArgument naming the key when it is negative or not finite, or set above 0 in a
// parameter-server mode (runner.sync_mode async, sync or geo), which does not build it: their
// sparse gradients go to the servers per thread, with no step-wide norm to scale them by.
Status check_clip_by_norm(const TrainerConfig& c, const config::ConfigDocument& doc);

// Records the norm trained in c->model_keys and, when the folder's default set it, in
// c->derived_model_keys: a resume of a save made at another norm (one made before the key, in the
// dcn_v2 folder, at 0) names the -o that resumes it (check_saved_derived_keys).
void record_clip_by_norm(const config::ConfigDocument& doc, TrainerConfig* c);

// gpubox_train's start line when the folder's default (not the config) turned the clip on, or
// would have but for a parameter-server mode; "" else.
std::string clip_by_norm_note(const config::ConfigDocument& doc);

}  // namespace trainer
}  // namespace gpubox
