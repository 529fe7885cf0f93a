// PaddleRec model folders' configs (their runner and hyper_parameters unchanged) that more than
// one test reads: the networks test and the optimizer rules test.
#pragma once

namespace gpubox::trainer::paddlerec_test {

// dlrm's config.yaml (its runner and hyper_parameters, unchanged): the network its folder names,
// bot_layer_sizes, top_layer_sizes as fc_sizes and the logit, num_field as its sparse fields.
inline constexpr const char* kDlrm = R"(workspace: "models/rank/dlrm"
runner:
  train_data_dir: "data/sample_data/train"
  train_reader_path: "criteo_reader"
  use_gpu: False
  use_xpu: False
  use_auc: True
  train_batch_size: 2
  epochs: 3
  print_interval: 2
  model_save_path: "output_model_dlrm"
  infer_batch_size: 2
  infer_reader_path: "criteo_reader"
  test_data_dir: "data/sample_data/train"
  infer_load_path: "output_model_dlrm"
  infer_start_epoch: 0
  infer_end_epoch: 3
  sync_mode: "async"
  split_file_list: False
  thread_num: 1
  num_workers: 0
  inference: False
  save_inference_feed_varnames: ["C1","C2","dense_input"]
  save_inference_fetch_varnames: ["sigmoid_0.tmp_0"]
hyper_parameters:
  optimizer:
    class: SGD
    learning_rate: 0.1
    strategy: async
  sparse_inputs_slots: 27
  dense_input_dim: 13
  bot_layer_sizes: [512, 256, 64, 16]
  sparse_feature_number: 1000001
  sparse_feature_dim: 16
  top_layer_sizes: [512, 256, 2]
  num_field: 26
)";

// autoint's config.yaml (its runner and hyper_parameters, unchanged): the network its folder
// names, embedding_dim as the embedding (sparse_feature_dim one more), its interacting layers,
// fc_sizes [] (no DNN); feature_number, use_sparse and distributed_embedding change nothing.
inline constexpr const char* kAutoint = R"(workspace: "models/rank/autoint"
runner:
  train_data_dir: "data/sample_data/train"
  train_reader_path: "criteo_reader" # importlib format
  use_gpu: True
  use_xpu: False   # Enable this option only if you have an xpu device
  use_auc: True
  train_batch_size: 2
  epochs: 3
  print_interval: 2
  # model_init_path: "output_model_deepfm/2" # init model
  model_save_path: "output_model_autoint"
  test_data_dir: "data/sample_data/train"
  infer_reader_path: "criteo_reader" # importlib format
  infer_batch_size: 2
  infer_load_path: "output_model_autoint"
  infer_start_epoch: 0
  infer_end_epoch: 3
  # use fleet
  use_fleet: False
hyper_parameters:
  optimizer:
    class: Adam
    learning_rate: 0.001
    strategy: async
  feature_number: 1000001
  embedding_dim: 16
  fc_sizes: [] #[256, 128]
  use_residual: True
  scaling: True
  use_wide: True
  use_sparse: True
  head_num: 2
  num_field: 39
  attn_layer_sizes: [64,64,64]
  distributed_embedding: 0
)";

}  // namespace gpubox::trainer::paddlerec_test
