// When CardWorker captures its dense step graphs again (trainer/engine/card_worker.cpp: "dense
// step", "dense update", "dense predict"). A capture bakes in the batch size, the gradient scale
// (1 / the step's global batch), the metrics' steady flag, the stop vote and the buffers (which
// of the two upload buffers: a pointer); "dense step" graphs are kept per such key (the last 8,
// most recently used first), and every graph is captured again when the card has allocated or
// freed since its capture (the memory generation: a buffer may have moved) or, for "dense
// predict", when the pass's full batch changed. A batch that is not the pass's full one (set by
// reserve_steps) runs eagerly. A script of training and evaluation steps changes each of these
// alone and checks, on every card, that exactly the graphs it concerns are captured again in
// exactly that step (the card's graph_captures counter), and that the whole script trains and
// predicts the same bits as GPUBOX_STEP_GRAPHS=0 (every step eagerly). The sparse half runs
// unplanned here (no step plan: no sparse graphs), so every capture counted is a dense one.
// 1 and 2 simulated cards.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "heterps/card_tier/card_tier.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "table/server/host_tier_factory.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/integration/scoped_env.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/card_worker.hpp"
#include "trainer/metrics/metrics.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/nn/dense_parameters.hpp"

namespace gpubox::trainer {
namespace {

constexpr int kSlots = 3;
constexpr int kDense = 2;
constexpr int kFullBatch = 12;   // the first pass's full batch
constexpr int kSmallBatch = 8;   // the second pass's
constexpr int kWarmupSteps = 3;  // runner.print_interval: steps from 3 on are steady
constexpr int kUniverse = 200;

TrainerConfig config() {
  auto parsed = parse_trainer_config(
      "runner: {}\n", ".",
      {"runner.metrics_path=", "runner.print_interval=" + std::to_string(kWarmupSteps),
       "hyper_parameters.sparse_inputs_slots=" + std::to_string(kSlots + 1),
       "hyper_parameters.sparse_feature_dim=4",
       "hyper_parameters.dense_input_dim=" + std::to_string(kDense),
       "hyper_parameters.fc_sizes=[16, 8]"});
  throw_if_error(parsed.status());
  return std::move(parsed).value();
}

// What happens on the card before a step, besides its batch.
enum class Before { kNothing, kAllocate, kFree, kSmallerPass, kFullPass };

// One step of the script (the same on every card): a training step (or an evaluation step) of
// `batch` instances per card, with `scale` times the job's instances as its global batch (a
// gradient scale no other step had), and the captures it must cost each card.
struct Step {
  int batch = kFullBatch;
  int step = 0;  // the step number (steady from kWarmupSteps on)
  bool vote = false;
  int scale = 1;
  bool eval = false;
  Before before = Before::kNothing;
  uint64_t captures = 0;
  const char* why = "";
};

// Upload buffers alternate from step to step (0, 1, 0, ...: each pass starts again at 0).
const std::vector<Step>& script() {
  static const std::vector<Step> steps = {
      {kFullBatch, 0, false, 1, false, Before::kFullPass, 2, "first step: step and update"},
      {kFullBatch, 1, false, 1, false, Before::kNothing, 1, "the other upload buffer"},
      {kFullBatch, 2, false, 1, false, Before::kNothing, 0, "buffer 0 again: replayed"},
      {kFullBatch, 3, false, 1, false, Before::kNothing, 1, "steady now: another key"},
      {kFullBatch, 4, false, 1, false, Before::kNothing, 1, "steady, buffer 0"},
      {kFullBatch, 5, false, 1, false, Before::kNothing, 0, "replayed"},
      {kFullBatch / 2, 6, false, 1, false, Before::kNothing, 0, "a short batch: eagerly"},
      {kFullBatch, 7, false, 1, false, Before::kNothing, 0, "replayed after it"},
      {kFullBatch, 8, true, 1, false, Before::kNothing, 1, "a stop vote: a graph per vote"},
      {kFullBatch, 9, false, 1, false, Before::kNothing, 0, "no vote: replayed"},
      {kFullBatch, 10, false, 2, false, Before::kNothing, 1, "another gradient scale"},
      {kFullBatch, 11, false, 1, false, Before::kAllocate, 2, "a card allocation: step, update"},
      {kFullBatch, 12, false, 1, false, Before::kNothing, 1, "buffer 0's graph, captured before"},
      {kFullBatch, 13, false, 1, false, Before::kNothing, 0, "replayed"},
      {kFullBatch, 14, false, 1, false, Before::kFree, 2, "a card free: step, update"},
      {kFullBatch, 15, false, 1, false, Before::kNothing, 1, "buffer 1's, captured before"},
      {kFullBatch, 16, false, 1, false, Before::kNothing, 0, "replayed"},
      {kFullBatch, 0, false, 1, true, Before::kNothing, 1, "an evaluation: dense predict"},
      {kFullBatch, 0, false, 1, true, Before::kNothing, 1, "on the other buffer"},
      {kFullBatch, 0, false, 1, true, Before::kNothing, 0, "replayed"},
      {kSmallBatch, 0, false, 1, false, Before::kSmallerPass, 1, "a pass of smaller batches"},
      {kSmallBatch, 1, false, 1, false, Before::kNothing, 1, "its other buffer"},
      {kSmallBatch, 2, false, 1, false, Before::kNothing, 0, "replayed"},
      {kFullBatch, 3, false, 1, false, Before::kNothing, 0, "past the pass's full: eagerly"},
      {kSmallBatch, 0, false, 1, true, Before::kNothing, 1, "dense predict, another batch"},
      {kSmallBatch, 0, false, 1, true, Before::kNothing, 1, "and the other buffer"},
      {kFullBatch, 3, false, 1, false, Before::kFullPass, 0, "the first pass's shape: replayed"},
      {kFullBatch, 4, false, 1, false, Before::kNothing, 0, "both buffers"},
      {kFullBatch, 0, false, 1, true, Before::kNothing, 1, "dense predict, the full batch again"},
      {kFullBatch, 5, false, 3, false, Before::kNothing, 1,
       "a 9th key: (buffer 1, unsteady) leaves"},
      {kFullBatch, 6, false, 4, false, Before::kNothing, 1, "another: (buffer 0, unsteady) leaves"},
      {kFullBatch, 7, false, 1, false, Before::kNothing, 0, "a recent key: kept"},
      {kFullBatch, 0, false, 1, false, Before::kNothing, 1, "buffer 0 unsteady: evicted, captured"},
      {kFullBatch, 1, false, 1, false, Before::kNothing, 1, "buffer 1 unsteady: evicted too"},
  };
  return steps;
}

// One card's batch of `n` instances for script step `s` (seeded by step and card): 1 or 2 keys a
// slot from the universe, dense values and labels.
dataset::Batch make_batch(int n, std::size_t s, int card) {
  std::mt19937_64 rng(1000 * s + static_cast<std::size_t>(card) + 7);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  dataset::Batch b;
  b.num_slots = kSlots;
  b.dense_dim = kDense;
  for (int slot = 0; slot < kSlots; ++slot) {
    for (int i = 0; i < n; ++i) {
      for (int k = 1 + static_cast<int>(rng() % 2); k > 0; --k) {
        b.keys.push_back(mix64(31 + rng() % kUniverse));
      }
      b.offsets.push_back(static_cast<uint32_t>(b.keys.size()));
    }
  }
  for (int i = 0; i < n * kDense; ++i) b.dense.push_back(unit(rng));
  for (int i = 0; i < n; ++i) b.labels.push_back(unit(rng) < 0.3f ? 1.0f : 0.0f);
  return b;
}

// What a run of the script leaves: per step and card the captures; per card the dense
// parameters, the metrics, and every evaluation step's predictions.
struct ScriptRun {
  std::vector<std::vector<uint64_t>> captures;  // [step][card]
  std::vector<std::vector<float>> dense;
  std::vector<MetricValues> metrics;
  std::vector<std::vector<float>> predictions;  // [card], every evaluation step's in turn
};

// The largest step a pass of `batch` instances a card runs (unplanned: no pair block).
StepReservation reservation(int batch, int cards) {
  StepReservation r;
  r.instances = batch;
  r.slots = kSlots;
  r.dense_dim = kDense;
  r.keys.occurrences = static_cast<std::size_t>(2 * kSlots * kFullBatch);
  r.keys.unique = r.keys.occurrences;
  r.keys.block = r.keys.occurrences;
  r.keys.received = r.keys.occurrences * static_cast<std::size_t>(cards);
  r.other_instances = {kFullBatch / 2, kFullBatch};
  return r;
}

ScriptRun run_script(int cards) {
  const TrainerConfig cfg = config();
  device::CardSet set = device::CardSet::from_list(device::testing::card_list(cards), 0, 1, 1);
  auto group = comm::make_group(set, std::chrono::seconds(60));
  auto host = table::make_host_tier(cfg.sparse, cfg.host_tier);
  throw_if_error(host.status());
  tier_owner::CardTierOptions options;  // kFail, sharded
  tier_owner::CardTier tier(set, *group, **host, cfg.sparse, options);
  std::vector<uint64_t> keys;
  for (int k = 0; k < kUniverse; ++k) keys.push_back(mix64(31 + k));
  std::sort(keys.begin(), keys.end());
  tier.begin_pass(keys, std::vector<int32_t>(keys.size(), 1));
  std::vector<std::unique_ptr<CardWorker>> workers;
  for (int c = 0; c < cards; ++c) {
    set.card(c).activate();
    workers.push_back(std::make_unique<CardWorker>(set.card(c), group->at(c), tier, cfg));
  }
  const std::vector<Step>& steps = script();
  ScriptRun out;
  out.captures.assign(steps.size(), std::vector<uint64_t>(static_cast<std::size_t>(cards)));
  out.dense.resize(static_cast<std::size_t>(cards));
  out.metrics.resize(static_cast<std::size_t>(cards));
  out.predictions.resize(static_cast<std::size_t>(cards));
  set.run_on_cards(
      [&](device::Card& card) {
        const int c = card.local_index();
        CardWorker& worker = *workers[static_cast<std::size_t>(c)];
        std::optional<device::device_buffer<float>> held;  // Before::kAllocate's, freed later
        std::vector<float>& predictions = out.predictions[static_cast<std::size_t>(c)];
        for (std::size_t s = 0; s < steps.size(); ++s) {
          const Step& step = steps[s];
          switch (step.before) {
            case Before::kAllocate:
              held.emplace(card.make_buffer<float>(1024));
              break;
            case Before::kFree:
              held.reset();
              break;
            case Before::kSmallerPass:
              worker.drain();
              worker.reserve_steps(reservation(kSmallBatch, cards));
              break;
            case Before::kFullPass:
              worker.drain();
              worker.reserve_steps(reservation(kFullBatch, cards));
              break;
            case Before::kNothing:
              break;
          }
          const dataset::Batch batch = make_batch(step.batch, s, c);
          const device::DeviceCounts before = card.counts();
          if (step.eval) {
            const std::size_t at = predictions.size();
            predictions.resize(at + batch.size());
            worker.eval_step(batch, {}, predictions.data() + at);
            worker.drain();  // the predictions are written when the slot is read
          } else {
            const int64_t global = static_cast<int64_t>(step.batch) * cards * step.scale;
            worker.train_step(batch, global, 1, step.step, false, {}, step.vote);
          }
          out.captures[s][static_cast<std::size_t>(c)] = (card.counts() - before).graph_captures;
        }
        worker.drain();
        out.dense[static_cast<std::size_t>(c)] = worker.model().parameters().values_to_host();
        out.metrics[static_cast<std::size_t>(c)] = worker.metrics().compute();
      },
      [&](const std::string& why) { group->abort(why); });
  tier.end_pass();
  return out;
}

using gpubox::testing::ScopedEnv;  // tests/integration/scoped_env.hpp

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

class CardWorkerGraphs : public ::testing::TestWithParam<int> {};

TEST_P(CardWorkerGraphs, RecaptureExactlyWhenABakedInValueChangesAndEqualEagerRuns) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  const ScriptRun graphed = run_script(cards);
  ScriptRun eager;
  {
    const ScopedEnv off("GPUBOX_STEP_GRAPHS", "0");
    eager = run_script(cards);
  }
  const std::vector<Step>& steps = script();
  for (std::size_t s = 0; s < steps.size(); ++s) {
    for (int c = 0; c < cards; ++c) {
      EXPECT_EQ(graphed.captures[s][static_cast<std::size_t>(c)], steps[s].captures)
          << "step " << s << " (" << steps[s].why << ") on card " << c;
      EXPECT_EQ(eager.captures[s][static_cast<std::size_t>(c)], 0u) << "step " << s;
    }
  }
  for (int c = 0; c < cards; ++c) {
    const auto i = static_cast<std::size_t>(c);
    EXPECT_TRUE(same_bits(graphed.dense[i], eager.dense[i])) << "card " << c;
    EXPECT_TRUE(same_bits(graphed.dense[i], graphed.dense[0])) << "card " << c;
    EXPECT_FALSE(graphed.predictions[i].empty());
    EXPECT_TRUE(same_bits(graphed.predictions[i], eager.predictions[i])) << "card " << c;
    const MetricValues& g = graphed.metrics[i];
    const MetricValues& e = eager.metrics[i];
    for (const auto& [name, x, y] :
         {std::tuple{"auc", g.auc, e.auc}, std::tuple{"logloss", g.logloss, e.logloss},
          std::tuple{"examples", g.examples, e.examples}}) {
      EXPECT_TRUE(std::memcmp(&x, &y, sizeof(double)) == 0)
          << "card " << c << " " << name << ": " << x << " with graphs, " << y << " without";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cards, CardWorkerGraphs, ::testing::Values(1, 2),
                         [](const auto& info) { return std::to_string(info.param) + "cards"; });

}  // namespace
}  // namespace gpubox::trainer
