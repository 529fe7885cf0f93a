// Held-out AUC over several epochs on one small data set (issue 18 item 8), in process on one
// simulated card (deterministic: one thread, no shuffle):
//  - with configs/config_gpubox.yaml's sparse rule, no epoch lowers the held-out AUC by more than
//    0.003, and after every epoch it is at least that of Paddle's own rule minus 0.003;
//  - with Paddle's rule (embed_threshold 0: every key learned from its first sight; show_scale:
//    mean steps) the last epoch lowers it by more than 0.003, so the data do exercise the
//    memorisation of rare keys that the first check guards against.
// The data: 20,000 training lines over 8 slots of 20,000 keys each (Zipf 1.1: most keys are seen
// once or twice), held-out lines of the same planted model. Measured when written (held-out AUC
// after epochs 1-4): shipped 0.628 0.649 0.651 0.650; Paddle's rule 0.619 0.641 0.605 0.586;
// the shipped config with embed_threshold 0 0.629 0.649 0.647 0.615 (fails). BENCHMARKS.md has
// the full-size runs against Paddle itself.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "dataset/generator.hpp"
#include "tests/common/test_data_config.hpp"
#include "tests/integration/trainer_rows.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;

constexpr int kEpochs = 4;
constexpr double kTolerance = 0.003;  // the limit of issue 18 item 8

class HeldOutQuality : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("gpubox_quality_it_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    dataset::GeneratorOptions gen;
    dataset::OracleSummary oracle;
    gen.lines = 20000;
    gen.files = 1;
    gen.seed = 3;
    gen.slots = 8;
    gen.dense = 3;
    gen.vocab = 20000;
    gen.out_dir = (root_ / "train").string();
    throw_if_error(dataset::generate(gen, &oracle));
    gen.first_line = gen.lines;  // held-out lines: the same planted model, later in its stream
    gen.lines = 5000;
    gen.out_dir = (root_ / "test").string();
    throw_if_error(dataset::generate(gen, &oracle));
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // Held-out AUC after each epoch, config_gpubox.yaml with the model sized to the data.
  static std::vector<double> held_out_aucs(const std::vector<std::string>& extra) {
    Trainer trainer(
        testing::load_test_config(
            testing::test_data_overrides({"hyper_parameters.fc_sizes=[128, 64]"}), extra),
        testing::cards_env(1));
    const auto train = data_files((root_ / "train").string());
    const auto test = data_files((root_ / "test").string());
    std::vector<double> aucs;
    for (int epoch = 0; epoch < kEpochs; ++epoch) {
      trainer.train_pass(train);
      aucs.push_back(trainer.evaluate(test, false).metrics.auc);
    }
    return aucs;
  }

  static fs::path root_;
};
fs::path HeldOutQuality::root_;

TEST_F(HeldOutQuality, ShippedRuleDoesNotFallAndMatchesPaddlesRule) {
  const std::vector<double> shipped = held_out_aucs({});
  const std::vector<double> paddle =
      held_out_aucs({"hyper_parameters.sparse_optimizer.embed_threshold=0",
                     "hyper_parameters.sparse_optimizer.show_scale=true"});
  ASSERT_EQ(shipped.size(), static_cast<std::size_t>(kEpochs));
  ASSERT_EQ(paddle.size(), static_cast<std::size_t>(kEpochs));
  for (int e = 0; e < kEpochs; ++e) {
    SCOPED_TRACE("epoch " + std::to_string(e + 1));
    EXPECT_GT(shipped[e], 0.6) << "the model learned nothing";
    EXPECT_GE(shipped[e], paddle[e] - kTolerance);
    if (e > 0) {
      EXPECT_GE(shipped[e], shipped[e - 1] - kTolerance);
    }
  }
  // The data must make Paddle's rule memorise, or the checks above prove nothing.
  EXPECT_LT(paddle[kEpochs - 1], paddle[kEpochs - 2] - kTolerance);
}

}  // namespace
}  // namespace gpubox::trainer
