// What HeterComm's padded steps refuse or reserve, on 1, 2 and 4 simulated cards, sharded and
// replicated (the data and runs of heter_comm_padded_test.cu, whose steps this binary shares):
//   - a plan that does not describe a batch, or a key missing on its owner (in a pull or a
//     pull_only), still fails late, naming the step (and the key's owner and requesting card);
//   - a padded pass reserves only its blocks, sized by placement, and its steps raise no
//     high-water mark of the card's memory;
//   - a planned step of a padded pass without its count on the card, or a plan of the other
//     placement's width, is refused before the step.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "heterps/card_table/card_store.cuh"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/card.hpp"
#include "heterps/heter_comm/heter_comm.hpp"
#include "table/sparse_row/accessor.hpp"
#include "tests/common/hang_watchdog.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/heterps/heter_comm/heter_comm_padded_test_util.cuh"

namespace gpubox::heter_comm::padded_test {
namespace {

using table::AccessorConfig;
using table::RowLayout;

// A failing run must end (its error, the group's abort, the unwinding), not hang: on one GPU a
// wrong plan's run hung in NCCL's abort, which waited for the step graphs the failing card had
// yet to destroy (nccl_communicator.hpp). A run takes about 2 s on a GPU, well under a second on
// the cpu; past the bound the binary aborts naming the run.
constexpr std::chrono::seconds kFailingRunBound{20};
// The failing runs' collective timeout, under the bound: a wait of the engine's that does not end
// fails with its own message (naming the wait and the collective) before the watchdog fires. It
// bounds the group's NCCL init and the good steps before the failing one too, which with several
// GPUs under ctest -j2 may take seconds: 10 s, not 5.
constexpr std::chrono::seconds kFailingRunTimeout{10};

std::string failing_run(const char* what, int cards, Placement placement) {
  return ::gpubox::detail::concat(what, "'s failing run on ", cards, " cards (",
                                  placement == Placement::kReplicated ? "replicated" : "sharded",
                                  "): its error, the group's abort and the unwinding");
}

TEST_P(PaddedSteps, AWrongPlanStillFailsLateNamingTheStep) {
  const int cards = this->cards();
  GPUBOX_REQUIRE_CARDS(cards);
  const Data data = this->data();
  // Step 3's plan says card 0 sends one key fewer to the last card (1 card: to itself;
  // replicated: to every card) than its batch has: its late check finds its row unlike the plan.
  std::vector<uint64_t> wrong = data.plan[3];
  const std::size_t entry = replicated() ? 0 : static_cast<std::size_t>(cards - 1);
  ASSERT_GT(wrong[entry], 0u);
  --wrong[entry];
  std::string message;
  try {
    const ::gpubox::testing::HangWatchdog watchdog(failing_run("a wrong plan", cards, placement()),
                                                   kFailingRunBound);
    run(cards, placement(), Mode::kPaddedGraphs, data, &wrong, 3, 0, Use::kTrain, config(),
        kFailingRunTimeout);
  } catch (const Error& e) {
    message = e.what();
  }
  ASSERT_FALSE(message.empty()) << "a wrong plan went unnoticed";
  EXPECT_NE(message.find("pass 2, step 3: "), std::string::npos) << message;
  EXPECT_NE(message.find("plan does not describe"), std::string::npos) << message;
}

TEST_P(PaddedSteps, AMissingKeyFailsLateNamingItsOwnerAndStep) {
  const int cards = this->cards();
  GPUBOX_REQUIRE_CARDS(cards);
  const Data data = this->data();
  const uint64_t absent = universe()[0];  // the hottest key: in the first step's batches
  std::string message;
  try {
    const ::gpubox::testing::HangWatchdog watchdog(failing_run("a missing key", cards, placement()),
                                                   kFailingRunBound);
    run(cards, placement(), Mode::kPaddedGraphs, data, nullptr, -1, absent, Use::kTrain, config(),
        kFailingRunTimeout);
  } catch (const Error& e) {
    message = e.what();
  }
  ASSERT_FALSE(message.empty()) << "the missing key went unnoticed";
  // Replicated: every replica misses it (any card may be the first to fail).
  const std::string where = replicated() ? " is missing on the replica of card "
                                         : " is missing on its owner card " +
                                               std::to_string(owner_card(absent, cards)) +
                                               " (requested by card ";
  EXPECT_NE(message.find("pass 2, step 0: HeterComm pull: key " + std::to_string(absent) + where),
            std::string::npos)
      << message;
}

// A key missing in a pull_only step fails late as a pull's does, naming its step, the card that
// holds no row for it and the card whose batch asked for it (replicated: the card itself, whose
// own block is all it looks up). The key: one that only the last card's batches hold.
TEST_P(PaddedSteps, AKeyMissingInAPullOnlyFailsLateNamingTheRequestingCard) {
  const int cards = this->cards();
  GPUBOX_REQUIRE_CARDS(cards);
  const Data data = this->data();
  const int last = cards - 1;
  uint64_t absent = 0;
  int first_step = -1;
  for (uint64_t key : universe()) {
    if (key == 0) continue;
    int in_last = -1;
    bool elsewhere = false;
    for (int s = 0; s < kSteps; ++s) {
      for (int c = 0; c < cards; ++c) {
        const auto& batch = data.keys[s][c];
        if (std::find(batch.begin(), batch.end(), key) == batch.end()) continue;
        if (c != last) elsewhere = true;
        if (c == last && in_last < 0) in_last = s;
      }
    }
    if (in_last >= 0 && !elsewhere) {
      absent = key;
      first_step = in_last;
      break;
    }
  }
  ASSERT_NE(absent, 0u) << "no key only the last card's batches hold";
  std::string message;
  try {
    const ::gpubox::testing::HangWatchdog watchdog(
        failing_run("a key missing in a pull_only", cards, placement()), kFailingRunBound);
    run(cards, placement(), Mode::kPaddedGraphs, data, nullptr, -1, absent, Use::kPullOnly,
        config(), kFailingRunTimeout);
  } catch (const Error& e) {
    message = e.what();
  }
  const std::string holder =
      replicated() ? " is missing on the replica of card " + std::to_string(last)
                   : " is missing on its owner card " + std::to_string(owner_card(absent, cards));
  EXPECT_NE(message.find("pass 2, step " + std::to_string(first_step) + ": HeterComm pull: key " +
                         std::to_string(absent) + holder + " (requested by card " +
                         std::to_string(last) + ";"),
            std::string::npos)
      << message;
}

// The padded steps' buffers in bytes (the formula reserve_padded sizes by): `block` keys per pair
// of cards, `slots` = cards * block received, the batch's `occurrences` positions. Sharded: keys
// to every owner, the pull records of every slot back, the push records by slot (and one discard
// row per unique index). Replicated: one key block to every card, the pull records of its own
// block only, its one push block out and every card's in.
std::size_t padded_bytes(int cards, Placement placement, const StepBounds& bounds,
                         std::size_t pull_dim, std::size_t push_dim, bool before_issue_31 = false) {
  const bool replicated = placement == Placement::kReplicated;
  const std::size_t c = static_cast<std::size_t>(cards);
  const std::size_t block = bounds.pair_block;
  const std::size_t slots = c * block;
  const std::size_t occurrences = bounds.occurrences;
  const std::size_t widest = std::max(pull_dim, push_dim);
  std::size_t recv_records =
      replicated ? std::max(block * pull_dim, slots * push_dim) : slots * widest;
  std::size_t send_records = replicated
                                 ? (block + occurrences) * push_dim
                                 : std::max(slots * pull_dim, (slots + occurrences) * push_dim);
  if (before_issue_31) {  // both placements sized as the sharded one's widest
    recv_records = slots * widest;
    send_records = (slots + occurrences) * widest;
  }
  const std::size_t keys = ((replicated ? 1 : c) + c) * (block + 1) + slots;
  return keys * sizeof(uint64_t) + 2 * slots * sizeof(card_table::row_index_t) +
         (recv_records + send_records + slots * push_dim) * sizeof(float) +
         occurrences * sizeof(uint32_t);
}

// Collective mode reserves what its padded steps use and nothing else (issue 31): the padded
// blocks sized by placement, none of the unpadded steps' buffers (replicated, those scale with
// every card's distinct keys: cards * block keys and push records, and the received keys' records,
// rows and merge), and the steps raise no high-water mark of the card's memory.
TEST_P(PaddedSteps, APaddedPassReservesOnlyItsBlocksSizedByPlacement) {
  const int cards = this->cards();
  GPUBOX_REQUIRE_CARDS(cards);
  const Data data = this->data();
  const RowLayout layout = RowLayout::make(config().optimizer.kind, config().mf_dim);
  const auto pull_dim = static_cast<std::size_t>(layout.pull_dim());
  const auto push_dim = static_cast<std::size_t>(layout.push_dim());
  const RunResult padded = run(cards, placement(), Mode::kPaddedGraphs, data);
  const RunResult unpadded = run(cards, placement(), Mode::kUnpadded, data);
  const std::size_t want = padded_bytes(cards, placement(), data.bounds, pull_dim, push_dim);
  const std::size_t was = padded_bytes(cards, placement(), data.bounds, pull_dim, push_dim, true);
  for (int c = 0; c < cards; ++c) {
    SCOPED_TRACE("card " + std::to_string(c));
    EXPECT_EQ(padded.memory[c].padded, want);
    EXPECT_EQ(padded.memory[c].unpadded, 0u);  // was reserved besides, as the unpadded run does
    EXPECT_GT(unpadded.memory[c].unpadded, 0u);
    EXPECT_EQ(unpadded.memory[c].padded, 0u);
    // The card memory reserve_steps took (the device layer's counter) holds the blocks, besides
    // what both kinds of step share (the local dedup, the owner merge, the reducer, the scratch
    // arena, the steps' own buffers here).
    EXPECT_GE(padded.in_use_reserved[c] - padded.in_use_before[c], want);
    // No step grew anything, nor raised the card's high-water mark.
    EXPECT_EQ(padded.in_use_after[c], padded.in_use_reserved[c]);
    EXPECT_EQ(padded.peak_after[c], padded.peak_reserved[c]);
  }
  if (replicated() && cards > 1) {
    EXPECT_LT(want, was);  // the records' buffers: (block + occurrences) * push_dim, not slots
  }
  std::printf(
      "[ memory   ] %d cards %s: padded blocks %zu bytes (sized as before: %zu), unpadded "
      "buffers not reserved: %zu bytes\n",
      cards, replicated() ? "replicated" : "sharded", want, was, unpadded.memory[0].unpadded);
}

// A padded pass sizes only its blocks: a planned step that does not give its occurrence count on
// the card would run unpadded in buffers nobody sized (growing them while the previous step's
// collectives may run), so it is refused; with padded steps off the same plan is taken.
TEST(PlannedCountsWidth, APaddedPassRefusesAPlannedStepWithoutItsCountOnTheCard) {
  const AccessorConfig cfg = config();
  device::CardSet set = device::CardSet::from_list("0");
  auto group = comm::make_group(set, std::chrono::seconds(60));
  std::vector<uint64_t> plan(1, 2);
  for (const bool padded : {true, false}) {
    HeterCommOptions options;
    options.missing_keys = MissingKeyPolicy::kFail;
    options.padded_steps = padded;
    std::string message;
    set.run_on_cards([&](device::Card& card) {
      card_table::CardSparseStore store(card, cfg);
      HeterComm hc(card, store, group->at(0), options);
      StepBounds bounds;
      bounds.occurrences = 4;
      bounds.unique = 2;
      bounds.received = 2;
      bounds.pair_block = 2;
      hc.reserve_steps(bounds);
      try {
        hc.plan_next_step({plan.data(), 1u});
      } catch (const Error& e) {
        message = e.what();
      }
    });
    if (padded) {
      EXPECT_NE(message.find("HeterComm on card 0: a planned step of a padded pass needs its "
                             "occurrence count (n_on_card)"),
                std::string::npos)
          << message;
    } else {
      EXPECT_TRUE(message.empty()) << message;
    }
  }
}

// A plan whose width is not the placement's is refused before the step (the trainer reads the
// Collective flag in two places to make the plan and the placement).
TEST(PlannedCountsWidth, APlanForTheOtherPlacementIsRefusedNamingBothWidths) {
  GPUBOX_REQUIRE_CARDS(2);
  const AccessorConfig cfg = config();
  device::CardSet set = device::CardSet::from_list("0,1");
  auto group = comm::make_group(set, std::chrono::seconds(60));
  std::vector<uint64_t> plan(4, 1);
  std::vector<std::string> messages(2);
  for (const Placement placement : {Placement::kSharded, Placement::kReplicated}) {
    HeterCommOptions options;
    options.missing_keys = MissingKeyPolicy::kFail;
    options.placement = placement;
    const bool replicated = placement == Placement::kReplicated;
    set.run_on_cards([&](device::Card& card) {
      const int c = card.local_index();
      card_table::CardSparseStore store(card, cfg);
      HeterComm hc(card, store, group->at(c), options);
      hc.plan_next_step({plan.data(), replicated ? 1u : 2u});  // the placement's own: taken
      try {
        hc.plan_next_step({plan.data(), replicated ? 2u : 1u});
      } catch (const Error& e) {
        messages[c] = e.what();
      }
    });
    for (int c = 0; c < 2; ++c) {
      const std::string& m = messages[c];
      ASSERT_FALSE(m.empty()) << "card " << c << " took a plan for the other placement";
      EXPECT_NE(m.find("HeterComm on card " + std::to_string(c) + ": a step plan of " +
                       (replicated ? "2" : "1") + " counts per card"),
                std::string::npos)
          << m;
      EXPECT_NE(m.find(replicated ? "replicated placement (Collective mode) takes 1"
                                  : "sharded placement takes one per owner card (2)"),
                std::string::npos)
          << m;
      messages[c].clear();
    }
  }
}

}  // namespace
}  // namespace gpubox::heter_comm::padded_test
