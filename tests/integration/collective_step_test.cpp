// Collective mode's training step (runner.use_fleet without runner.sync_mode: every card holds the
// whole table) as step graphs (issue 31, item 3): its sparse half runs at the pass's fixed sizes
// like gpubox mode's (heterps/heter_comm/heter_comm_padded.cu, replicated placement: the keys and
// the summed push records all-gathered in fixed blocks, each led by its live count), so a steady
// step is 1 graph launch and nothing is launched or exchanged outside it; GPUBOX_STEP_GRAPHS=0
// runs the same padded work eagerly, GPUBOX_PADDED_STEPS=0 runs the plain replicated step (each
// step's own sizes) instead. On skewed data (`gpubox_data gen --zipf 2.0`: a few keys in most
// lines) with 0 to 3 keys in each slot of a line (every batch its own occurrence and distinct
// counts, a last round of one line: a short batch on one card, empty ones on the others), on 1, 2
// and 4 simulated cards, the three runs agree bit for bit: every pass's metrics, every card's dense
// parameters, the host tier's rows after each pass's write-back, every card's replica, and the
// trained model's predictions; and the padded runs send what only fixed blocks send (the same
// bytes every step, the short and empty last ones included), the unpadded one does not.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "dataset/generator.hpp"
#include "heterps/card_table/card_store.hpp"
#include "heterps/card_tier/card_tier.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/heter_comm/heter_comm.hpp"
#include "table/sparse_table.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/integration/scoped_env.hpp"
#include "tests/integration/step_waits.hpp"
#include "tests/integration/trainer_rows.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;

using testing::card_rows;
using testing::host_rows;
using testing::Rows;
using testing::same_rows;
using Counts = std::map<std::string, double>;

using gpubox::testing::ScopedEnv;  // tests/integration/scoped_env.hpp

// What a Collective run leaves: per pass its metrics, step counts and host rows; at the end every
// card's dense parameters and replica, and the predictions over the training data.
struct CollectiveRun {
  std::vector<MetricValues> metrics;
  std::vector<Counts> counts;
  std::vector<Rows> host_rows;
  std::vector<std::vector<float>> dense;
  std::vector<Rows> replicas;
  std::vector<float> predictions;
  // [pass][card]: the HeterComm's traffic over the pass's training steps, and its last step (the
  // pass's last push).
  std::vector<std::vector<heter_comm::HeterCommStats>> sparse;
  std::vector<std::vector<heter_comm::HeterCommStats>> last_push;
  int push_dim = 0;
};

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

class CollectiveStep : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("gpubox_collective_step_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    // 3201 lines, a last round of one: one card's batch of 1 (a composed graph of its own size),
    // the other cards' empty (a card with fewer batches than another still joins every step, as
    // the same composed graph over zero rows).
    testing::generate_lines((root_ / "skewed").string(), 3201, /*seed=*/9, /*vocab=*/4000, "0:3",
                            /*zipf=*/2.0);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // Two Collective passes over the skewed data (batch 100 a card, no shuffle), then the
  // predictions of the trained model over the same data.
  static CollectiveRun train(int cards) {
    const std::string data = (root_ / "skewed").string();
    auto parsed = parse_trainer_config(
        "runner: {}\n", ".",
        {"runner.train_data_dir=" + data, "runner.train_batch_size=100",
         "runner.infer_batch_size=100", "runner.shuffle=false",
         "runner.metrics_path=", "runner.print_interval=7", "runner.use_fleet=true"});
    throw_if_error(parsed.status());
    const TrainerEnv env = testing::cards_env(cards);
    Trainer trainer(std::move(parsed).value(), env);
    const auto files = data_files(data);
    CollectiveRun run;
    run.push_dim = trainer.card_tier().push_dim();
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<heter_comm::HeterCommStats> before;
      for (int c = 0; c < trainer.num_cards(); ++c) before.push_back(trainer.card_tier().stats(c));
      const PassReport report = trainer.train_pass(files);
      run.sparse.emplace_back();
      run.last_push.emplace_back();
      for (int c = 0; c < trainer.num_cards(); ++c) {
        const heter_comm::HeterCommStats& now = trainer.card_tier().stats(c);
        heter_comm::HeterCommStats pass_stats;
        pass_stats.pull_calls = now.pull_calls - before[c].pull_calls;
        pass_stats.push_calls = now.push_calls - before[c].push_calls;
        pass_stats.bytes_sent = now.bytes_sent - before[c].bytes_sent;
        run.sparse.back().push_back(pass_stats);
        run.last_push.back().push_back(trainer.card_tier().heter_comm(c).last_step());
      }
      run.metrics.push_back(report.metrics);
      run.counts.emplace_back(report.extra.begin(), report.extra.end());
      run.host_rows.push_back(host_rows(trainer));
    }
    for (int c = 0; c < trainer.num_cards(); ++c) {
      run.dense.push_back(trainer.dense_values(c));
      run.replicas.push_back(card_rows(trainer, c));
    }
    run.predictions = trainer.evaluate(files, /*keep_predictions=*/true).predictions;
    return run;
  }

  static fs::path root_;
};
fs::path CollectiveStep::root_;

// The padded step's own traffic (heter_comm_padded.cu): every training step of a pass, the short
// and the empty last ones included, all-gathers one block of block + 1 key words and one block of
// block * push_dim floats, so a card sends cards * (block + 1) * 8 + cards * block * push_dim * 4
// bytes each step, for the pass's one block. An unpadded step sends blocks of its own largest
// distinct count, which varies from step to step. Whether card `c`'s pass `p` of `run` did the
// former (the block read from the pass's last push).
::testing::AssertionResult sends_fixed_blocks(const CollectiveRun& run, std::size_t p, int c,
                                              int cards) {
  const heter_comm::HeterCommStats& pass = run.sparse[p][c];
  const uint64_t push_bytes = run.last_push[p][c].bytes_sent;
  const uint64_t per_key = static_cast<uint64_t>(cards) * run.push_dim * sizeof(float);
  if (pass.pull_calls == 0 || pass.push_calls != pass.pull_calls) {
    return ::testing::AssertionFailure()
           << pass.pull_calls << " pulls, " << pass.push_calls << " pushes";
  }
  if (push_bytes == 0 || push_bytes % per_key != 0) {
    return ::testing::AssertionFailure() << "the last push sent " << push_bytes << " bytes";
  }
  const uint64_t block = push_bytes / per_key;
  const uint64_t want = pass.pull_calls * static_cast<uint64_t>(cards) * (block + 1) * 8 +
                        pass.push_calls * push_bytes;
  if (pass.bytes_sent != want) {
    return ::testing::AssertionFailure()
           << pass.bytes_sent << " bytes sent over " << pass.pull_calls << " steps, not " << want
           << " (blocks of " << block << " keys every step)";
  }
  return ::testing::AssertionSuccess() << "blocks of " << block << " keys every step";
}

// Every result of two runs, bit for bit.
void expect_same_training(const CollectiveRun& a, const CollectiveRun& b, int cards) {
  ASSERT_EQ(a.metrics.size(), b.metrics.size());
  for (std::size_t p = 0; p < a.metrics.size(); ++p) {
    const MetricValues& g = a.metrics[p];
    const MetricValues& e = b.metrics[p];
    for (const auto& [name, x, y] :
         {std::tuple{"auc", g.auc, e.auc}, std::tuple{"logloss", g.logloss, e.logloss},
          std::tuple{"predicted_ctr", g.predicted_ctr, e.predicted_ctr},
          std::tuple{"rmse", g.rmse, e.rmse}, std::tuple{"examples", g.examples, e.examples}}) {
      EXPECT_TRUE(std::memcmp(&x, &y, sizeof(double)) == 0)
          << "pass " << p << " " << name << ": " << x << " and " << y;
    }
    EXPECT_FALSE(a.host_rows[p].empty());
    EXPECT_TRUE(same_rows(a.host_rows[p], b.host_rows[p])) << "pass " << p;
  }
  ASSERT_EQ(a.dense.size(), static_cast<std::size_t>(cards));
  for (int c = 0; c < cards; ++c) {
    EXPECT_TRUE(same_bits(a.dense[c], b.dense[c])) << "card " << c;
    EXPECT_TRUE(same_rows(a.replicas[c], b.replicas[c])) << "card " << c;
    EXPECT_TRUE(same_rows(a.replicas[c], a.replicas[0])) << "card " << c;
  }
  EXPECT_FALSE(a.predictions.empty());
  EXPECT_TRUE(same_bits(a.predictions, b.predictions));
}

TEST_P(CollectiveStep, PaddedAsStepGraphsEqualsEagerAndUnpaddedRunsBitForBitOnSkewedData) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  const CollectiveRun graphed = train(cards);
  CollectiveRun eager;
  {
    const ScopedEnv off("GPUBOX_STEP_GRAPHS", "0");
    eager = train(cards);
  }
  // The plain replicated step (blocks of each step's own largest distinct count, at each batch's
  // own sizes): the oracle the padded one must equal.
  CollectiveRun unpadded;
  {
    const ScopedEnv off("GPUBOX_PADDED_STEPS", "0");
    unpadded = train(cards);
  }
  {
    SCOPED_TRACE("padded, as step graphs and eagerly");
    expect_same_training(graphed, eager, cards);
  }
  {
    SCOPED_TRACE("padded and unpadded");
    expect_same_training(graphed, unpadded, cards);
  }
  for (std::size_t p = 0; p < graphed.metrics.size(); ++p) {
    // Steady steps: the whole step in 1 graph on every card (the short last batch's too, and a
    // card whose last batch is empty: the same composed graph over zero rows), nothing launched
    // or exchanged outside it; none without (the eager step's collectives: the keys' and the
    // push records' all-gathers and the dense all-reduce). Unpadded, the two all-gathers stay
    // outside the graphs.
    const Counts& gc = graphed.counts[p];
    const Counts& ec = eager.counts[p];
    const Counts& uc = unpadded.counts[p];
    EXPECT_EQ(gc.at("graph_launches_per_step"), 1.0) << "pass " << p;
    EXPECT_EQ(gc.at("launches_per_step"), 0.0) << "pass " << p;
    EXPECT_EQ(gc.at("collectives_per_step"), 0.0) << "pass " << p;
    step_test::expect_no_round_trip(gc, "", "graphed, pass " + std::to_string(p));
    EXPECT_EQ(ec.at("graph_launches_per_step"), 0.0) << "pass " << p;
    EXPECT_EQ(ec.at("collectives_per_step"), 3.0) << "pass " << p;
    EXPECT_GT(uc.at("collectives_per_step"), 1.5) << "pass " << p;
    step_test::expect_no_round_trip(uc, "", "unpadded, pass " + std::to_string(p));
    for (int c = 0; c < cards; ++c) {
      EXPECT_TRUE(sends_fixed_blocks(graphed, p, c, cards)) << "pass " << p << " card " << c;
      EXPECT_TRUE(sends_fixed_blocks(eager, p, c, cards)) << "pass " << p << " card " << c;
      EXPECT_FALSE(sends_fixed_blocks(unpadded, p, c, cards)) << "pass " << p << " card " << c;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cards, CollectiveStep, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "cards"; });

}  // namespace
}  // namespace gpubox::trainer
