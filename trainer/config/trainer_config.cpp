#include "trainer/config/trainer_config.hpp"

namespace gpubox::trainer {

DenseModelConfig TrainerConfig::dense_model_config() const {
  DenseModelConfig model;
  model.kind = hyper.model;
  model.slots = num_sparse_slots();
  model.mf_dim = mf_dim();
  model.use_cvm = hyper.use_cvm;
  model.dense_dim = dataset.dense_dim;
  model.fc_sizes = hyper.fc_sizes;
  model.seed = runner.seed;
  model.precision = hyper.dense_precision;
  model.cross_layers = hyper.cross_layers;
  model.cross_rank = hyper.cross_rank;
  model.dcn_structure = hyper.dcn_structure;
  return model;
}

}  // namespace gpubox::trainer
