// The dead-output check of the epoch loop (trainer/schedule/dead_output.hpp): a training pass
// whose predictions all fall in one AUC bucket, over at least kMinDeadOutputExamples
// predictions of steady steps, stops the job naming the pass, the layer and its config keys;
// a tiny pass, a pass without steady steps, a one-class pass whose predictions vary, a pass of
// two distinct predictions and an undefined spread (NaN) are not judged dead (the PS modes'
// job-wide figure: ps_modes_failures_stops_test.cpp). A pass whose predictions spread over many
// buckets but whose steps gave most neighbouring instances one value (the output's bias moving it
// from step to step) is dead too, unless it beats the constant predictor. A dlrm with PaddleRec's
// two-class output and no batch norm under Adam at 1 dies in its first pass (both output units 0
// for good) and its first pass, whose first steps still moved the output, is already one value a
// step: it stops the job before its save; the same network with the norm, or at Adam 0.01, trains
// every pass. A dnn of one hidden layer at Adam 1 dies in its first pass with a
// moving output (one value a step): that pass stops the job.
#include "trainer/schedule/dead_output.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.hpp"
#include "dataset/generator.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"

namespace gpubox::trainer {
namespace {

constexpr int kBucketsLog2 = 10;
constexpr std::size_t kBuckets = std::size_t{1} << kBucketsLog2;

// A pass's merged metric buffer: `examples` predictions spread evenly over buckets
// [first, first + spread), every `positive_every`-th a positive (0: none), `steady` of them in
// steady steps.
MetricValues pass_of(double examples, std::size_t first, std::size_t spread, double steady,
                     int positive_every = 4, double pairs = 0, double tied_pairs = 0) {
  std::vector<double> flat(metrics_flat_size(kBuckets), 0.0);
  double* sums = flat.data() + 2 * kBuckets;
  for (int i = 0; i < static_cast<int>(examples); ++i) {
    const bool positive = positive_every > 0 && i % positive_every == 0;
    const std::size_t b = first + static_cast<std::size_t>(i) % spread;
    flat[(positive ? kBuckets : 0) + b] += 1;
    const double p = (static_cast<double>(b) + 0.5) / kBuckets;
    sums[metric_sums::kCount] += 1;
    sums[metric_sums::kLabels] += positive ? 1 : 0;
    sums[metric_sums::kPredictions] += p;
    sums[metric_sums::kLogLoss] += -std::log(positive ? p : 1 - p);
  }
  // The steady steps' share of the labels and the loss, as a part of the pass's.
  const double share = examples > 0 ? steady / examples : 0;
  sums[metric_sums::kSteadyCount] = steady;
  sums[metric_sums::kSteadyLabels] = sums[metric_sums::kLabels] * share;
  sums[metric_sums::kSteadyLogLoss] = sums[metric_sums::kLogLoss] * share;
  sums[metric_sums::kSteadyPairs] = pairs;
  sums[metric_sums::kSteadyTiedPairs] = tied_pairs;
  return compute_metrics(flat.data(), kBuckets);
}

TrainerConfig dlrm_softmax2(bool batch_norm) {
  TrainerConfig c;
  c.runner.auc_buckets_log2 = kBucketsLog2;
  c.hyper.model = ModelKind::kDlrm;
  c.hyper.dlrm_output = DlrmOutput::kSoftmax2;
  c.hyper.dnn_batch_norm = batch_norm;
  return c;
}

TEST(DeadOutput, OneValueForEveryPredictionOfAWholePassIsDead) {
  const MetricValues dead = pass_of(400, kBuckets / 2, 1, 300);
  EXPECT_EQ(dead.prediction_buckets, 1);
  EXPECT_TRUE(dead_output(dead));
  const std::string what = dead_output_error(3, dead, dlrm_softmax2(false), "the saves end");
  for (const char* part :
       {"pass 3: every one of its 400 training predictions is 0.500", "one AUC bucket of 2^10",
        "300 of them after each card's first runner.print_interval steps",
        "dlrm's two-class output layer (hyper_parameters.dlrm_output softmax2, "
        "hyper_parameters.dnn_batch_norm false)",
        "output 0 (softmax(0, 0) = 0.5)", "-o hyper_parameters.dnn_batch_norm=true",
        "-o hyper_parameters.dlrm_output=logit", "before the pass's save (the saves end)"}) {
    EXPECT_NE(what.find(part), std::string::npos) << part << "\n" << what;
  }
  // With the norm on: no advice to turn it on.
  EXPECT_EQ(dead_output_error(3, dead, dlrm_softmax2(true), "").find("dnn_batch_norm=true"),
            std::string::npos);
  // Another network: its output layer and the keys that shape it (its hidden layers and their
  // norm when it has some); a saturated sigmoid said so.
  TrainerConfig dnn;
  dnn.runner.auc_buckets_log2 = kBucketsLog2;
  const std::string no_hidden = dead_output_error(0, dead, dnn, "");
  EXPECT_NE(no_hidden.find("the output layer of hyper_parameters.model dnn: its logit is the same"),
            std::string::npos)
      << no_hidden;
  EXPECT_EQ(no_hidden.find("dnn_batch_norm"), std::string::npos) << no_hidden;
  // fm's fc_sizes (a key it does not read) name no hidden layer (its error advised the norm,
  // which fm refuses).
  TrainerConfig fm = dnn;
  fm.hyper.model = ModelKind::kFm;
  fm.hyper.fc_sizes = {8};
  const std::string fm_error = dead_output_error(0, dead, fm, "");
  EXPECT_NE(fm_error.find("hyper_parameters.model fm: its logit is the same"), std::string::npos)
      << fm_error;
  EXPECT_EQ(fm_error.find("dnn_batch_norm"), std::string::npos) << fm_error;
  dnn.hyper.fc_sizes = {8};
  const std::string hidden = dead_output_error(0, dead, dnn, "");
  EXPECT_NE(hidden.find("dnn: the last hidden layer's ReLU units (hyper_parameters.fc_sizes)"),
            std::string::npos)
      << hidden;
  EXPECT_NE(hidden.find("or hyper_parameters.dnn_batch_norm: true"), std::string::npos) << hidden;
  const MetricValues saturated = pass_of(400, kBuckets - 1, 1, 300);
  EXPECT_TRUE(dead_output(saturated));
  EXPECT_NE(dead_output_error(0, saturated, dnn, "").find("saturates the sigmoid"),
            std::string::npos);
}

TEST(DeadOutput, ATinyPassOrOneWithoutSteadyStepsIsNotJudged) {
  EXPECT_FALSE(dead_output(pass_of(400, 10, 1, 0)));  // one step per card: biases' constant
  EXPECT_FALSE(dead_output(pass_of(400, 10, 1, kMinDeadOutputExamples - 1)));
  EXPECT_TRUE(dead_output(pass_of(400, 10, 1, kMinDeadOutputExamples)));
  EXPECT_FALSE(dead_output(pass_of(0, 10, 1, 0)));  // empty: no bucket
  MetricValues undefined = pass_of(400, 10, 1, 300);
  undefined.prediction_buckets = std::nan("");
  EXPECT_FALSE(dead_output(undefined));
}

TEST(DeadOutput, PredictionsThatVaryAreAliveWhateverTheClasses) {
  EXPECT_EQ(pass_of(400, 10, 2, 300).prediction_buckets, 2);
  EXPECT_FALSE(dead_output(pass_of(400, 10, 2, 300)));  // two values, next to each other
  const MetricValues one_class = pass_of(400, 100, 50, 300, 0);
  EXPECT_TRUE(std::isnan(one_class.auc));
  EXPECT_FALSE(dead_output(one_class));
}

// One class in one bucket: a perfect fit (every label 0 predicted near 0, logloss 0.0000), not a
// dead network; nor is one bucket whose logloss is below the constant predictor's.
TEST(DeadOutput, AOneClassPassOrOneThatBeatsTheConstantIsNotJudged) {
  const MetricValues negatives = pass_of(400, 0, 1, 300, 0);
  EXPECT_EQ(negatives.prediction_buckets, 1);
  EXPECT_FALSE(dead_output(negatives));
  const MetricValues positives = pass_of(400, kBuckets - 1, 1, 300, 1);
  EXPECT_EQ(positives.positives, 400);
  EXPECT_FALSE(dead_output(positives));
  MetricValues fits = pass_of(400, 0, 1, 300);  // a quarter positives, all in bucket 0
  EXPECT_TRUE(dead_output(fits));
  fits.steady.logloss_sum = 0.01 * fits.steady.examples;  // the constant's: 0.562 each
  EXPECT_FALSE(dead_output(fits));
}

// Predictions over 200 buckets, but most neighbours of each steady step tied: one value a step,
// moved by the output's bias. Dead from half the pairs tied, unless it beats the constant.
TEST(DeadOutput, OneValueAStepThatMovesFromStepToStepIsDead) {
  const MetricValues moving = pass_of(400, 100, 200, 300, 4, 290, 145);
  EXPECT_EQ(moving.prediction_buckets, 200);
  EXPECT_EQ(moving.steady.pairs, 290);
  EXPECT_EQ(moving.steady.tied_pairs, 145);
  EXPECT_TRUE(dead_output(moving));
  EXPECT_FALSE(dead_output(pass_of(400, 100, 200, 300, 4, 290, 144)));
  EXPECT_FALSE(dead_output(pass_of(400, 100, 200, 300, 4, 290, 0)));
  EXPECT_FALSE(dead_output(pass_of(400, 100, 200, 300, 4, 0, 0)));  // no pair: not judged
  MetricValues fits = moving;
  fits.steady.logloss_sum = 0.3 * fits.steady.examples;  // the constant's: 0.562 each
  EXPECT_FALSE(dead_output(fits));
  TrainerConfig dnn;
  dnn.runner.auc_buckets_log2 = kBucketsLog2;
  dnn.hyper.fc_sizes = {8};
  const std::string what = dead_output_error(2, moving, dnn, "the saves end");
  for (const char* part :
       {"pass 2: the network gives most instances of a step one prediction whatever their "
        "features: 145 of the 290 pairs of neighbouring instances of its steady steps were "
        "predicted the same to within one AUC bucket of 2^10",
        "moving from step to step with the output's bias",
        "the last hidden layer's ReLU units (hyper_parameters.fc_sizes)",
        "before the pass's save (the saves end)"}) {
    EXPECT_NE(what.find(part), std::string::npos) << part << "\n" << what;
  }
}

class DeadOutputRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = std::filesystem::temp_directory_path() /
            ("gpubox_dead_output_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(root_);
    dataset::GeneratorOptions gen;
    gen.out_dir = (root_ / "train").string();
    gen.lines = 4000;
    gen.files = 1;
    gen.seed = 7;
    gen.slots = 4;
    gen.dense = 2;
    gen.vocab = 300;
    dataset::OracleSummary oracle;
    throw_if_error(dataset::generate(gen, &oracle));
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(root_); }

  // dlrm with the two-class output (or a dnn of one hidden layer of 16: `dlrm` false) under Adam
  // at `rate`, 3 passes saved under root/<name>.
  static TrainerConfig config(const std::string& name, const std::string& rate,
                              const std::vector<std::string>& extra = {}, bool dlrm = true) {
    std::vector<std::string> overrides = {"runner.train_data_dir=" + (root_ / "train").string(),
                                          "runner.model_save_path=" + (root_ / name).string(),
                                          "runner.metrics_path=",
                                          "runner.epochs=3",
                                          "runner.train_batch_size=64",
                                          "runner.print_interval=5",
                                          "hyper_parameters.sparse_inputs_slots=5",
                                          "hyper_parameters.sparse_feature_dim=5",
                                          "hyper_parameters.dense_input_dim=2",
                                          "hyper_parameters.fc_sizes=[16]",
                                          "hyper_parameters.optimizer.class=Adam",
                                          "hyper_parameters.optimizer.learning_rate=" + rate};
    if (dlrm) {
      overrides.insert(overrides.end(),
                       {"hyper_parameters.model=dlrm", "hyper_parameters.bot_layer_sizes=[8, 5]",
                        "hyper_parameters.dlrm_output=softmax2"});
    }
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    auto cfg = load_trainer_config(std::string(GPUBOX_SOURCE_DIR) + "/configs/config_gpubox.yaml",
                                   overrides);
    throw_if_error(cfg.status());
    return cfg.value();
  }
  static TrainerEnv one_card() {
    TrainerEnv env;
    env.selected_cards = "0";
    env.threads_per_card = 1;
    return env;
  }

  // Trains `cfg` (saving under root/<name>): it must stop with an error holding every part, and
  // leave no save of pass 0.
  static void expect_stopped_before_pass_0_save(const TrainerConfig& cfg, const std::string& name,
                                                const std::vector<std::string>& parts) {
    Trainer trainer(cfg, one_card());
    try {
      trainer.train();
      ADD_FAILURE() << "no error: the dead network trained on";
    } catch (const Error& e) {
      const std::string what = e.what();
      for (const std::string& part : parts) {
        EXPECT_NE(what.find(part), std::string::npos) << part << "\n" << what;
      }
    }
    EXPECT_FALSE(std::filesystem::exists(root_ / name / "0"));
  }

  static std::filesystem::path root_;
};
std::filesystem::path DeadOutputRun::root_;

TEST_F(DeadOutputRun, DlrmsTwoClassOutputWithoutTheNormDiesAndStopsTheJobBeforeItsSave) {
  expect_stopped_before_pass_0_save(
      config("dead", "1"), "dead",
      {"pass 0: the network gives most instances of a step one "
       "prediction",
       "hyper_parameters.dlrm_output softmax2", "hyper_parameters.dnn_batch_norm false",
       "-o hyper_parameters.dnn_batch_norm=true"});
}

TEST_F(DeadOutputRun, TheSameNetworkWithTheNormOrAGentlerRateTrainsEveryPass) {
  for (const auto& [name, rate, extra] :
       {std::tuple<std::string, std::string, std::vector<std::string>>{
            "normed", "1", {"hyper_parameters.dnn_batch_norm=true"}},
        {"gentle", "0.01", {}}}) {
    Trainer trainer(config(name, rate, extra), one_card());
    EXPECT_EQ(trainer.train().size(), 3u) << name;
  }
}

// A dnn whose hidden ReLUs all die at Adam 1 in pass 0: its output is the output layer's bias,
// one value a step that Adam moves from step to step (so over many buckets in the pass): pass 0
// stops the job before its save. At Adam 0.01 the same network trains every pass.
TEST_F(DeadOutputRun, ADnnWhoseOutputMovesWithItsBiasIsDeadToo) {
  expect_stopped_before_pass_0_save(
      config("dnn_dead", "1", {}, /*dlrm=*/false), "dnn_dead",
      {"pass 0: the network gives most instances of a step one prediction whatever their "
       "features",
       "the output layer of hyper_parameters.model dnn",
       "the last hidden layer's ReLU units (hyper_parameters.fc_sizes)"});
  Trainer gentle(config("dnn_gentle", "0.01", {}, /*dlrm=*/false), one_card());
  EXPECT_EQ(gentle.train().size(), 3u);
}

}  // namespace
}  // namespace gpubox::trainer
