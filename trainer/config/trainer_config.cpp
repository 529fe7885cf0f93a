#include "trainer/config/trainer_config.hpp"

namespace gpubox::trainer {

DenseModelConfig TrainerConfig::dense_model_config() const {
  DenseModelConfig model;
  model.kind = hyper.model;
  model.slots = num_sparse_slots();
  model.mf_dim = mf_dim();
  if (sparse.slot_dims.count > 0) {
    model.mf_dim = table::record_layout(sparse).mf_dim;
    for (int s = 0; s < model.slots; ++s) {
      model.slot_dims.push_back(
          table::slot_mf_dim(sparse, dataset::slot_id(dataset.slots, static_cast<std::size_t>(s))));
    }
  }
  model.use_cvm = hyper.use_cvm;
  model.dense_dim = dataset.dense_dim;
  model.fc_sizes = hyper.fc_sizes;
  model.seed = runner.seed;
  model.precision = hyper.dense_precision;
  model.cross_layers = hyper.cross_layers;
  model.cross_rank = hyper.cross_rank;
  model.dcn_structure = hyper.dcn_structure;
  model.cross_experts =
      hyper.model == ModelKind::kDcnV2 && hyper.cross_mixture ? hyper.cross_experts : 0;
  model.cross_l2 = static_cast<float>(hyper.cross_l2);
  model.bot_layer_sizes = hyper.bot_layer_sizes;
  model.batch_norm = hyper.dnn_batch_norm;
  model.cin_layer_sizes = hyper.layer_sizes_cin;
  model.attn_layer_sizes = hyper.attn_layer_sizes;
  model.attn_heads = hyper.head_num;
  model.attn_residual = hyper.use_residual;
  model.attn_scaling = hyper.scaling;
  model.attn_use_wide = hyper.use_wide;
  model.flen_groups = hyper.field_group_sizes;
  return model;
}

Status check_saved_batch_norm(const std::map<std::string, std::string>& saved_model_keys,
                              const TrainerConfig& config, const std::string& save_dir) {
  static const std::string kKey = "hyper_parameters.dnn_batch_norm";
  const auto found = saved_model_keys.find(kKey);
  const bool saved = found != saved_model_keys.end() && found->second == "true";
  if (saved == config.hyper.dnn_batch_norm) return Status::OK();
  auto text = [](bool on) { return std::string(on ? "true" : "false"); };
  return Status::InvalidArgument(
      "save " + save_dir + " was made with " + kKey + "=" + text(saved) +
      (found == saved_model_keys.end() ? " (it records no such key: made before it)" : "") +
      ", but the config " + config.config_path + " has " + text(config.hyper.dnn_batch_norm) +
      " (PaddleRec's dlrm folder turns it on when unset, every other config off): add -o " + kKey +
      "=" + text(saved) + " to read this save");
}

}  // namespace gpubox::trainer
