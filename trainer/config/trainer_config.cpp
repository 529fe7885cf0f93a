#include "trainer/config/trainer_config.hpp"

namespace gpubox::trainer {

const char* to_string(SaveKind kind) {
  switch (kind) {
    case SaveKind::kNone:
      return "none";
    case SaveKind::kBase:
      return "base";
    case SaveKind::kDelta:
      return "delta";
    case SaveKind::kCheckpoint:
      return "checkpoint";
  }
  return "?";
}

std::vector<std::string> TrainerConfig::sparse_slot_names() const {
  if (!hyper.slot_names.empty()) return hyper.slot_names;
  std::vector<std::string> names;
  for (int s = 1; s <= num_sparse_slots(); ++s) names.push_back(std::to_string(s));
  return names;
}

DenseModelConfig TrainerConfig::dense_model_config() const {
  DenseModelConfig model;
  model.kind = hyper.model;
  model.slots = num_sparse_slots();
  model.mf_dim = mf_dim();
  model.use_cvm = hyper.use_cvm;
  model.dense_dim = hyper.dense_input_dim;
  model.fc_sizes = hyper.fc_sizes;
  model.seed = runner.seed;
  return model;
}

}  // namespace gpubox::trainer
