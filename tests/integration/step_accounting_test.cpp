// What a training step asks of each card, pinned on the cpu backend (the device layer counts in
// its portable wrappers, so a GPU run counts the same): in steady state a step of the default
// model never waits for the card (issue 31, item 2: the key counts come from the pass's step
// plan, the owner merge's count stays on the card, and the step's checks, loss, finite verdict
// and progress AUC are read a few steps late from a ring of pinned slots), allocates nothing,
// copies nothing from or to pageable memory, and runs exactly 4 collectives (pull: keys, records
// back; the dense all-reduce; push_pulled: records to the owners), all inside ONE step graph
// (issue 31, item 3, heterps/device/composed_step.hpp): the sparse pull, the dense step (forward,
// backward, metrics, the dense all-reduce, the finite check), the status copy into the step's ring
// slot (chosen on the card), the sparse push and the dense optimizer are 1 graph launch, and
// nothing else is launched (it was 4 graph launches and 2 pinned copies before the halves were
// composed). 1, 2, 4 and 8 simulated cards. Collective mode (issue 16: the table on every card)
// the same, with 3 collectives: its pull reads the card's replica, so no records come back
// (heter_comm.hpp); its sparse half at the pass's fixed sizes too (all-gathered blocks), so its
// step is 1 graph launch as well, one node fewer (collective_step_test.cpp: bit for bit against
// the eager run on skewed data).
//
// Steady state: the second pass over the same (unshuffled) batches, past its warm-up steps. Since
// the step sizes are planned per pass (PassStepSizes), no step of any pass allocates at all, its
// first ones included (PassSizing below, on data whose keys per line vary).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "dataset/generator.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/integration/scoped_env.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/step_times.hpp"
#include "trainer/engine/trainer.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;

using gpubox::testing::ScopedEnv;  // tests/integration/scoped_env.hpp

class StepAccounting : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("gpubox_step_accounting_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    dataset::GeneratorOptions gen;  // the default model's shape: 26 slots, 13 dense
    gen.out_dir = (root_ / "train").string();
    gen.lines = 4000;
    gen.files = 1;
    gen.seed = 3;
    gen.vocab = 5000;
    dataset::OracleSummary oracle;
    throw_if_error(dataset::generate(gen, &oracle));
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // Data whose per-card unique key count grows after the warm-up steps, by less than the
  // exchange buffers' 1.5x headroom: a first batch per card at zipf 1.2, a second one with fewer
  // unique keys (zipf 1.4), then batches with more (zipf 1.1). Without headroom a buffer sized
  // to the first batch grows at the first steady step that has more keys. Made once per run.
  static std::string growing_keys_dir(int cards) {
    const fs::path dir = root_ / ("growing_" + std::to_string(cards));
    if (fs::exists(dir)) return dir.string();
    const struct {
      uint64_t lines;
      double zipf;
    } parts[] = {{100u * cards, 1.2}, {100u * cards, 1.4}, {2000u * cards, 1.1}};
    int index = 0;
    for (const auto& part : parts) {
      dataset::GeneratorOptions gen;
      gen.out_dir = (root_ / "part").string();
      gen.lines = part.lines;
      gen.files = 1;
      gen.seed = 5;
      gen.vocab = 5000;
      gen.zipf = part.zipf;
      dataset::OracleSummary oracle;
      throw_if_error(dataset::generate(gen, &oracle));
      fs::create_directories(dir);
      fs::rename(root_ / "part" / "part-00000", dir / ("part-0000" + std::to_string(index++)));
      fs::remove_all(root_ / "part");
    }
    return dir.string();
  }

  // Slot-format data whose keys per line VARY (Criteo's and PaddleRec's slot data do): each of
  // the 26 slots holds 0 to 3 keys (zipf-like ranks), so every batch has its own occurrence,
  // distinct-key and per-owner counts. The generator's default data has 26 keys a line: only the
  // distinct counts vary there. Made once per run.
  static std::string varying_keys_dir() {
    const fs::path dir = root_ / "varying";
    if (fs::exists(dir)) return dir.string();
    fs::create_directories(dir);
    std::ofstream out(dir / "part-00000");
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    const int keys_per_slot[] = {0, 1, 1, 1, 2, 3};
    for (int line = 0; line < 4037; ++line) {  // a short last round: smaller batches
      out << "click:" << (unit(rng) < 0.25 ? 1 : 0);
      for (int d = 0; d < 13; ++d) out << " dense_feature:" << unit(rng);
      for (int slot = 1; slot <= 26; ++slot) {
        for (int k = keys_per_slot[rng() % 6]; k > 0; --k) {
          const auto rank = static_cast<uint64_t>(std::pow(unit(rng) + 1e-9, -1.0) * 3) % 3000;
          out << ' ' << slot << ':' << (static_cast<uint64_t>(slot) * 100000 + rank + 1);
        }
      }
      out << '\n';
    }
    return dir.string();
  }

  // The default model (configs/config_gpubox.yaml's: fc 512-256-128-32, 26 slots x 9) at a
  // small batch, so a pass has many steps.
  using Counts = std::map<std::string, double>;
  static Counts second_pass(int cards, bool collective = false) {
    return both_passes(cards, {std::string("runner.use_fleet=") + (collective ? "true" : "false")})
        .second;
  }
  // The counts of the first and the second pass.
  // `eval` (optional): the counts of an evaluation over the same data after the two passes.
  static std::pair<Counts, Counts> both_passes(int cards, const std::vector<std::string>& extra,
                                               const std::string& data_dir = "",
                                               Counts* eval = nullptr) {
    // The default config (every key at its table default) with a small batch, so a pass has
    // many steps; print_interval 7 puts progress readbacks inside the counted steps too.
    std::vector<std::string> overrides = {
        "runner.train_data_dir=" + (data_dir.empty() ? (root_ / "train").string() : data_dir),
        "runner.train_batch_size=100", "runner.shuffle=false",
        "runner.metrics_path=", "runner.print_interval=7"};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    auto parsed = parse_trainer_config("runner: {}\n", ".", overrides);
    throw_if_error(parsed.status());
    TrainerConfig config = std::move(parsed).value();
    TrainerEnv env;
    for (int c = 0; c < cards; ++c) env.selected_cards += (c ? "," : "") + std::to_string(c);
    env.threads_per_card = 1;
    Trainer trainer(config, env);
    const auto files = data_files(config.runner.train_data_dir);
    const PassReport first = trainer.train_pass(files);
    const PassReport second = trainer.train_pass(files);
    if (eval != nullptr) {
      const EvalResult result = trainer.evaluate(files, /*keep_predictions=*/false);
      *eval = Counts(result.extra.begin(), result.extra.end());
    }
    return {Counts(first.extra.begin(), first.extra.end()),
            Counts(second.extra.begin(), second.extra.end())};
  }

  static fs::path root_;
};
fs::path StepAccounting::root_;

TEST_P(StepAccounting, SteadyStepNeverWaitsAllocatesNothingAndRunsFourCollectives) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  const auto extra = second_pass(cards);
  ASSERT_TRUE(extra.count("steady_steps")) << "the pass report has no step counts";
  // 4000 lines / (100 per card x cards) steps, minus the 2 warm-up steps.
  EXPECT_EQ(extra.at("steady_steps"), 4000 / (100 * cards) - 2);
  EXPECT_EQ(extra.at("host_syncs_per_step"), 0.0) << "a wait came back into the steady step";
  EXPECT_EQ(extra.at("allocations_per_step"), 0.0);
  EXPECT_EQ(extra.at("pageable_copies_per_step"), 0.0);
  // Every collective is inside a step graph: the sparse pull's 2 (keys, records back), the dense
  // all-reduce, the sparse push's 1.
  EXPECT_EQ(extra.at("collectives_per_step"), 0.0);
  // The batch upload only: the sparse check (misses, merge count, the card's count row), the step
  // status and the progress AUC are written into their ring slots by kernels inside the graph.
  EXPECT_EQ(extra.at("pinned_copies_per_step"), 1.0);
  // The batch upload overlaps the step before it (issue 31, item 4): its one copy runs on the
  // card's copy stream into one of two card buffers, ordered by 2 stream waits (the copy stream
  // for the compute stream's event after the last step that read that buffer, the compute stream
  // for the copy's event), neither a host wait.
  EXPECT_EQ(extra.at("copy_stream_copies_per_step"), 1.0);
  EXPECT_EQ(extra.at("stream_waits_per_step"), 2.0);
  // Every steady step is 1 graph launch, "train step" (issue 31, item 3). The dense half: 28
  // nodes (5 layers' 3 GEMMs, the pool, the loss and its reduction (which stores the loss into
  // the step's slots: no tail kernel), the metrics (whose fold adds its sums in: no tail kernel),
  // the all-reduce, the finite check, the bad value's copy, the stop votes, adam's step count and
  // step) and the status into its ring slot (1; with the progress AUC's reduction, 3 more, on
  // card 0 every 7 steps). The sparse half at the pass's fixed sizes (heter_comm_padded.cu): the
  // pull's local dedup and owner plan (4: prepare, sort, scan, record), the keys into their
  // blocks, the keys' all-to-all, the miss counter's reset, the lookups, the owner merge plan (4;
  // on 1 card a copy, the identity segments and the live count: 3), the check and its copy into
  // its ring slot, the records' fill, their all-to-all and scatter; the push's local and owner
  // reduces (4 each: a reset, the chunk map, the chunks, the segments), the records' all-to-all,
  // the rows' gather and the update. 28 nodes (27 on 1 card).
  EXPECT_EQ(extra.at("graph_launches_per_step"), 1.0);
  const double nodes = cards == 1 ? 56.0 : 57.0;
  EXPECT_GE(extra.at("graph_nodes_per_step"), nodes);
  EXPECT_LT(extra.at("graph_nodes_per_step"), nodes + 3.0 / 7.0 / cards + 1e-9);
  EXPECT_EQ(extra.at("launches_outside_graph_per_step"), 0.0);
  EXPECT_EQ(extra.at("card_copies_per_step"), 0.0);
  // Outside the graph: nothing (the progress AUC's reduction and copy, card 0's every 7 steps,
  // and the 2 ring copies were outside before the halves were composed).
  EXPECT_EQ(extra.at("launches_per_step"), 0.0);
}

// GPUBOX_STEP_GRAPHS=0 runs both halves eagerly: the same work, as launches, card copies and
// collectives outside any graph.
TEST_P(StepAccounting, WithoutStepGraphsTheSameWorkRunsAsLaunches) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  const auto graphed = second_pass(cards);
  ScopedEnv off("GPUBOX_STEP_GRAPHS", "0");
  const auto eager = second_pass(cards);
  EXPECT_EQ(eager.at("graph_launches_per_step"), 0.0);
  EXPECT_EQ(eager.at("graph_nodes_per_step"), 0.0);
  EXPECT_EQ(eager.at("collectives_per_step"), 4.0);
  EXPECT_EQ(eager.at("launches_per_step") + eager.at("collectives_per_step") +
                eager.at("card_copies_per_step"),
            graphed.at("launches_per_step") + graphed.at("collectives_per_step") +
                graphed.at("card_copies_per_step") + graphed.at("graph_nodes_per_step"));
  EXPECT_EQ(eager.at("host_syncs_per_step"), graphed.at("host_syncs_per_step"));
  EXPECT_EQ(eager.at("pinned_copies_per_step"), graphed.at("pinned_copies_per_step"));
}

TEST_P(StepAccounting, CollectiveSteadyStepRunsOneCollectiveFewerAllInStepGraphs) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  const auto gpubox = second_pass(cards);
  const auto collective = second_pass(cards, /*collective=*/true);
  ASSERT_TRUE(collective.count("steady_steps")) << "the pass report has no step counts";
  EXPECT_EQ(collective.at("steady_steps"), gpubox.at("steady_steps"));
  EXPECT_EQ(collective.at("host_syncs_per_step"), 0.0);
  EXPECT_EQ(gpubox.at("host_syncs_per_step"), 0.0);
  EXPECT_EQ(collective.at("allocations_per_step"), 0.0);
  EXPECT_EQ(collective.at("pageable_copies_per_step"), 0.0);
  // Both modes' collectives all run inside the step graphs: Collective mode's sparse half (its
  // all-gathers of keys and push records: the "sparse pull" and "sparse push" graphs) as gpubox
  // mode's; the dense all-reduce in "dense step".
  EXPECT_EQ(collective.at("collectives_per_step"), 0.0);
  EXPECT_EQ(gpubox.at("collectives_per_step"), 0.0);
  EXPECT_EQ(collective.at("graph_launches_per_step"), 1.0);
  EXPECT_EQ(collective.at("card_copies_per_step"), 0.0);
  // The sparse pull has one node fewer (no records travel back).
  EXPECT_EQ(collective.at("graph_nodes_per_step"), gpubox.at("graph_nodes_per_step") - 1);
  EXPECT_EQ(collective.at("launches_per_step"), 0.0);
  // Eagerly (GPUBOX_STEP_GRAPHS=0): the same work outside graphs, 3 collectives (was 2 + the
  // dense all-reduce's 1 in a graph before the sparse half was captured).
  ScopedEnv off("GPUBOX_STEP_GRAPHS", "0");
  const auto eager = second_pass(cards, /*collective=*/true);
  EXPECT_EQ(eager.at("graph_launches_per_step"), 0.0);
  EXPECT_EQ(eager.at("collectives_per_step"), 3.0);
  EXPECT_EQ(eager.at("host_syncs_per_step"), 0.0);
  EXPECT_EQ(eager.at("launches_per_step") + eager.at("collectives_per_step") +
                eager.at("card_copies_per_step"),
            collective.at("launches_per_step") + collective.at("graph_nodes_per_step"));
}

// Under a card budget (runner.card_memory_mb) too, and from the first pass's steady steps on: on
// 2 cards the first pass used to allocate 0.3 a steady step (HeterComm's exchange buffers, sized
// to the first steps' received keys exactly, all grew at a later step that received more).
TEST_P(StepAccounting, UnderACardBudgetNoSteadyStepOfAnyPassAllocates) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  const auto [first, second] = both_passes(cards, {"runner.card_memory_mb=40"});
  ASSERT_TRUE(first.count("steady_steps")) << "the pass report has no step counts";
  EXPECT_EQ(first.at("steady_steps"), 4000 / (100 * cards) - 2);
  EXPECT_EQ(first.at("allocations_per_step"), 0.0);
  EXPECT_EQ(second.at("allocations_per_step"), 0.0);
  EXPECT_EQ(first.at("host_syncs_per_step"), 0.0);
  EXPECT_EQ(second.at("host_syncs_per_step"), 0.0);
  EXPECT_EQ(second.at("pageable_copies_per_step"), 0.0);
}

// Collective mode (the table on every card) from the first pass on: its all-gathered blocks are
// padded to the step's largest unique count, which grows during the first pass as the exchange
// buffers' counts do. On data whose unique count grows after the warm-up (growing_keys_dir):
// with the blocks sized to the step's count exactly, the first pass allocated in a steady step.
TEST_P(StepAccounting, CollectiveNoSteadyStepOfAnyPassAllocates) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  const auto [first, second] = both_passes(
      cards, {"runner.use_fleet=true", "runner.card_memory_mb=40"}, growing_keys_dir(cards));
  ASSERT_TRUE(first.count("steady_steps")) << "the pass report has no step counts";
  EXPECT_EQ(first.at("allocations_per_step"), 0.0);
  EXPECT_EQ(second.at("allocations_per_step"), 0.0);
}

// The pass report's step times (p50 <= p99 <= max, over the steady steps) and the cards' memory
// high-water mark: what scripts/gpu_check.sh reports per card count.
TEST_P(StepAccounting, PassReportsStepTimesAndTheCardMemoryHighWaterMark) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  const auto [first, second] = both_passes(cards, {});
  for (const Counts* pass : {&first, &second}) {
    for (const char* key : {"step_ms_p50", "step_ms_p99", "step_ms_max", "card_memory_peak_mb"}) {
      ASSERT_TRUE(pass->count(key)) << "the pass report has no " << key;
      EXPECT_GT(pass->at(key), 0.0) << key;
    }
    EXPECT_LE(pass->at("step_ms_p50"), pass->at("step_ms_p99"));
    EXPECT_LE(pass->at("step_ms_p99"), pass->at("step_ms_max"));
    // The default model's dense net and the pass's rows: megabytes, not bytes, not gigabytes.
    EXPECT_GT(pass->at("card_memory_peak_mb"), 1.0);
    EXPECT_LT(pass->at("card_memory_peak_mb"), 4096.0);
  }
  // A high-water mark since the run began: the second pass's is never below the first's.
  EXPECT_GE(second.at("card_memory_peak_mb"), first.at("card_memory_peak_mb"));
}

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
  TrainerEnv env;
  for (int c = 0; c < cards; ++c) env.selected_cards += (c ? "," : "") + std::to_string(c);
  env.threads_per_card = 1;
  Trainer trainer(std::move(parsed).value(), env);
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

TEST(StepTimes, NearestRankQuantileAgainstHandComputedRanks) {
  std::vector<double> none;
  EXPECT_EQ(nearest_rank_quantile(&none, 0.5), 0.0);
  std::vector<double> one = {7.0};
  EXPECT_EQ(nearest_rank_quantile(&one, 0.5), 7.0);
  EXPECT_EQ(nearest_rank_quantile(&one, 0.99), 7.0);
  // 1..100 shuffled: the p-quantile by the nearest rank is ceil(100 p).
  std::vector<double> hundred;
  for (int i = 1; i <= 100; ++i) hundred.push_back(i);
  std::shuffle(hundred.begin(), hundred.end(), std::mt19937_64(3));
  EXPECT_EQ(nearest_rank_quantile(&hundred, 0.50), 50.0);
  EXPECT_EQ(nearest_rank_quantile(&hundred, 0.99), 99.0);
  EXPECT_EQ(nearest_rank_quantile(&hundred, 1.0), 100.0);
  std::vector<double> ten = {9, 1, 8, 2, 7, 3, 6, 4, 5, 10};
  EXPECT_EQ(nearest_rank_quantile(&ten, 0.5), 5.0);
  EXPECT_EQ(nearest_rank_quantile(&ten, 0.99), 10.0);  // ceil(9.9) = 10th
  EXPECT_EQ(nearest_rank_quantile(&ten, 0.95), 10.0);
  EXPECT_EQ(nearest_rank_quantile(&ten, 0.9), 9.0);
  // Over the cards together; nothing without a step.
  PassReport report;
  append_step_times({{0.004, 0.001}, {0.002, 0.003}}, &report);
  const std::map<std::string, double> extra(report.extra.begin(), report.extra.end());
  EXPECT_DOUBLE_EQ(extra.at("step_ms_p50"), 2.0);
  EXPECT_DOUBLE_EQ(extra.at("step_ms_p99"), 4.0);
  EXPECT_DOUBLE_EQ(extra.at("step_ms_max"), 4.0);
  PassReport empty;
  append_step_times({{}, {}}, &empty);
  EXPECT_TRUE(empty.extra.empty());
}

// The pass report's per-step figures (append_step_counts, append_eval_step_counts): every
// counter per card per steady step, graph_captures among them (captures, not replays: 0 once a
// step's shape and buffers stay).
TEST(StepCounts, PerCardPerStepGraphCapturesIncluded) {
  std::vector<device::DeviceCounts> cards(2);
  cards[0].graph_captures = 3;
  cards[1].graph_captures = 1;
  cards[0].graph_launches = cards[1].graph_launches = 8;
  PassReport report;
  append_step_counts(cards, 2, &report);
  const std::map<std::string, double> extra(report.extra.begin(), report.extra.end());
  EXPECT_DOUBLE_EQ(extra.at("graph_captures_per_step"), 1.0);  // 4 over 2 cards x 2 steps
  EXPECT_DOUBLE_EQ(extra.at("graph_launches_per_step"), 4.0);
  EXPECT_DOUBLE_EQ(extra.at("steady_steps"), 2.0);
  std::vector<std::pair<std::string, double>> eval;
  append_eval_step_counts(cards, 2, &eval);
  ASSERT_EQ(eval.size(), report.extra.size());
  for (std::size_t i = 0; i < eval.size(); ++i) {
    EXPECT_EQ(eval[i].first, "eval_" + report.extra[i].first);
    EXPECT_EQ(eval[i].second, report.extra[i].second);
  }
  append_eval_step_counts(cards, 0, &eval);  // no steady step: nothing
  EXPECT_EQ(eval.size(), report.extra.size());
}

// An evaluation step (CardWorker::eval_step) pulls and predicts only: a "sparse lookup" graph (no
// owner merge plan, which only a push uses; in Collective mode no collective at all: every card
// reads its own keys from its own replica) and a "dense predict" graph (the forward, the
// predictions, the metrics), 2 graph launches and 2 kernels outside them (the lookup's check and
// the step's status, each into the pinned ring slot the card's counter picks: inside a training
// step's composed graph they are nodes of it), no wait, no allocation,
// nothing captured again in its steady steps; it used to be the training step's padded pull
// graph plus the forward launched eagerly. Less work than a training step in either mode; eagerly
// (GPUBOX_STEP_GRAPHS=0) the same work as launches, with no collective in Collective mode and the
// keys' and records' all-to-alls in gpubox mode. The training passes before it report their
// captures: in the second pass's steady steps, only the "train step" graph's variants (steady
// flag, progress flag, upload buffer: at most 8 a card; the pass boundary moved the card's
// memory since the first pass; card_worker_graphs_test pins each trigger).
class EvalSteps : public StepAccounting {};

// Nodes of an evaluation step, [Collective mode][more than 1 card]: "sparse lookup" (the local
// dedup and owner plan: 4; the keys into their blocks, the miss counter's reset, the lookups, the
// check, the records' fill and scatter: 10; gpubox mode: the keys' and the records' all-to-alls
// besides: 12) and "dense predict" (the forward, the sigmoid, the metrics: the 9 launches the
// evaluation step ran outside graphs before; 10 at gpubox_bench's batch 512, where the training
// step's dense half has 2 more too). Before, the step was the training step's "sparse pull" graph
// (14 nodes on 1 card, 15 on more in Collective mode, with its all-gather; 15 and 16 in gpubox
// mode) and those launches.
constexpr double kEvalNodes[2][2] = {{21, 21}, {19, 19}};

TEST_P(EvalSteps, AnEvaluationStepIsALookupAndAPredictionInTwoGraphs) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  for (const bool collective : {false, true}) {
    SCOPED_TRACE(collective ? "Collective mode" : "gpubox mode");
    const std::vector<std::string> extra = {
        std::string("runner.use_fleet=") + (collective ? "true" : "false"),
        "runner.infer_batch_size=100"};
    Counts eval;
    const Counts train = both_passes(cards, extra, "", &eval).second;
    ASSERT_TRUE(eval.count("eval_steady_steps")) << "the evaluation has no step counts";
    EXPECT_EQ(eval.at("eval_steady_steps"), train.at("steady_steps"));
    for (const char* key : {"eval_host_syncs_per_step", "eval_allocations_per_step",
                            "eval_pageable_copies_per_step", "eval_collectives_per_step",
                            "eval_card_copies_per_step", "eval_graph_captures_per_step"}) {
      EXPECT_EQ(eval.at(key), 0.0) << key;
    }
    EXPECT_EQ(eval.at("eval_launches_per_step"), 2.0);
    EXPECT_EQ(eval.at("eval_graph_launches_per_step"), 2.0);
    EXPECT_EQ(eval.at("eval_graph_nodes_per_step"), kEvalNodes[collective][cards > 1]);
    EXPECT_LT(eval.at("eval_graph_nodes_per_step"), train.at("graph_nodes_per_step") / 2);
    const double captures = train.at("graph_captures_per_step") * train.at("steady_steps");
    EXPECT_GT(captures, 0.5);  // the pass boundary moved the card's memory
    EXPECT_LE(captures, 8.0 + 1e-9);
    Counts eager_eval;
    Counts eager;
    {
      ScopedEnv off("GPUBOX_STEP_GRAPHS", "0");
      eager = both_passes(cards, extra, "", &eager_eval).second;
    }
    EXPECT_EQ(eager.at("graph_captures_per_step"), 0.0);
    EXPECT_EQ(eager_eval.at("eval_graph_launches_per_step"), 0.0);
    EXPECT_EQ(eager_eval.at("eval_graph_captures_per_step"), 0.0);
    EXPECT_EQ(eager_eval.at("eval_host_syncs_per_step"), 0.0);
    EXPECT_EQ(eager_eval.at("eval_collectives_per_step"), collective ? 0.0 : 2.0);
    EXPECT_EQ(eager_eval.at("eval_launches_per_step") + eager_eval.at("eval_collectives_per_step") +
                  eager_eval.at("eval_card_copies_per_step"),
              eval.at("eval_graph_nodes_per_step") + eval.at("eval_launches_per_step"));
  }
}

INSTANTIATE_TEST_SUITE_P(Cards, EvalSteps, ::testing::Values(1, 2, 4),
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
  // their checks read late, drained at the evaluation's end.
  for (const char* key : {"eval_step_allocations", "eval_step_frees",
                          "eval_step_pinned_allocations", "eval_step_host_syncs"}) {
    ASSERT_TRUE(eval.count(key)) << "the evaluation has no " << key;
    EXPECT_EQ(eval.at(key), 0.0) << "evaluation: " << key;
  }
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
  TrainerEnv env;
  for (int c = 0; c < cards; ++c) env.selected_cards += (c ? "," : "") + std::to_string(c);
  env.threads_per_card = 1;
  Trainer trainer(std::move(parsed).value(), env);
  const auto files = data_files(varying_keys_dir());
  trainer.train_pass(files);
  const EvalResult result = trainer.evaluate(files, /*keep_predictions=*/true);
  const Counts extra(result.extra.begin(), result.extra.end());
  EXPECT_EQ(extra.at("eval_step_host_syncs"), 0.0);
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
  EXPECT_EQ(second.at("host_syncs_per_step"), 0.0);
  const auto [first_collective, second_collective] = both_passes(
      cards, {"runner.reader_type=QueueDataset", "runner.use_fleet=true"}, varying_keys_dir());
  expect_no_step_allocates(first_collective, "QueueDataset, Collective mode, first pass");
  expect_no_step_allocates(second_collective, "QueueDataset, Collective mode, second pass");
}

INSTANTIATE_TEST_SUITE_P(Cards, PassSizing, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "cards"; });

INSTANTIATE_TEST_SUITE_P(Cards, StepAccounting, ::testing::Values(1, 2, 4, 8),
                         [](const auto& info) { return std::to_string(info.param) + "cards"; });

}  // namespace
}  // namespace gpubox::trainer
