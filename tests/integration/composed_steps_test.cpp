// Every planned step of a padded pass is ONE step graph launch on every card (issue 31, item 3;
// trainer/engine/card_worker.hpp), the edges included:
//  - an evaluation step: "eval step", the sparse lookup, the forward, the metrics, the
//    predictions' copy into the slot's pinned block and the ring's slot counter composed
//    (it was 2 graphs, "sparse lookup" and "dense predict", and 2 ring-slot kernels outside);
//  - an evaluation keeping its predictions captures one graph per batch size and upload buffer,
//    whichever ring slot a step's predictions go to (the card picks the slot's pinned block);
//  - a card whose batch is empty in a pass's last step (an uneven last round): the same composed
//    graph over zero rows, so its collectives run inside one graph as its peers' do (it ran its
//    sparse half's own 2 graphs and its dense half eagerly, the dense all-reduce outside them,
//    while the other cards replayed their composed graph).
// Data: `cards` x 100 x 8 lines plus cards - 1, batches of 100 a card: the last round gives every
// card but the last 1 line and the last card none, in training and in evaluation. On 1 (a one-GPU
// machine's case), 2 and 3 simulated cards, gpubox and Collective mode, a training pass and an
// evaluation keeping its predictions: every steady step is exactly 1 graph launch with nothing
// launched, exchanged or waited for outside it, and the run equals GPUBOX_STEP_GRAPHS=0 (every
// step eagerly) bit for bit: the pass's metrics, every card's dense parameters, the host tier's
// rows after the write-back, the evaluation's metrics and every prediction.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "dataset/generator.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/integration/scoped_env.hpp"
#include "tests/integration/step_waits.hpp"
#include "tests/integration/trainer_rows.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;

using Counts = std::map<std::string, double>;
using gpubox::testing::ScopedEnv;  // tests/integration/scoped_env.hpp
using testing::host_rows;
using testing::Rows;
using testing::same_rows;

constexpr std::size_t kBatch = 100;
constexpr std::size_t kRounds = 8;

std::size_t lines_for(int cards) {
  const auto c = static_cast<std::size_t>(cards);
  return c * kBatch * kRounds + (c - 1);
}

// What a run leaves: the pass's metrics, counts and host rows, every card's dense parameters, the
// evaluation's metrics, counts and predictions.
struct RunResult {
  MetricValues metrics;
  Counts counts;
  Rows host;
  std::vector<std::vector<float>> dense;
  MetricValues eval_metrics;
  Counts eval_counts;
  std::vector<float> predictions;
};

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

class ComposedSteps : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("gpubox_composed_steps_" + std::to_string(::getpid()));
    fs::remove_all(root_);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // The data for `cards` cards (made once): the default model's shape, 0 to 3 keys in each slot
  // of a line (every batch its own occurrence and distinct counts).
  static std::string data_for(int cards) {
    const fs::path dir = root_ / ("cards" + std::to_string(cards));
    if (fs::exists(dir)) return dir.string();
    testing::generate_lines(dir.string(), lines_for(cards), /*seed=*/11, /*vocab=*/3000, "0:3");
    return dir.string();
  }

  // One training pass, then an evaluation over the same data keeping its predictions.
  static RunResult run(int cards, bool collective) {
    const std::string data = data_for(cards);
    auto parsed = parse_trainer_config(
        "runner: {}\n", ".",
        {"runner.train_data_dir=" + data, "runner.train_batch_size=" + std::to_string(kBatch),
         "runner.infer_batch_size=" + std::to_string(kBatch), "runner.shuffle=false",
         "runner.metrics_path=", "runner.print_interval=5",
         std::string("runner.use_fleet=") + (collective ? "true" : "false")});
    throw_if_error(parsed.status());
    const TrainerEnv env = testing::cards_env(cards);
    Trainer trainer(std::move(parsed).value(), env);
    const auto files = data_files(data);
    RunResult out;
    const PassReport report = trainer.train_pass(files);
    out.metrics = report.metrics;
    out.counts = Counts(report.extra.begin(), report.extra.end());
    out.host = host_rows(trainer);
    for (int c = 0; c < trainer.num_cards(); ++c) out.dense.push_back(trainer.dense_values(c));
    const EvalResult eval = trainer.evaluate(files, /*keep_predictions=*/true);
    out.eval_metrics = eval.metrics;
    out.eval_counts = Counts(eval.extra.begin(), eval.extra.end());
    out.predictions = eval.predictions;
    return out;
  }

  static fs::path root_;
};
fs::path ComposedSteps::root_;

void expect_same_metrics(const MetricValues& g, const MetricValues& e, const char* what) {
  for (const auto& [name, x, y] :
       {std::tuple{"auc", g.auc, e.auc}, std::tuple{"logloss", g.logloss, e.logloss},
        std::tuple{"predicted_ctr", g.predicted_ctr, e.predicted_ctr},
        std::tuple{"examples", g.examples, e.examples}}) {
    EXPECT_TRUE(std::memcmp(&x, &y, sizeof(double)) == 0)
        << what << " " << name << ": " << x << " with graphs, " << y << " eagerly";
  }
}

// A steady step (training's, or with prefix "eval_" an evaluation's) is 1 graph launch and
// nothing else the host waits for, launches or exchanges.
void expect_one_graph_launch(const Counts& counts, const std::string& prefix) {
  ASSERT_TRUE(counts.count(prefix + "steady_steps")) << prefix << ": no step counts";
  EXPECT_GT(counts.at(prefix + "steady_steps"), 2.0) << prefix;
  EXPECT_EQ(counts.at(prefix + "graph_launches_per_step"), 1.0) << prefix;
  for (const char* key : {"launches_per_step", "collectives_per_step", "allocations_per_step",
                          "pageable_copies_per_step"}) {
    EXPECT_EQ(counts.at(prefix + key), 0.0) << prefix << key;
  }
  // No round trip, at most one pipeline wait in a step (step_waits.hpp). Under
  // GPUBOX_DEVICE_CHECK=defer (ctest -L device_order) a replay without a collective (Collective
  // mode's evaluation step) is deferred whole until something demands it, so the ring's
  // Event::ready finds a slot 4 steps old pending: a card behind its host, as a GPU's can be,
  // whose retire counts that pipeline wait.
  step_test::expect_no_round_trip(counts, prefix, prefix.empty() ? "training" : prefix);
}

TEST_P(ComposedSteps, AnEmptyLastBatchAndEvaluationStepsAreOneGraphLaunchEqualToEagerRuns) {
  const auto [cards, collective] = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  // The data's last round: every card but the last one line, the last card none (on one card,
  // what a one-GPU machine runs, full rounds only: the evaluation's one graph is still checked).
  const std::size_t lines = lines_for(cards);
  for (int c = 0; cards > 1 && c < cards; ++c) {
    EXPECT_EQ(dataset::batch_span_of(lines, kBatch, c, cards, kRounds).size(),
              c + 1 < cards ? 1u : 0u)
        << "card " << c;
  }
  const RunResult graphed = run(cards, collective);
  RunResult eager;
  {
    const ScopedEnv off("GPUBOX_STEP_GRAPHS", "0");
    eager = run(cards, collective);
  }
  {
    SCOPED_TRACE("with step graphs");
    expect_one_graph_launch(graphed.counts, "");
    expect_one_graph_launch(graphed.eval_counts, "eval_");
    // An evaluation step is less work than a training step.
    EXPECT_LT(graphed.eval_counts.at("eval_graph_nodes_per_step"),
              graphed.counts.at("graph_nodes_per_step"));
    // Graphs captured by the evaluation keeping its predictions: on every card one per upload
    // buffer for its 8 full batches (they alternate the two) and one for the last round's
    // batch (1 line, or none on the last card). One graph serves every ring slot: the
    // predictions' block is picked on the card (LateReadback::copy_to_slot_block); with the
    // block baked in, a graph per (upload buffer, slot) pair, 4 for the full batches, was
    // captured.
    EXPECT_EQ(graphed.eval_counts.at("eval_step_graph_captures"), cards * (cards > 1 ? 3.0 : 2.0));
  }
  EXPECT_EQ(eager.eval_counts.at("eval_step_graph_captures"), 0.0);
  EXPECT_EQ(eager.counts.at("graph_launches_per_step"), 0.0);
  EXPECT_EQ(eager.eval_counts.at("eval_graph_launches_per_step"), 0.0);
  // The same work either way: the eager evaluation step launches, exchanges and copies what the
  // graph holds (its predictions' copy included; the batch's upload stays outside both).
  const Counts& ee = eager.eval_counts;
  const Counts& ge = graphed.eval_counts;
  EXPECT_NEAR(ee.at("eval_launches_per_step") + ee.at("eval_collectives_per_step") +
                  ee.at("eval_card_copies_per_step") + ee.at("eval_pinned_copies_per_step"),
              ge.at("eval_graph_nodes_per_step") + ge.at("eval_pinned_copies_per_step"), 1e-9);
  expect_same_metrics(graphed.metrics, eager.metrics, "pass");
  EXPECT_FALSE(graphed.host.empty());
  EXPECT_TRUE(same_rows(graphed.host, eager.host)) << "host rows after the write-back";
  ASSERT_EQ(graphed.dense.size(), static_cast<std::size_t>(cards));
  for (int c = 0; c < cards; ++c) {
    EXPECT_TRUE(same_bits(graphed.dense[c], eager.dense[c])) << "card " << c;
    EXPECT_TRUE(same_bits(graphed.dense[c], graphed.dense[0])) << "card " << c;
  }
  expect_same_metrics(graphed.eval_metrics, eager.eval_metrics, "evaluation");
  ASSERT_EQ(graphed.predictions.size(), lines);
  EXPECT_TRUE(same_bits(graphed.predictions, eager.predictions));
}

INSTANTIATE_TEST_SUITE_P(Cards, ComposedSteps,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Bool()),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "cards" +
                                  (std::get<1>(info.param) ? "Collective" : "Gpubox");
                         });

}  // namespace
}  // namespace gpubox::trainer
