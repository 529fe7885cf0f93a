#include "trainer/config/clip_by_norm.hpp"

#include <cmath>

#include "common/config/config_document.hpp"
#include "common/config/config_keys.hpp"
#include "common/config/network_shape.hpp"
#include "common/enum_names.hpp"
#include "trainer/config/dnn_dropout.hpp"

namespace gpubox::trainer {
namespace {

constexpr const char* kKey = "hyper_parameters.optimizer.clip_by_norm";

bool builds_clip(const config::ConfigDocument& doc) {
  return doc.get_enum("runner.sync_mode", config::kSyncModeNames) == SyncMode::kGpubox;
}

// Whether PaddleRec's dcn_v2 trainer's default applies: its folder, its network.
bool dcn_v2_folder_network(const config::ConfigDocument& doc) {
  if (config::paddlerec_model_name(doc) != "dcn_v2") return false;
  const StatusOr<config::NetworkChoice> network = config::resolve_network(doc);
  return network.ok() && network->model == ModelKind::kDcnV2;
}

}  // namespace

double clip_by_norm_of(const config::ConfigDocument& doc) {
  const double clip = doc.get_float(kKey);
  if (doc.is_set(kKey)) return clip;
  return dcn_v2_folder_network(doc) && builds_clip(doc) ? kPaddleRecDcnV2ClipByNorm : 0.0;
}

Status check_clip_by_norm(const TrainerConfig& c, const config::ConfigDocument& doc) {
  const double clip = c.hyper.clip_by_norm;
  if (!(std::isfinite(clip) && clip >= 0.0)) {
    return Status::InvalidArgument(doc.source() + ": " + kKey + " must be finite and >= 0 (0: " +
                                   "no clip), got " + config::number_text(clip));
  }
  if (clip > 0.0 && c.runner.sync_mode != SyncMode::kGpubox) {
    return Status::InvalidArgument(
        doc.source() + ": " + kKey + " is " + config::number_text(clip) +
        ", but clipping by global norm is built only in runner.sync_mode gpubox (and Collective " +
        "mode), not in " + name_of(config::kSyncModeNames, c.runner.sync_mode) +
        " (its threads push their sparse gradients to the servers with no step-wide norm); " +
        "set it to 0 or use runner.sync_mode gpubox");
  }
  return Status::OK();
}

void record_clip_by_norm(const config::ConfigDocument& doc, TrainerConfig* c) {
  c->model_keys[kKey] = dnn_dropout_text(c->hyper.clip_by_norm);  // a float key's text
  if (doc.is_set(kKey) || c->hyper.clip_by_norm == 0.0) return;
  c->derived_model_keys[kKey] =
      "derived when unset from PaddleRec's dcn_v2 dygraph_model.py's ClipGradByGlobalNorm";
}

std::string clip_by_norm_note(const config::ConfigDocument& doc) {
  if (doc.is_set(kKey) || !dcn_v2_folder_network(doc)) return "";
  const std::string paddle =
      "PaddleRec's dcn_v2 trainer's default (its dygraph_model.py clips "
      "every gradient, the embedding's too, by global norm at " +
      config::number_text(kPaddleRecDcnV2ClipByNorm) + ")";
  if (!builds_clip(doc)) {
    return std::string(kKey) + ": 0, not " + paddle + ": runner.sync_mode " +
           name_of(config::kSyncModeNames,
                   doc.get_enum("runner.sync_mode", config::kSyncModeNames)) +
           " does not build the clip (gpubox and Collective mode do)";
  }
  return std::string(kKey) + ": " + config::number_text(kPaddleRecDcnV2ClipByNorm) + ", " + paddle +
         "; -o " + kKey + "=0 turns it off";
}

}  // namespace gpubox::trainer
