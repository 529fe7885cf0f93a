// Clipping by global norm's veto through a CardWorker (trainer/engine/card_worker.cpp): a sparse
// gradient that is not finite while every dense gradient is makes the global norm non-finite;
// HeterComm::push_pulled then vetoes the step on the card (heter_comm::kNonFiniteNorm), so the
// dense parameters keep their values, and the host reports it naming the pass and step (the
// step's status is copied after the push). The sparse gradient is made infinite without touching
// the forward: every input of the first layer is 0 (dense values 0, embed_w starting at 0, no
// embedx part yet), so its weights, set to FLT_MAX, leave the forward and the dense gradients
// finite (its bias, 1, keeps its units active) but make the pooled inputs' gradients, the push
// records, overflow. One simulated card.
#include <gtest/gtest.h>

#include <cfloat>
#include <chrono>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "heterps/card_tier/card_tier.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "table/server/host_tier_factory.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/card_worker.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/nn/dense_parameters.hpp"

namespace gpubox::trainer {
namespace {

constexpr int kSlots = 3;
constexpr int kDense = 2;
constexpr int kBatch = 12;

TrainerConfig config(const std::string& clip) {
  auto parsed = parse_trainer_config(
      "runner: {}\n", ".",
      {"runner.metrics_path=", "hyper_parameters.sparse_inputs_slots=" + std::to_string(kSlots + 1),
       "hyper_parameters.sparse_feature_dim=4",
       "hyper_parameters.dense_input_dim=" + std::to_string(kDense),
       "hyper_parameters.fc_sizes=[16, 8]", "hyper_parameters.optimizer.class=SGD",
       "hyper_parameters.sparse_optimizer.initial_range=0",
       "hyper_parameters.optimizer.clip_by_norm=" + clip});
  throw_if_error(parsed.status());
  return std::move(parsed).value();
}

// kBatch instances, every slot of every one holding key `key` (a hot key: its push records summed
// over 3 x kBatch occurrences), dense values 0.
dataset::Batch batch(uint64_t key) {
  dataset::Batch b;
  b.num_slots = kSlots;
  b.dense_dim = kDense;
  for (int slot = 0; slot < kSlots; ++slot) {
    for (int i = 0; i < kBatch; ++i) {
      b.keys.push_back(key);
      b.offsets.push_back(static_cast<uint32_t>(b.keys.size()));
    }
  }
  b.dense.assign(kBatch * kDense, 0.0f);
  for (int i = 0; i < kBatch; ++i) b.labels.push_back(i % 3 == 0 ? 1.0f : 0.0f);
  return b;
}

// One step with fc_0.w at FLT_MAX (fc_0.b at 1): the error it stops with ("" when none) and whether
// the dense values changed.
struct Outcome {
  std::string error;
  bool dense_changed = false;
};

// `planned`: the step planned at the pass's fixed sizes, as the trainer's (one composed step
// graph, CardWorker::run_whole_step); else unplanned (its parts, run_step_parts).
Outcome poisoned_step(const std::string& clip, bool planned) {
  const TrainerConfig cfg = config(clip);
  device::CardSet set = device::CardSet::from_list(device::testing::card_list(1), 0, 1, 1);
  auto group = comm::make_group(set, std::chrono::seconds(60));
  auto host = table::make_host_tier(cfg.sparse, cfg.host_tier);
  throw_if_error(host.status());
  tier_owner::CardTier tier(set, *group, **host, cfg.sparse, tier_owner::CardTierOptions{});
  const uint64_t key = mix64(77);
  tier.begin_pass(std::vector<uint64_t>{key}, std::vector<int32_t>{1});
  set.card(0).activate();
  CardWorker worker(set.card(0), group->at(0), tier, cfg);
  Outcome out;
  set.run_on_cards(
      [&](device::Card& card) {
        StepReservation r;
        r.instances = kBatch;
        r.slots = kSlots;
        r.dense_dim = kDense;
        r.keys.occurrences = kSlots * kBatch;
        r.keys.unique = 1;
        r.keys.block = 1;
        r.keys.received = 1;
        if (planned) r.keys.pair_block = 1;
        worker.reserve_steps(r);
        DenseParameters& params = worker.model().parameters();
        std::vector<float> values = params.values_to_host();
        for (const ParamBlock& block : params.blocks()) {
          // Its bias at 1 keeps every hidden unit of the first layer active (ReLU).
          const float value = block.name == "fc_0.w"   ? FLT_MAX
                              : block.name == "fc_0.b" ? 1.0f
                                                       : 0.0f;
          if (value == 0.0f) continue;
          for (std::size_t i = 0; i < block.count; ++i) values[block.offset + i] = value;
        }
        params.set_values(values);
        card.stream().synchronize();
        try {
          const std::vector<uint64_t> counts = {1};  // the one key, to its owner (card 0)
          const heter_comm::PlannedCounts plan =
              planned ? heter_comm::PlannedCounts{counts.data(), 1} : heter_comm::PlannedCounts{};
          worker.train_step(batch(key), kBatch, /*pass=*/2, /*step=*/0, false, plan, false);
          worker.drain();
        } catch (const Error& e) {
          out.error = e.what();
        }
        out.dense_changed = params.values_to_host() != values;
      },
      [&](const std::string& why) { group->abort(why); });
  return out;
}

TEST(GradientClipVeto, ANonFiniteSparseGradientVetoesTheStepAndStopsNamingPassAndStep) {
  GPUBOX_REQUIRE_CARDS(1);
  for (const bool planned : {false, true}) {
    const std::string what = planned ? "planned (one step graph)" : "unplanned";
    const Outcome clipped = poisoned_step("1.0", planned);
    EXPECT_NE(clipped.error.find("pass 2, batch 0: the global gradient norm of "
                                 "hyper_parameters.optimizer.clip_by_norm is not finite"),
              std::string::npos)
        << what << ", error: '" << clipped.error << "'";
    EXPECT_FALSE(clipped.dense_changed) << what << ": the vetoed step changed the dense parameters";
    // Without the clip the same step is not vetoed (the dense gradients are finite): the
    // poisoned push is what the clip's veto catches.
    const Outcome plain = poisoned_step("0", planned);
    EXPECT_EQ(plain.error, "") << what;
    EXPECT_TRUE(plain.dense_changed) << what;
  }
}

}  // namespace
}  // namespace gpubox::trainer
