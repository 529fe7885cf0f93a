// The configs the in-process training tests run on the data they generate:
// configs/config_gpubox.yaml (or another shipped config) with the overrides that size it to the
// data, shared by the tests that generate the same shape (test_data_overrides: 8 key slots as
// tests/dataset/planted_data.hpp; small_dnn_overrides: 6 key slots), then each test's own keys.
// Needs GPUBOX_SOURCE_DIR (the test target defines it); the run's cards: cards_env
// (trainer_rows.hpp).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "trainer/config/config_loader.hpp"

namespace gpubox::trainer::testing {

// One epoch of unshuffled batches of 256 over the generated data's slots (sparse_inputs_slots
// counts the label, as PaddleRec does), with no metrics file, no save and one thread a card;
// then `more` (a later key wins).
inline std::vector<std::string> test_data_overrides(const std::vector<std::string>& more = {}) {
  std::vector<std::string> overrides = {"runner.train_batch_size=256",
                                        "runner.epochs=1",
                                        "runner.shuffle=false",
                                        "runner.metrics_path=",
                                        "runner.model_save_path=",
                                        "runner.thread_num=1",
                                        "hyper_parameters.sparse_inputs_slots=9",
                                        "hyper_parameters.dense_input_dim=3"};
  overrides.insert(overrides.end(), more.begin(), more.end());
  return overrides;
}

// A small dnn (mf_dim 4, fc 16-8) over the generated lines in `train_dir` (6 key slots, 3 dense
// features): one epoch of unshuffled batches of `batch`, two reader threads, no metrics file, no
// save, and rows that learn from their first show (no score thresholds) at learning rate 0.3;
// then `more` (a later key wins).
inline std::vector<std::string> small_dnn_overrides(const std::string& train_dir, int batch,
                                                    const std::vector<std::string>& more = {}) {
  std::vector<std::string> overrides = {"runner.train_data_dir=" + train_dir,
                                        "runner.train_batch_size=" + std::to_string(batch),
                                        "runner.epochs=1",
                                        "runner.shuffle=false",
                                        "runner.metrics_path=",
                                        "runner.model_save_path=",
                                        "runner.thread_num=2",
                                        "hyper_parameters.sparse_inputs_slots=7",
                                        "hyper_parameters.sparse_feature_dim=5",
                                        "hyper_parameters.dense_input_dim=3",
                                        "hyper_parameters.fc_sizes=[16, 8]",
                                        "hyper_parameters.optimizer.learning_rate=0.01",
                                        "hyper_parameters.sparse_optimizer.learning_rate=0.3",
                                        "hyper_parameters.sparse_optimizer.mf_learning_rate=0.3",
                                        "hyper_parameters.sparse_optimizer.embed_threshold=0",
                                        "hyper_parameters.sparse_optimizer.embedx_threshold=0"};
  overrides.insert(overrides.end(), more.begin(), more.end());
  return overrides;
}

// configs/<file> with `overrides`, then `extra`, applied in order; throws naming what failed.
inline TrainerConfig load_test_config(std::vector<std::string> overrides,
                                      const std::vector<std::string>& extra = {},
                                      const std::string& file = "config_gpubox.yaml") {
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  auto cfg = load_trainer_config(std::string(GPUBOX_SOURCE_DIR) + "/configs/" + file, overrides);
  throw_if_error(cfg.status());
  return std::move(cfg).value();
}

}  // namespace gpubox::trainer::testing
