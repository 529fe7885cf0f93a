// The whole engine under deferred execution (heterps/device/deferred.hpp): work on a stream runs
// only when a host wait, a peer stream's event wait or a collective demands it, so a missing
// stream or event wait anywhere in a pass (the upload on the copy stream, the pull, the step
// graphs, the late readbacks, begin and end of a pass, an evaluation) reads stale data. Training
// two passes and evaluating, in gpubox and Collective mode, on 1 and 2 cards, as step graphs and
// eagerly, must then equal the run whose work runs when enqueued, bit for bit: every pass's
// metrics, the host tier's rows, every card's dense parameters, the predictions. Lazily (work runs
// as late as it can) and with seeded orders (each enqueue may run its stream's queue at once).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/deferred.hpp"
#include "tests/common/scratch_root.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/integration/trainer_rows.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;

struct OrderRun {
  std::vector<MetricValues> passes;
  std::vector<testing::Rows> host_rows;
  std::vector<std::vector<float>> dense;  // per card
  std::vector<float> predictions;
};

// Slot lines whose keys per slot vary (0 to 3) and whose last round is short.
std::string order_data_dir() {
  static const fs::path dir = gpubox::testing::scratch_root("gpubox_stream_order");
  static const gpubox::testing::RemovedAtExit removed{dir};
  if (fs::exists(dir)) return dir.string();
  fs::create_directories(dir);
  std::ofstream out(dir / "part-00000");
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int line = 0; line < 1437; ++line) {
    out << "click:" << (unit(rng) < 0.25 ? 1 : 0);
    for (int d = 0; d < 13; ++d) out << " dense_feature:" << unit(rng);
    for (int slot = 1; slot <= 26; ++slot) {
      for (int k = static_cast<int>(rng() % 4); k > 0; --k) {
        out << " " << slot << ":" << (rng() % 600) * 26 + static_cast<uint64_t>(slot);
      }
    }
    out << "\n";
  }
  return dir.string();
}

// Sets the device layer's mode for the trainer made in its scope (streams take it when made).
class DeferScope {
 public:
  DeferScope(bool enabled, uint64_t seed)
      : was_(device::deferred_execution_enabled()), was_seed_(device::deferred_execution_seed()) {
    device::set_deferred_execution(enabled, seed);
  }
  ~DeferScope() { device::set_deferred_execution(was_, was_seed_); }
  DeferScope(const DeferScope&) = delete;
  DeferScope& operator=(const DeferScope&) = delete;

 private:
  bool was_;
  uint64_t was_seed_;
};

OrderRun train(int cards, bool collective, bool graphs, bool defer, uint64_t seed) {
  const std::string data = order_data_dir();
  auto parsed =
      parse_trainer_config("runner: {}\n", ".",
                           {"runner.train_data_dir=" + data, "runner.train_batch_size=100",
                            "runner.infer_batch_size=100", "runner.shuffle=false",
                            "runner.metrics_path=", "runner.print_interval=5",
                            std::string("runner.use_fleet=") + (collective ? "true" : "false")});
  throw_if_error(parsed.status());
  const TrainerEnv env = testing::cards_env(cards);
  const char* old_graphs = std::getenv("GPUBOX_STEP_GRAPHS");
  const std::string kept = old_graphs == nullptr ? "" : old_graphs;
  ::setenv("GPUBOX_STEP_GRAPHS", graphs ? "1" : "0", 1);  // read as the trainer is made
  OrderRun run;
  {
    const DeferScope mode(defer, seed);
    Trainer trainer(std::move(parsed).value(), env);
    if (old_graphs == nullptr) {
      ::unsetenv("GPUBOX_STEP_GRAPHS");
    } else {
      ::setenv("GPUBOX_STEP_GRAPHS", kept.c_str(), 1);
    }
    const auto files = data_files(data);
    for (int pass = 0; pass < 2; ++pass) {
      run.passes.push_back(trainer.train_pass(files).metrics);
      run.host_rows.push_back(testing::host_rows(trainer));
    }
    for (int c = 0; c < trainer.num_cards(); ++c) run.dense.push_back(trainer.dense_values(c));
    run.predictions = trainer.evaluate(files, /*keep_predictions=*/true).predictions;
  }
  return run;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

void expect_same(const OrderRun& a, const OrderRun& b) {
  ASSERT_EQ(a.passes.size(), b.passes.size());
  for (std::size_t p = 0; p < a.passes.size(); ++p) {
    const MetricValues& x = a.passes[p];
    const MetricValues& y = b.passes[p];
    for (const auto& [name, u, v] :
         {std::tuple{"auc", x.auc, y.auc}, std::tuple{"logloss", x.logloss, y.logloss},
          std::tuple{"predicted_ctr", x.predicted_ctr, y.predicted_ctr},
          std::tuple{"examples", x.examples, y.examples}}) {
      EXPECT_TRUE(std::memcmp(&u, &v, sizeof(double)) == 0)
          << "pass " << p << " " << name << ": " << u << " and " << v;
    }
    EXPECT_FALSE(a.host_rows[p].empty());
    EXPECT_TRUE(testing::same_rows(a.host_rows[p], b.host_rows[p])) << "pass " << p;
  }
  ASSERT_EQ(a.dense.size(), b.dense.size());
  for (std::size_t c = 0; c < a.dense.size(); ++c)
    EXPECT_TRUE(same_bits(a.dense[c], b.dense[c])) << "card " << c;
  EXPECT_FALSE(a.predictions.empty());
  EXPECT_TRUE(same_bits(a.predictions, b.predictions));
}

class StreamOrder : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(StreamOrder, TrainingUnderDeferredExecutionEqualsTheEagerRunBitForBit) {
  const auto [cards, collective] = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  for (const bool graphs : {true, false}) {
    SCOPED_TRACE(graphs ? "as step graphs" : "eagerly");
    const OrderRun eager = train(cards, collective, graphs, false, 0);
    for (const uint64_t seed : {uint64_t{0}, uint64_t{1}}) {
      SCOPED_TRACE(seed == 0 ? std::string("deferred lazily") : "seed " + std::to_string(seed));
      expect_same(train(cards, collective, graphs, true, seed), eager);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, StreamOrder,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Bool()),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "cards_" +
                                  (std::get<1>(info.param) ? "collective" : "gpubox");
                         });

}  // namespace
}  // namespace gpubox::trainer
