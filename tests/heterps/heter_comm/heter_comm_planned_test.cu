// HeterComm's planned steps (plan_next_step, issue 31): a pull whose key counts come from the
// pass's plan gives the same records without a host wait, a wrong plan fails naming the plan and
// the step, and a key missing on its owner is reported late, naming the step of its pull.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/heter_comm/heter_comm.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/heterps/heter_comm/heter_comm_test_util.cuh"

namespace gpubox::heter_comm {
namespace {

using cluster_test::Cluster;
using cluster_test::place_on_owner;
using cluster_test::test_config;
using table::AccessorConfig;
using table::RowLayout;
using table::SparseOptimizerKind;

// plan_next_step (issue 31): a pull whose key counts come from the pass's plan gives the same
// records without a host wait (no count exchange, no wait for the owner's lookups: its checks
// are read late, by drain_checks here), and a plan that does not describe the batch fails,
// naming the plan and the step it happened in.
TEST(HeterComm, PlannedCountsSaveTheCountWaitAndAWrongPlanFails) {
  GPUBOX_REQUIRE_CARDS(2);
  const AccessorConfig cfg = test_config(SparseOptimizerKind::kAdagrad);
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  constexpr int kCards = 2;
  HeterCommOptions options;
  options.missing_keys = MissingKeyPolicy::kFail;  // the card tier's policy
  std::vector<uint64_t> known;
  for (uint64_t k = 1; k <= 40; ++k) known.push_back(mix64(k));
  Cluster cluster(kCards, cfg, options);
  cluster.run([&](device::Card& card) { place_on_owner(cluster, card, known, cfg, layout); });
  // Each card's batch (repeated keys) and the plan: [src][dst] distinct keys.
  std::vector<std::vector<uint64_t>> batches(kCards);
  std::vector<uint64_t> plan(kCards * kCards, 0);
  for (int c = 0; c < kCards; ++c) {
    for (int i = 0; i < 30; ++i) batches[c].push_back(known[(c * 11 + i * 7) % 23]);
    const std::set<uint64_t> distinct(batches[c].begin(), batches[c].end());
    for (uint64_t k : distinct) ++plan[c * kCards + owner_card(k, kCards)];
  }
  ASSERT_GT(plan[0], 0u);
  ASSERT_GT(plan[1], 0u);
  const auto pull_all = [&](const std::vector<uint64_t>* counts, std::vector<uint64_t>* syncs) {
    std::vector<std::vector<float>> out(kCards);
    cluster.run([&](device::Card& card) {
      const int c = card.local_index();
      HeterComm& hc = cluster.heter_comm(c);
      auto keys = device::to_device(batches[c], card.memory(), card.stream());
      auto records = card.make_buffer<float>(batches[c].size() * hc.pull_dim());
      cluster.comm(c).set_step(7, 3);  // the step context a late check names
      const uint64_t before = card.counts().host_syncs;
      if (counts != nullptr) hc.plan_next_step({counts->data(), kCards});
      hc.pull(keys.data(), batches[c].size(), records.data(), card.stream());
      (*syncs)[c] = card.counts().host_syncs - before;
      cluster.comm(c).set_step(-1, -1);
      hc.drain_checks();
      out[c] = device::to_host(records);
    });
    return out;
  };
  std::vector<uint64_t> exchanged(kCards), planned(kCards);
  const auto want = pull_all(nullptr, &exchanged);
  const auto got = pull_all(&plan, &planned);
  for (int c = 0; c < kCards; ++c) {
    EXPECT_EQ(got[c], want[c]) << "card " << c;
    EXPECT_EQ(exchanged[c], 2u) << "card " << c << ": the count wait and the lookups' wait";
    EXPECT_EQ(planned[c], 0u) << "card " << c << ": a planned pull waits for nothing";
  }
  // Card 1's row says one key more for card 0 and one fewer for card 1 (same total).
  std::vector<uint64_t> wrong = plan;
  ++wrong[1 * kCards + 0];
  --wrong[1 * kCards + 1];
  std::string message;
  try {
    pull_all(&wrong, &planned);
  } catch (const Error& e) {
    message = e.what();
  }
  // Card 1 finds its row wrong at its next wait; card 0, the owner the misrouted key reached,
  // may fail first on that key: either error names the plan.
  ASSERT_FALSE(message.empty()) << "a wrong plan went unnoticed";
  EXPECT_NE(message.find("plan does not describe"), std::string::npos) << message;
  EXPECT_NE(message.find("pass 7, step 3: "), std::string::npos) << message;
}

// Issue 31, item 2: a planned pull does not wait for its owner's lookups, so a key missing on its
// owner (missing_keys = fail: impossible when begin_pass placed the pass's keys) is found late:
// the step reads zeros for it and skips its update, and the error names the key, its owner, the
// requesting card and the pass and step of the pull, not of the step that noticed it: 4 steps
// later (the checks' ring) or at drain_checks.
TEST(HeterComm, APlannedPullReportsAMissingKeyLateNamingItsStep) {
  GPUBOX_REQUIRE_CARDS(2);
  constexpr int kCards = 2;
  const AccessorConfig cfg = test_config(SparseOptimizerKind::kAdagrad);
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  HeterCommOptions options;
  options.missing_keys = MissingKeyPolicy::kFail;
  std::vector<uint64_t> known;
  for (uint64_t k = 1; k <= 40; ++k) known.push_back(mix64(k));
  uint64_t absent = mix64(1000);
  while (owner_card(absent, kCards) != 0) absent = mix64(absent);
  const auto run = [&](bool drain_at_once) {
    Cluster cluster(kCards, cfg, options);
    cluster.run([&](device::Card& card) { place_on_owner(cluster, card, known, cfg, layout); });
    std::string message;
    std::vector<std::vector<float>> first_records(kCards);
    try {
      for (int step = 0; step < 6; ++step) {
        // Step 0: card 1's batch holds the absent key (owned by card 0).
        std::vector<std::vector<uint64_t>> batches(kCards);
        std::vector<uint64_t> plan(kCards * kCards, 0);
        for (int c = 0; c < kCards; ++c) {
          for (int i = 0; i < 12; ++i) batches[c].push_back(known[(c * 5 + i * 3 + step) % 40]);
          if (step == 0 && c == 1) batches[c].push_back(absent);
          const std::set<uint64_t> distinct(batches[c].begin(), batches[c].end());
          for (uint64_t k : distinct) ++plan[c * kCards + owner_card(k, kCards)];
        }
        cluster.run([&](device::Card& card) {
          const int c = card.local_index();
          HeterComm& hc = cluster.heter_comm(c);
          auto keys = device::to_device(batches[c], card.memory(), card.stream());
          auto records = card.make_buffer<float>(batches[c].size() * hc.pull_dim());
          auto grads =
              device::to_device(std::vector<float>(batches[c].size() * hc.push_dim(), 0.5f),
                                card.memory(), card.stream());
          cluster.comm(c).set_step(3, step);
          hc.plan_next_step({plan.data(), kCards});
          hc.pull(keys.data(), batches[c].size(), records.data(), card.stream());
          hc.push_pulled(grads.data(), card.stream());
          // The next step's buffers are allocated: the collectives' window closes first (device
          // rule 1; a trainer sizes them before the pass instead). The checks stay unread.
          card.stream().synchronize();
          if (step == 0) first_records[c] = device::to_host(records);
          if (drain_at_once) hc.drain_checks();
        });
      }
    } catch (const Error& e) {
      message = e.what();
    }
    // The absent key's pull record (card 1's last occurrence) read zeros.
    if (!first_records[1].empty()) {
      const std::size_t dim = static_cast<std::size_t>(layout.pull_dim());
      const std::vector<float> tail(first_records[1].end() - dim, first_records[1].end());
      EXPECT_EQ(tail, std::vector<float>(dim, 0.0f));
    }
    return message;
  };
  for (const bool drain_at_once : {true, false}) {
    const std::string message = run(drain_at_once);
    ASSERT_FALSE(message.empty()) << "the missing key went unnoticed";
    EXPECT_NE(message.find("pass 3, step 0: HeterComm pull: key " + std::to_string(absent) +
                           " is missing on its owner card 0 (requested by card 1"),
              std::string::npos)
        << message;
  }
}

}  // namespace
}  // namespace gpubox::heter_comm
