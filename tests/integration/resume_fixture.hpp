// The fixture of the save and resume tests (resume_test.cpp, fresh_run_saves_test.cpp): a
// small planted data set made once per suite, and 3 shuffled passes of a small dnn saved under a
// folder of the test's choice, on 2 simulated cards (the one of a 1-GPU machine).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "dataset/generator.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"

namespace gpubox::trainer::testing {

class ResumeFixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = std::filesystem::temp_directory_path() /
            ("gpubox_resume_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(root_);
    dataset::GeneratorOptions gen;
    gen.out_dir = (root_ / "train").string();
    gen.lines = 1200;
    gen.files = 2;
    gen.seed = 11;
    gen.slots = 4;
    gen.dense = 2;
    gen.vocab = 300;
    dataset::OracleSummary oracle;
    throw_if_error(dataset::generate(gen, &oracle));
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(root_); }

  // 3 shuffled passes of a small dnn, each saved under `save` (checkpoint: optimizer state too),
  // from configs/config_gpubox.yaml or the config file `yaml`.
  static TrainerConfig config(const std::filesystem::path& save,
                              const std::vector<std::string>& extra = {},
                              const std::string& yaml = "") {
    std::vector<std::string> overrides = {"runner.train_data_dir=" + (root_ / "train").string(),
                                          "runner.model_save_path=" + save.string(),
                                          "runner.save_mode=checkpoint",
                                          "runner.train_batch_size=40",
                                          "runner.epochs=3",
                                          "runner.shuffle=true",
                                          "runner.seed=3",
                                          "runner.metrics_path=",
                                          "hyper_parameters.sparse_inputs_slots=5",
                                          "hyper_parameters.sparse_feature_dim=5",
                                          "hyper_parameters.dense_input_dim=2",
                                          "hyper_parameters.fc_sizes=[16, 8]",
                                          "hyper_parameters.optimizer.learning_rate=0.01",
                                          "hyper_parameters.sparse_optimizer.learning_rate=0.3"};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    auto cfg = load_trainer_config(
        yaml.empty() ? std::string(GPUBOX_SOURCE_DIR) + "/configs/config_gpubox.yaml" : yaml,
        overrides);
    throw_if_error(cfg.status());
    return cfg.value();
  }
  static TrainerEnv env() {
    TrainerEnv e;
    e.selected_cards = device::testing::card_list(device::testing::cards_here(2));
    e.threads_per_card = 1;
    return e;
  }
  static std::vector<int64_t> passes(const std::vector<PassReport>& reports) {
    std::vector<int64_t> out;
    for (const auto& r : reports) out.push_back(r.pass);
    return out;
  }
  // The message of a call that must throw gpubox::Error.
  template <class F>
  static std::string error_of(F&& call) {
    try {
      call();
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "no error";
    return "";
  }

  inline static std::filesystem::path root_;
};

}  // namespace gpubox::trainer::testing
