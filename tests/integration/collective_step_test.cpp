// Collective mode's training step (runner.use_fleet without runner.sync_mode: every card holds the
// whole table) as step graphs (issue 31, item 3): its sparse half runs at the pass's fixed sizes
// like gpubox mode's (heterps/heter_comm/heter_comm_padded.cu, replicated placement: the keys and
// the summed push records all-gathered in fixed blocks, each led by its live count), so a steady
// step is 4 graph launches and nothing is launched or exchanged outside them; GPUBOX_STEP_GRAPHS=0
// runs the same work eagerly. On skewed data (`gpubox_data gen --zipf 2.0`: a few keys in most
// lines) with 0 to 3 keys in each slot of a line (every batch its own occurrence and distinct
// counts, and a short last batch), on 1, 2 and 4 simulated cards, the graphed run equals the eager
// run bit for bit: every pass's metrics, every card's dense parameters, the host tier's rows
// after each pass's write-back, every card's replica, and the trained model's predictions.
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
#include "table/sparse_table.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;

using Rows = std::map<uint64_t, std::vector<float>>;
using Counts = std::map<std::string, double>;

// GPUBOX_STEP_GRAPHS=0 for a scope (read when a trainer's card workers and HeterComms are made).
class EagerSteps {
 public:
  EagerSteps() {
    if (const char* old = std::getenv(kName)) old_ = old;
    ::setenv(kName, "0", 1);
  }
  ~EagerSteps() {
    if (old_.empty()) {
      ::unsetenv(kName);
    } else {
      ::setenv(kName, old_.c_str(), 1);
    }
  }
  EagerSteps(const EagerSteps&) = delete;
  EagerSteps& operator=(const EagerSteps&) = delete;

 private:
  static constexpr const char* kName = "GPUBOX_STEP_GRAPHS";
  std::string old_;
};

// What a Collective run leaves: per pass its metrics, step counts and host rows; at the end every
// card's dense parameters and replica, and the predictions over the training data.
struct CollectiveRun {
  std::vector<MetricValues> metrics;
  std::vector<Counts> counts;
  std::vector<Rows> host_rows;
  std::vector<std::vector<float>> dense;
  std::vector<Rows> replicas;
  std::vector<float> predictions;
};

Rows host_rows(Trainer& trainer) {
  auto* table = dynamic_cast<table::SparseTable*>(&trainer.host_tier());
  EXPECT_NE(table, nullptr);
  Rows out;
  if (table == nullptr) return out;
  const int stride = trainer.host_tier().layout().stride();
  throw_if_error(table->for_each_row(
      [&](uint64_t key, const float* row) { out[key] = std::vector<float>(row, row + stride); }));
  return out;
}

Rows replica_rows(Trainer& trainer, int c) {
  card_table::CardSparseStore& store = trainer.card_tier().store(c);
  device::Card& card = store.card();
  card.activate();
  device::device_buffer<uint64_t> keys(0, card.memory(), card.stream());
  device::device_buffer<float> rows(0, card.memory(), card.stream());
  const std::size_t n = store.collect_all(keys, rows, card.stream());
  const auto host_keys = device::to_host(keys);
  const auto host_values = device::to_host(rows);
  const std::size_t stride = static_cast<std::size_t>(store.layout().stride());
  Rows out;
  for (std::size_t i = 0; i < n; ++i) {
    out[host_keys[i]] = std::vector<float>(host_values.begin() + i * stride,
                                           host_values.begin() + (i + 1) * stride);
  }
  return out;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

bool same_rows(const Rows& a, const Rows& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [key, row] : a) {
    const auto it = b.find(key);
    if (it == b.end() || !same_bits(row, it->second)) return false;
  }
  return true;
}

class CollectiveStep : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("gpubox_collective_step_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    dataset::GeneratorOptions gen;  // the default model's shape: 26 slots, 13 dense
    gen.out_dir = (root_ / "skewed").string();
    gen.lines = 3037;  // a short last round: smaller last batches, run eagerly between replays
    gen.files = 1;
    gen.seed = 9;
    gen.vocab = 4000;
    gen.zipf = 2.0;
    throw_if_error(dataset::parse_keys_per_slot("0:3", &gen));
    dataset::OracleSummary oracle;
    throw_if_error(dataset::generate(gen, &oracle));
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
    TrainerEnv env;
    for (int c = 0; c < cards; ++c) env.selected_cards += (c ? "," : "") + std::to_string(c);
    env.threads_per_card = 1;
    Trainer trainer(std::move(parsed).value(), env);
    const auto files = data_files(data);
    CollectiveRun run;
    for (int pass = 0; pass < 2; ++pass) {
      const PassReport report = trainer.train_pass(files);
      run.metrics.push_back(report.metrics);
      run.counts.emplace_back(report.extra.begin(), report.extra.end());
      run.host_rows.push_back(host_rows(trainer));
    }
    for (int c = 0; c < trainer.num_cards(); ++c) {
      run.dense.push_back(trainer.dense_values(c));
      run.replicas.push_back(replica_rows(trainer, c));
    }
    run.predictions = trainer.evaluate(files, /*keep_predictions=*/true).predictions;
    return run;
  }

  static fs::path root_;
};
fs::path CollectiveStep::root_;

TEST_P(CollectiveStep, AsStepGraphsEqualsTheEagerRunBitForBitOnSkewedData) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  const CollectiveRun graphed = train(cards);
  CollectiveRun eager;
  {
    const EagerSteps off;
    eager = train(cards);
  }
  ASSERT_EQ(graphed.metrics.size(), eager.metrics.size());
  for (std::size_t p = 0; p < graphed.metrics.size(); ++p) {
    const MetricValues& g = graphed.metrics[p];
    const MetricValues& e = eager.metrics[p];
    for (const auto& [name, a, b] :
         {std::tuple{"auc", g.auc, e.auc}, std::tuple{"logloss", g.logloss, e.logloss},
          std::tuple{"predicted_ctr", g.predicted_ctr, e.predicted_ctr},
          std::tuple{"rmse", g.rmse, e.rmse}, std::tuple{"examples", g.examples, e.examples}}) {
      EXPECT_TRUE(std::memcmp(&a, &b, sizeof(double)) == 0)
          << "pass " << p << " " << name << ": " << a << " with graphs, " << b << " without";
    }
    EXPECT_FALSE(graphed.host_rows[p].empty());
    EXPECT_TRUE(same_rows(graphed.host_rows[p], eager.host_rows[p])) << "pass " << p;
    // Steady steps: the whole step in 4 graphs (the short last batch's dense half runs eagerly:
    // 2 graphs and the dense all-reduce outside them), none without (the eager step's
    // collectives: the keys' and the push records' all-gathers and the dense all-reduce).
    const Counts& gc = graphed.counts[p];
    const Counts& ec = eager.counts[p];
    EXPECT_GT(gc.at("graph_launches_per_step"), 3.5) << "pass " << p;
    EXPECT_LT(gc.at("collectives_per_step"), 0.5) << "pass " << p;
    EXPECT_EQ(gc.at("host_syncs_per_step"), 0.0) << "pass " << p;
    EXPECT_EQ(ec.at("graph_launches_per_step"), 0.0) << "pass " << p;
    EXPECT_EQ(ec.at("collectives_per_step"), 3.0) << "pass " << p;
  }
  ASSERT_EQ(graphed.dense.size(), static_cast<std::size_t>(cards));
  for (int c = 0; c < cards; ++c) {
    EXPECT_TRUE(same_bits(graphed.dense[c], eager.dense[c])) << "card " << c;
    EXPECT_TRUE(same_rows(graphed.replicas[c], eager.replicas[c])) << "card " << c;
    EXPECT_TRUE(same_rows(graphed.replicas[c], graphed.replicas[0])) << "card " << c;
  }
  EXPECT_FALSE(graphed.predictions.empty());
  EXPECT_TRUE(same_bits(graphed.predictions, eager.predictions));
}

INSTANTIATE_TEST_SUITE_P(Cards, CollectiveStep, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "cards"; });

}  // namespace
}  // namespace gpubox::trainer
