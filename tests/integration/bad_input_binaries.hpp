// The fixture of the bad-input tests through the real binaries (bad_input_binaries_test.cpp,
// bad_input_saves_test.cpp): small generated data under a folder of its own, a config for it,
// and gpubox_train run on the in-process host tier.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/dataset/planted_data.hpp"
#include "tests/integration/child_process.hpp"

#if !defined(GPUBOX_TRAIN_BIN)
#error "GPUBOX_TRAIN_BIN must name the binary"
#endif

namespace gpubox::testing {

namespace fs = std::filesystem;

const std::vector<std::string> kLocalTier = {
    "FLAGS_selected_gpus=0", "GPUBOX_LOCAL_TIER=1",
    "PADDLE_PSERVERS_IP_PORT_LIST=", "PADDLE_TRAINERS_NUM=", "PADDLE_TRAINER_ID="};

class BadInputBinaries : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("gpubox_bad_input_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    testing::write_small_train_test(root_, 600, 200, /*seed=*/7, /*slots=*/4, /*dense=*/2,
                                    /*vocab=*/500, /*files=*/1);
    std::ofstream(root_ / "config.yaml") << "runner:\n"
                                            "  train_data_dir: train\n"
                                            "  test_data_dir: test\n"
                                            "  metrics_path: \"\"\n"
                                            "  train_batch_size: 32\n"
                                            "  infer_batch_size: 32\n"
                                            "  epochs: 2\n"
                                            "  print_interval: 5\n"
                                            "hyper_parameters:\n"
                                            "  sparse_inputs_slots: 5\n"
                                            "  dense_input_dim: 2\n"
                                            "  sparse_feature_dim: 5\n"
                                            "  fc_sizes: [8]\n";
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // gpubox_train on the test config from the test folder (model paths are taken from there).
  static Finished train(std::vector<std::string> args) {
    args.insert(args.begin(), {"--config", (root_ / "config.yaml").string()});
    return run_to_end(GPUBOX_TRAIN_BIN, args, kLocalTier, root_.string(), 120);
  }
  // The test file copied to <folder>/part-00000, line n (from 1) written as edit(n, line) (its
  // newline included); the folder.
  template <class Edit>
  static fs::path edited_test_data(const std::string& folder, const Edit& edit) {
    const fs::path dir = root_ / folder;
    fs::create_directories(dir);
    std::ifstream in(root_ / "test" / "part-00000");
    std::ofstream copy(dir / "part-00000");
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) copy << edit(n, line);
    return dir;
  }
  static bool trained_a_pass(const Finished& run) {
    return run.output.find("pass: 0, using time") != std::string::npos;
  }

  inline static fs::path root_;
};

}  // namespace gpubox::testing
