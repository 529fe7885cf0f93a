// Training steps on slot data whose keys per line VARY (Criteo's and PaddleRec's slot data do:
// every batch its own occurrence, distinct-key and per-owner counts, a short last batch), on 1, 2
// and 4 simulated cards, with the fixture of step_accounting_test.cpp
// (step_accounting_fixture.hpp):
//   - PassSizing: every size of a step is known before the pass starts (issue 31, item 1): no step
//     of any path (gpubox mode, Collective mode, evaluation, a streamed pass) allocates;
//   - StepGraphs: training with the step as step graphs equals the eager run bit for bit (issue
//     31, item 3).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/integration/scoped_env.hpp"
#include "tests/integration/step_accounting_fixture.hpp"
#include "tests/integration/step_waits.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"

namespace gpubox::trainer {
namespace {

using gpubox::testing::ScopedEnv;  // tests/integration/scoped_env.hpp
using step_test::cards_env;
using step_test::expect_no_round_trip;
using step_test::StepAccounting;

// Issue 31, item 3: training with the step as step graphs (gpubox mode: the sparse half too, at
// the pass's fixed sizes) equals the eager run bit for bit (metrics of every pass, every card's
// dense parameters and adam state through them, and the predictions of the trained model, which
// read the sparse rows too), on data whose keys per line vary and whose last batch is short (run
// eagerly between replays), in gpubox and Collective mode. Fails if a capture bakes in a value that
// changes per step (adam's bias correction did).
struct TrainedModel {
  std::vector<MetricValues> passes;
  std::vector<std::vector<float>> dense;  // per card
  std::vector<float> predictions;
  double graph_launches_per_step = 0;
};

TrainedModel train_and_predict(int cards, const std::string& data_dir, bool collective) {
  std::vector<std::string> overrides = {
      "runner.train_data_dir=" + data_dir,
      "runner.train_batch_size=100",
      "runner.shuffle=false",
      "runner.metrics_path=",
      "runner.print_interval=7",
      std::string("runner.use_fleet=") + (collective ? "true" : "false")};
  auto parsed = parse_trainer_config("runner: {}\n", ".", overrides);
  throw_if_error(parsed.status());
  Trainer trainer(std::move(parsed).value(), cards_env(cards));
  const auto files = data_files(data_dir);
  TrainedModel out;
  for (int pass = 0; pass < 2; ++pass) {
    const PassReport report = trainer.train_pass(files);
    out.passes.push_back(report.metrics);
    const std::map<std::string, double> extra(report.extra.begin(), report.extra.end());
    out.graph_launches_per_step = extra.at("graph_launches_per_step");
  }
  for (int c = 0; c < trainer.num_cards(); ++c) out.dense.push_back(trainer.dense_values(c));
  out.predictions = trainer.evaluate(files, /*keep_predictions=*/true).predictions;
  return out;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

class StepGraphs : public StepAccounting {};

TEST_P(StepGraphs, TrainingEqualsTheEagerRunBitForBit) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  for (const bool collective : {false, true}) {
    SCOPED_TRACE(collective ? "Collective mode" : "gpubox mode");
    const TrainedModel graphed = train_and_predict(cards, varying_keys_dir(), collective);
    TrainedModel eager;
    {
      ScopedEnv off("GPUBOX_STEP_GRAPHS", "0");
      eager = train_and_predict(cards, varying_keys_dir(), collective);
    }
    // The whole step as 1 graph, the short last batch's too.
    EXPECT_EQ(graphed.graph_launches_per_step, 1.0) << "the steps did not run as one graph";
    EXPECT_EQ(eager.graph_launches_per_step, 0.0);
    ASSERT_EQ(graphed.passes.size(), eager.passes.size());
    for (std::size_t p = 0; p < graphed.passes.size(); ++p) {
      const MetricValues& g = graphed.passes[p];
      const MetricValues& e = eager.passes[p];
      for (const auto& [name, a, b] :
           {std::tuple{"auc", g.auc, e.auc}, std::tuple{"logloss", g.logloss, e.logloss},
            std::tuple{"predicted_ctr", g.predicted_ctr, e.predicted_ctr},
            std::tuple{"rmse", g.rmse, e.rmse}, std::tuple{"examples", g.examples, e.examples}}) {
        EXPECT_TRUE(std::memcmp(&a, &b, sizeof(double)) == 0)
            << "pass " << p << " " << name << ": " << a << " with graphs, " << b << " without";
      }
    }
    ASSERT_EQ(graphed.dense.size(), static_cast<std::size_t>(cards));
    for (int c = 0; c < cards; ++c) {
      EXPECT_TRUE(same_bits(graphed.dense[c], eager.dense[c])) << "card " << c;
    }
    EXPECT_FALSE(graphed.predictions.empty());
    EXPECT_TRUE(same_bits(graphed.predictions, eager.predictions));
  }
}

INSTANTIATE_TEST_SUITE_P(Cards, StepGraphs, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "cards"; });

// Issue 31, item 1: every size of a step is known before the pass starts. On data whose keys per
// line vary, no step of any pass allocates or frees card memory or (re)allocates a pinned buffer,
// its first steps included (before the sizes were planned per pass, the first pass's steps
// allocated 66 times on 1 card, 229 on 4, and regrew the pinned staging block), on every path:
// gpubox mode, Collective mode, evaluation.
class PassSizing : public StepAccounting {};

void expect_no_step_allocates(const std::map<std::string, double>& counts, const char* what) {
  for (const char* key : {"pass_step_allocations", "pass_step_frees",
                          "pass_step_pinned_allocations", "pass_step_window_allocations"}) {
    ASSERT_TRUE(counts.count(key)) << what << ": the pass report has no " << key;
    EXPECT_EQ(counts.at(key), 0.0) << what << ": " << key;
  }
}

TEST_P(PassSizing, NoStepOfAnyPathAllocatesOnDataWithVaryingKeysPerLine) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  Counts eval;
  const auto [first, second] = both_passes(cards, {}, varying_keys_dir(), &eval);
  expect_no_step_allocates(first, "gpubox mode, first pass");
  expect_no_step_allocates(second, "gpubox mode, second pass");
  // Nor does an evaluation step wait for the card (issue 31, item 2): its pulls are planned and
  // their checks read late, drained at the evaluation's end (a card behind the host makes it
  // wait for a full ring's oldest step: at most once a step, step_waits.hpp).
  for (const char* key : {"eval_step_allocations", "eval_step_frees",
                          "eval_step_pinned_allocations", "eval_step_host_syncs"}) {
    ASSERT_TRUE(eval.count(key)) << "the evaluation has no " << key;
    EXPECT_EQ(eval.at(key), 0.0) << "evaluation: " << key;
  }
  // Its steps past the warm-up, where it has any (the default infer batch: few on 4 cards).
  if (eval.count("eval_steady_steps")) expect_no_round_trip(eval, "eval_", "evaluation");
  const auto [first_collective, second_collective] =
      both_passes(cards, {"runner.use_fleet=true"}, varying_keys_dir());
  expect_no_step_allocates(first_collective, "Collective mode, first pass");
  expect_no_step_allocates(second_collective, "Collective mode, second pass");
}

// An evaluation that keeps its predictions reads them late too (issue 31, item 4): each step's
// predictions go into its pinned slot and reach the result when the slot is read, so no step
// waits for the card (it waited once a step before). Oracle: the log loss of the returned
// predictions against the returned labels, in float64 on the host, equals the one the cards
// computed; every prediction is a probability.
TEST_P(PassSizing, AnEvaluationKeepingItsPredictionsNeverWaits) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  auto parsed = parse_trainer_config(
      "runner: {}\n", ".",
      {"runner.train_data_dir=" + varying_keys_dir(), "runner.train_batch_size=100",
       "runner.infer_batch_size=100", "runner.shuffle=false", "runner.metrics_path="});
  throw_if_error(parsed.status());
  Trainer trainer(std::move(parsed).value(), cards_env(cards));
  const auto files = data_files(varying_keys_dir());
  trainer.train_pass(files);
  const EvalResult result = trainer.evaluate(files, /*keep_predictions=*/true);
  const Counts extra(result.extra.begin(), result.extra.end());
  EXPECT_EQ(extra.at("eval_step_host_syncs"), 0.0);
  expect_no_round_trip(extra, "eval_", "evaluation keeping its predictions");
  EXPECT_EQ(extra.at("eval_step_pinned_allocations"), 0.0);
  ASSERT_EQ(result.predictions.size(), 4037u);
  ASSERT_EQ(result.labels.size(), result.predictions.size());
  double loss = 0;
  for (std::size_t i = 0; i < result.predictions.size(); ++i) {
    ASSERT_TRUE(result.predictions[i] >= 0 && result.predictions[i] <= 1)
        << "prediction " << i << ": " << result.predictions[i];
    // Clipped as MetricValues::logloss's.
    const double p = std::clamp<double>(result.predictions[i], 1e-7, 1 - 1e-7);
    loss -= result.labels[i] > 0.5 ? std::log(p) : std::log(1 - p);
  }
  loss /= static_cast<double>(result.predictions.size());
  EXPECT_NEAR(loss, result.metrics.logloss, 1e-4 * result.metrics.logloss);
}

// QueueDataset passes (streamed, never in memory) too: their step sizes are planned while the
// pass is read for its keys (PassStepSizer over QueueDataset::scan's chunks), so their steps
// allocate nothing either; before, their first steps allocated and the pinned staging regrew.
TEST_P(PassSizing, NoStepOfAStreamedPassAllocates) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  const auto [first, second] =
      both_passes(cards, {"runner.reader_type=QueueDataset"}, varying_keys_dir());
  expect_no_step_allocates(first, "QueueDataset, first pass");
  expect_no_step_allocates(second, "QueueDataset, second pass");
  // Planned, the pulls take their counts from the plan: no wait, as in memory.
  expect_no_round_trip(second, "", "QueueDataset, second pass");
  const auto [first_collective, second_collective] = both_passes(
      cards, {"runner.reader_type=QueueDataset", "runner.use_fleet=true"}, varying_keys_dir());
  expect_no_step_allocates(first_collective, "QueueDataset, Collective mode, first pass");
  expect_no_step_allocates(second_collective, "QueueDataset, Collective mode, second pass");
}

INSTANTIATE_TEST_SUITE_P(Cards, PassSizing, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "cards"; });
}  // namespace
}  // namespace gpubox::trainer
