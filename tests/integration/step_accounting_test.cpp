// What a training step asks of each card, pinned on the cpu backend (the device layer counts in
// its portable wrappers, so a GPU run counts the same): in steady state a step of the default
// model never waits for a value of the card's (no round trip; a card slower than its host makes
// the host wait for the step 4 back, its status ring's oldest, at most once a step: a pipeline
// wait, step_waits.hpp) (issue 31, item 2: the key counts come from the pass's step
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
// first ones included (PassSizing in step_varying_keys_test.cpp, on data whose keys per line
// vary, with the step graphs against the eager run bit for bit). The fixture and its data:
// step_accounting_fixture.hpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "heterps/device/counters.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/integration/scoped_env.hpp"
#include "tests/integration/step_accounting_fixture.hpp"
#include "tests/integration/step_waits.hpp"
#include "trainer/engine/step_times.hpp"
#include "trainer/engine/trainer.hpp"

namespace gpubox::trainer {
namespace {

using gpubox::testing::ScopedEnv;  // tests/integration/scoped_env.hpp
using step_test::expect_no_round_trip;
using step_test::StepAccounting;

TEST_P(StepAccounting, SteadyStepNeverWaitsAllocatesNothingAndRunsFourCollectives) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  const auto extra = second_pass(cards);
  ASSERT_TRUE(extra.count("steady_steps")) << "the pass report has no step counts";
  // 4000 lines / (100 per card x cards) steps, minus the 2 warm-up steps.
  EXPECT_EQ(extra.at("steady_steps"), 4000 / (100 * cards) - 2);
  expect_no_round_trip(extra);
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
  expect_no_round_trip(graphed, "", "graphed");
  expect_no_round_trip(eager, "", "eager");
  EXPECT_EQ(eager.at("pinned_copies_per_step"), graphed.at("pinned_copies_per_step"));
}

TEST_P(StepAccounting, CollectiveSteadyStepRunsOneCollectiveFewerAllInStepGraphs) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  const auto gpubox = second_pass(cards);
  const auto collective = second_pass(cards, /*collective=*/true);
  ASSERT_TRUE(collective.count("steady_steps")) << "the pass report has no step counts";
  EXPECT_EQ(collective.at("steady_steps"), gpubox.at("steady_steps"));
  expect_no_round_trip(collective, "", "Collective mode");
  expect_no_round_trip(gpubox, "", "gpubox mode");
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
  expect_no_round_trip(eager, "", "Collective mode, eager");
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
  expect_no_round_trip(first, "", "first pass");
  expect_no_round_trip(second, "", "second pass");
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

// Clipping by global norm (hyper_parameters.optimizer.clip_by_norm) inside the same step: its
// dense squares, factor and scaling are card work in the one step graph, so the step still waits
// for nothing, allocates nothing and is 1 graph launch; its one more collective (the sparse
// squares' all-reduce over the owners, only sharded on several cards) runs inside the graph, and
// eagerly it is a 5th collective on several cards (4 on one; Collective mode's replicas merged
// every key: still 3).
TEST_P(StepAccounting, ClippingByGlobalNormAddsNoWaitNoAllocationOnlyGraphNodes) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  const std::vector<std::string> clip = {"hyper_parameters.optimizer.clip_by_norm=0.5"};
  const auto plain = second_pass(cards);
  const auto clipped = both_passes(cards, clip).second;
  expect_no_round_trip(clipped, "", "clipped");
  EXPECT_EQ(clipped.at("allocations_per_step"), 0.0);
  EXPECT_EQ(clipped.at("pageable_copies_per_step"), 0.0);
  EXPECT_EQ(clipped.at("collectives_per_step"), 0.0);
  EXPECT_EQ(clipped.at("graph_launches_per_step"), 1.0);
  EXPECT_EQ(clipped.at("launches_per_step"), 0.0);
  EXPECT_GT(clipped.at("graph_nodes_per_step"), plain.at("graph_nodes_per_step"));
  ScopedEnv off("GPUBOX_STEP_GRAPHS", "0");
  EXPECT_EQ(both_passes(cards, clip).second.at("collectives_per_step"), cards > 1 ? 5.0 : 4.0);
  std::vector<std::string> collective = clip;
  collective.push_back("runner.use_fleet=true");
  const auto replicated = both_passes(cards, collective).second;
  EXPECT_EQ(replicated.at("collectives_per_step"), 3.0);
  expect_no_round_trip(replicated, "", "clipped, Collective mode, eager");
  EXPECT_EQ(replicated.at("allocations_per_step"), 0.0);
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
  cards[0].pipeline_waits = 2;  // both in one step: the average hides it, the maximum does not
  PassReport report;
  append_step_counts(cards, 2, /*max_pipeline_waits=*/2, &report);
  const std::map<std::string, double> extra(report.extra.begin(), report.extra.end());
  EXPECT_DOUBLE_EQ(extra.at("graph_captures_per_step"), 1.0);  // 4 over 2 cards x 2 steps
  EXPECT_DOUBLE_EQ(extra.at("graph_launches_per_step"), 4.0);
  EXPECT_DOUBLE_EQ(extra.at("pipeline_waits_per_step"), 0.5);
  EXPECT_DOUBLE_EQ(extra.at("max_pipeline_waits_in_a_step"), 2.0);
  EXPECT_DOUBLE_EQ(extra.at("steady_steps"), 2.0);
  std::vector<std::pair<std::string, double>> eval;
  append_eval_step_counts(cards, 2, 2, &eval);
  ASSERT_EQ(eval.size(), report.extra.size());
  for (std::size_t i = 0; i < eval.size(); ++i) {
    EXPECT_EQ(eval[i].first, "eval_" + report.extra[i].first);
    EXPECT_EQ(eval[i].second, report.extra[i].second);
  }
  append_eval_step_counts(cards, 0, 0, &eval);  // no steady step: nothing
  EXPECT_EQ(eval.size(), report.extra.size());
}

// An evaluation step (CardWorker::eval_step) pulls and predicts only, as ONE composed graph, "eval
// step" (device::ComposedStep, as a training step): the sparse lookup (no owner merge plan, which
// only a push uses; in Collective mode no collective at all: every card reads its own keys from its
// own replica), the forward, the predictions, the metrics and the 2 ring-slot kernels (the lookup's
// check and the step's slot counter, each into the pinned ring slot the card's counter picks): 1
// graph launch and nothing outside it, no wait, no allocation, nothing captured again in its steady
// steps. It was 2 graphs ("sparse lookup", "dense predict") with the 2 ring kernels outside them;
// before that, the training step's padded pull graph plus the forward launched eagerly. Less work
// than a training step in either mode; eagerly (GPUBOX_STEP_GRAPHS=0) the same work as launches,
// with no collective in Collective mode and the keys' and records' all-to-alls in gpubox mode. The
// training passes before it report their captures: in the second pass's steady steps, only the
// "train step" graph's variants (steady flag, progress flag, upload buffer: at most 8 a card; the
// pass boundary moved the card's memory since the first pass; card_worker_graphs_test pins each
// trigger).
class EvalSteps : public StepAccounting {};

// Nodes of an evaluation step, [Collective mode][more than 1 card]: the sparse lookup (the local
// dedup and owner plan: 4; the keys into their blocks, the miss counter's reset, the lookups, the
// check, the records' fill and scatter: 10; gpubox mode: the keys' and the records' all-to-alls
// besides: 12), the dense forward (the forward, the sigmoid, the metrics: 9; 10 at gpubox_bench's
// batch 512, where the training step's dense half has 2 more too) and the 2 ring-slot kernels.
constexpr double kEvalNodes[2][2] = {{23, 23}, {21, 21}};

TEST_P(EvalSteps, AnEvaluationStepIsALookupAndAPredictionInOneGraph) {
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
    expect_no_round_trip(eval, "eval_", "evaluation");
    for (const char* key :
         {"eval_allocations_per_step", "eval_pageable_copies_per_step", "eval_collectives_per_step",
          "eval_card_copies_per_step", "eval_graph_captures_per_step"}) {
      EXPECT_EQ(eval.at(key), 0.0) << key;
    }
    EXPECT_EQ(eval.at("eval_launches_per_step"), 0.0);
    EXPECT_EQ(eval.at("eval_graph_launches_per_step"), 1.0);
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
    expect_no_round_trip(eager_eval, "eval_", "evaluation, eager");
    EXPECT_EQ(eager_eval.at("eval_collectives_per_step"), collective ? 0.0 : 2.0);
    EXPECT_EQ(eager_eval.at("eval_launches_per_step") + eager_eval.at("eval_collectives_per_step") +
                  eager_eval.at("eval_card_copies_per_step"),
              eval.at("eval_graph_nodes_per_step") + eval.at("eval_launches_per_step"));
  }
}

INSTANTIATE_TEST_SUITE_P(Cards, EvalSteps, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "cards"; });

INSTANTIATE_TEST_SUITE_P(Cards, StepAccounting, ::testing::Values(1, 2, 4, 8),
                         [](const auto& info) { return std::to_string(info.param) + "cards"; });

}  // namespace
}  // namespace gpubox::trainer
