// HeterComm's planned steps at the pass's fixed sizes (StepBounds::pair_block with the step's
// occurrence count on the card: heter_comm_padded.cu), sharded (gpubox mode) and replicated
// (Collective mode: every card holds every row), on 1, 2 and 4 simulated cards, on skewed keys (a
// few hot keys, many cold ones) with a batch size that varies step to step:
//   - their pull records and the final rows are bit-identical to unpadded planned steps' (the
//     oracle: the same sums in the same order), as step graphs and eagerly;
//   - as step graphs, a steady step is 2 graph launches and the check's copy into its ring slot
//     (one kernel; inside a caller's composed step it joins the caller's graph): no other launch,
//     no collective or host wait outside them, no allocation (eagerly: 3 collectives sharded, 2
//     replicated) (the cpu backend's capture mode refuses a host wait, an allocation, a pageable
//     copy or a Thrust call: a capture that succeeded proves the step capturable);
//   - a pull_only (an evaluation's step) looks up the same records in one smaller graph.
// What a padded pass refuses or reserves (a wrong plan, a missing key, the blocks' sizes, a plan
// of the other placement's width): heter_comm_padded_checks_test.cu; shared helpers in
// heter_comm_padded_test_util.cuh.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "heterps/device/counters.hpp"
#include "heterps/heter_comm/heter_comm.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/heterps/heter_comm/heter_comm_padded_test_util.cuh"

namespace gpubox::heter_comm::padded_test {
namespace {

TEST_P(PaddedSteps, EqualUnpaddedStepsBitForBitAsGraphsAndEagerly) {
  const int cards = this->cards();
  GPUBOX_REQUIRE_CARDS(cards);
  const Data data = this->data();
  const RunResult want = run(cards, placement(), Mode::kUnpadded, data);
  for (const Mode mode : {Mode::kPaddedEager, Mode::kPaddedGraphs}) {
    SCOPED_TRACE(mode == Mode::kPaddedGraphs ? "step graphs" : "eagerly");
    const RunResult got = run(cards, placement(), mode, data);
    for (int s = 0; s < kSteps; ++s) {
      for (int c = 0; c < cards; ++c) {
        EXPECT_TRUE(same_bits(got.pulled[s][c], want.pulled[s][c]))
            << "step " << s << " card " << c;
      }
    }
    for (int c = 0; c < cards; ++c) {
      EXPECT_TRUE(same_bits(got.rows[c], want.rows[c])) << "card " << c << "'s rows";
      // Replicated: every replica is the same table (and it changed: the steps updated it).
      if (replicated()) {
        EXPECT_TRUE(same_bits(got.rows[c], got.rows[0])) << "card " << c;
      }
    }
  }
}

TEST_P(PaddedSteps, AsStepGraphsAStepIsTwoGraphLaunchesAndNothingElse) {
  const int cards = this->cards();
  GPUBOX_REQUIRE_CARDS(cards);
  const Data data = this->data();
  const RunResult graphs = run(cards, placement(), Mode::kPaddedGraphs, data);
  const RunResult eager = run(cards, placement(), Mode::kPaddedEager, data);
  for (int c = 0; c < cards; ++c) {
    const device::DeviceCounts& g = graphs.last_step[c];
    const device::DeviceCounts& e = eager.last_step[c];
    EXPECT_EQ(g.graph_launches, 2u) << "card " << c;  // "sparse pull", "sparse push"
    EXPECT_EQ(g.launches, 1u) << "card " << c;        // the check into its ring slot
    EXPECT_EQ(g.collectives, 0u) << "card " << c;
    EXPECT_EQ(g.card_copies, 0u) << "card " << c;
    EXPECT_EQ(g.host_syncs, 0u) << "card " << c;
    EXPECT_EQ(g.allocations, 0u) << "card " << c;
    EXPECT_EQ(g.pinned_copies, 0u) << "card " << c;  // the check: a kernel writes its slot
    // The same work, eagerly: every node a launch, a card copy or a collective. Sharded: keys
    // out, records back, push records out (3); replicated: keys and push records all-gathered,
    // the pull records read from the card's own replica (2).
    EXPECT_EQ(e.graph_launches, 0u) << "card " << c;
    EXPECT_EQ(e.collectives, replicated() ? 2u : 3u) << "card " << c;
    EXPECT_EQ(e.host_syncs, 0u) << "card " << c;
    EXPECT_EQ(g.graph_nodes + g.launches, e.launches + e.collectives + e.card_copies)
        << "card " << c;
  }
}

// HeterComm::pull_only (an evaluation's step): the records of pull, bit for bit (the unpadded
// pull's, and the padded pull's that evaluations ran before it), in one "sparse lookup" graph of
// fewer nodes than the pull's (no owner merge plan) and, replicated, without any collective; the
// rows stay as they were; push_pulled after it is refused.
TEST_P(PaddedSteps, APullOnlyLooksUpTheSameRecordsWithLessWork) {
  const int cards = this->cards();
  GPUBOX_REQUIRE_CARDS(cards);
  const Data data = this->data();
  const RunResult want =
      run(cards, placement(), Mode::kUnpadded, data, nullptr, -1, 0, Use::kPullNoPush);
  const RunResult pulls =
      run(cards, placement(), Mode::kPaddedGraphs, data, nullptr, -1, 0, Use::kPullNoPush);
  const RunResult eager =
      run(cards, placement(), Mode::kPaddedEager, data, nullptr, -1, 0, Use::kPullOnly);
  for (const Mode mode : {Mode::kUnpadded, Mode::kPaddedEager, Mode::kPaddedGraphs}) {
    SCOPED_TRACE(mode == Mode::kUnpadded      ? "unpadded"
                 : mode == Mode::kPaddedEager ? "eagerly"
                                              : "graphs");
    const RunResult got = mode == Mode::kPaddedEager
                              ? eager
                              : run(cards, placement(), mode, data, nullptr, -1, 0, Use::kPullOnly);
    for (int s = 0; s < kSteps; ++s) {
      for (int c = 0; c < cards; ++c) {
        EXPECT_TRUE(same_bits(got.pulled[s][c], want.pulled[s][c]))
            << "step " << s << " card " << c;
        EXPECT_TRUE(same_bits(got.pulled[s][c], pulls.pulled[s][c]))
            << "step " << s << " card " << c;
      }
    }
    for (int c = 0; c < cards; ++c) {
      EXPECT_TRUE(same_bits(got.rows[c], want.rows[c])) << "card " << c << "'s rows";
      EXPECT_NE(got.push_refused[c].find("or a pull_only, which planned no push"),
                std::string::npos)
          << "card " << c << ": " << got.push_refused[c];
      if (mode != Mode::kPaddedGraphs) continue;
      const device::DeviceCounts& g = got.last_step[c];
      const device::DeviceCounts& e = eager.last_step[c];
      const device::DeviceCounts& p = pulls.last_step[c];
      EXPECT_EQ(g.graph_launches, 1u) << "card " << c;  // "sparse lookup"
      // Outside its graph: the check into the pinned slot the card's counter picks, one kernel
      // (LateReadback::copy_on_card; inside a composed step it joins the step's graph).
      EXPECT_EQ(g.launches, 1u) << "card " << c;
      EXPECT_EQ(g.collectives + g.card_copies + g.host_syncs + g.allocations, 0u) << "card " << c;
      EXPECT_EQ(g.pinned_copies, 0u) << "card " << c;
      // Eagerly: the keys out and the records back (sharded), nothing (replicated); every node
      // a launch or a collective. The pull's graph also plans the owner merge (4 nodes; on 1
      // card 3) and, replicated, all-gathers the keys.
      EXPECT_EQ(e.collectives, replicated() ? 0u : 2u) << "card " << c;
      EXPECT_EQ(g.graph_nodes + 1, e.launches + e.collectives + e.card_copies) << "card " << c;
      EXPECT_EQ(g.graph_nodes + (cards == 1 ? 3u : 4u) + (replicated() ? 1u : 0u), p.graph_nodes)
          << "card " << c;
    }
  }
}

// adam_bias_correction per_table: a padded step advances the table's step inside its push
// graph (replayed, not captured once), as an unpadded one does eagerly: the rows are the same
// bits, and every card counted every step (the unpadded steps are held to the float64-merged
// reference in heter_comm_test).
TEST_P(PaddedSteps, PerTableAdamStepsEqualUnpaddedStepsAndCountEveryStep) {
  const int cards = this->cards();
  GPUBOX_REQUIRE_CARDS(cards);
  table::AccessorConfig cfg = config();
  cfg.optimizer.kind = table::SparseOptimizerKind::kAdam;
  cfg.optimizer.bias_correction = table::AdamBiasCorrection::kPerTable;
  const table::RowLayout layout = table::RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  const Data data = make_data(cards, layout.push_dim(), placement());
  const RunResult want =
      run(cards, placement(), Mode::kUnpadded, data, nullptr, -1, 0, Use::kTrain, cfg);
  for (const Mode mode : {Mode::kPaddedEager, Mode::kPaddedGraphs}) {
    SCOPED_TRACE(mode == Mode::kPaddedGraphs ? "step graphs" : "eagerly");
    const RunResult got = run(cards, placement(), mode, data, nullptr, -1, 0, Use::kTrain, cfg);
    for (int c = 0; c < cards; ++c) {
      EXPECT_TRUE(same_bits(got.rows[c], want.rows[c])) << "card " << c;
      EXPECT_EQ(got.table_steps[c], kSteps) << "card " << c;
      EXPECT_EQ(want.table_steps[c], kSteps) << "card " << c;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cards, PaddedSteps,
                         ::testing::Combine(::testing::Values(1, 2, 4),
                                            ::testing::Values(Placement::kSharded,
                                                              Placement::kReplicated)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "cards_" +
                                  (std::get<1>(info.param) == Placement::kSharded ? "sharded"
                                                                                  : "replicated");
                         });

}  // namespace
}  // namespace gpubox::heter_comm::padded_test
