// Collective mode's placement (every card a replica of the whole table) against gpubox mode's
// (each key on its owner card) on the same cards and batches: byte-identical rows and replicas,
// and what a training step asks of each card in each.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/heter_comm/heter_comm.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/heterps/heter_comm/heter_comm_test_util.cuh"

namespace gpubox::heter_comm {
namespace {

using cluster_test::Batch;
using cluster_test::BatchMaker;
using cluster_test::Cluster;
using cluster_test::ClusterCase;
using cluster_test::pull_push_step;
using cluster_test::same_bytes;
using cluster_test::store_rows;
using cluster_test::test_config;
using table::AccessorConfig;
using table::RowLayout;
using table::SparseOptimizerKind;

// Collective mode's placement against gpubox mode's on the same C cards and batches: the merged
// gradient of a key is summed in the same order (by position inside a card, by source rank
// across cards) and gets one optimizer step per batch in both, so every pulled record and every
// replica's row equals the sharded owner's row byte for byte (not only within the float64
// reference's tolerance), and the replicas are byte-identical. Rows are created on first touch
// from the key and the seed, so a card that meets a key only through the exchange creates the
// same row.
class ReplicatedPlacementTest : public ::testing::TestWithParam<ClusterCase> {};

TEST_P(ReplicatedPlacementTest, ReplicasAreIdenticalAndEqualTheShardedOwners) {
  const ClusterCase param = GetParam();
  GPUBOX_REQUIRE_CARDS(param.cards);
  AccessorConfig cfg = test_config(param.kind);
  if (param.per_table) cfg.optimizer.bias_correction = table::AdamBiasCorrection::kPerTable;
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  card_table::HashTableOptions table_options;
  table_options.initial_capacity = 64;  // the stores grow during the run
  HeterCommOptions replicated;
  replicated.placement = Placement::kReplicated;
  Cluster sharded_cluster(param.cards, cfg, {}, table_options);
  Cluster replicated_cluster(param.cards, cfg, replicated, table_options);
  BatchMaker maker(/*seed=*/77, layout.push_dim());
  std::mt19937_64 sizes(5);
  for (int step = 0; step < 8; ++step) {
    std::vector<Batch> batches(param.cards);
    for (int c = 0; c < param.cards; ++c) {
      std::size_t n = 1 + sizes() % 300;  // sizes 0, 1 and a few hundred
      if (step == 2 || (c + step) % 4 == 3) n = 0;
      if ((c + step) % 5 == 4) n = 1;
      batches[c] = maker.make(n);
    }
    const bool reuse_pull = step % 2 == 1;
    const auto want = pull_push_step(sharded_cluster, batches, reuse_pull);
    const auto got = pull_push_step(replicated_cluster, batches, reuse_pull);
    for (int c = 0; c < param.cards; ++c) {
      ASSERT_TRUE(same_bytes(got[c], want[c])) << "step " << step << " card " << c;
    }
  }
  std::map<uint64_t, std::vector<float>> owners;
  for (int c = 0; c < param.cards; ++c) {
    const auto rows = store_rows(sharded_cluster, c, layout);
    owners.insert(rows.begin(), rows.end());
  }
  ASSERT_GT(owners.size(), 100u);
  for (int c = 0; c < param.cards; ++c) {
    const auto replica = store_rows(replicated_cluster, c, layout);
    ASSERT_EQ(replica.size(), owners.size()) << "card " << c << " does not hold the whole table";
    for (const auto& [key, row] : owners) {
      auto it = replica.find(key);
      ASSERT_NE(it, replica.end()) << "card " << c << " lacks key " << key;
      ASSERT_TRUE(same_bytes(it->second, row)) << "card " << c << " key " << key;
    }
    EXPECT_EQ(replicated_cluster.heter_comm(c).table_steps(), param.per_table ? 8 : 0);
    // Every card created every row once (as the only owner does in the sharded placement).
    const HeterCommStats& stats = replicated_cluster.heter_comm(c).stats();
    EXPECT_EQ(stats.created_on_pull + stats.created_on_push, owners.size()) << "card " << c;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cards, ReplicatedPlacementTest,
    ::testing::Values(ClusterCase{1, SparseOptimizerKind::kAdagrad, "1card_adagrad"},
                      ClusterCase{2, SparseOptimizerKind::kAdam, "2cards_adam"},
                      ClusterCase{3, SparseOptimizerKind::kAdagrad, "3cards_adagrad"},
                      ClusterCase{4, SparseOptimizerKind::kSharedAdam, "4cards_shared_adam"},
                      ClusterCase{3, SparseOptimizerKind::kAdam, "3cards_adam_per_table",
                                  table::SparseStorage::kFp32, true}),
    [](const ::testing::TestParamInfo<ClusterCase>& info) { return std::string(info.param.name); });

// What a training step (pull + push_pulled) asks of each card, placement against placement,
// counted on the cards (device counters) and by HeterComm: the same 3 host waits (unplanned: the
// key counts, the owner lookups, the end of push_pulled); 3 collectives
// instead of 4 (no records travel back on the pull); bytes: every card's padded block of unique
// keys and summed records to every card, against keys to the owners, records back and summed
// records to the owners; and, once the buffers have grown, no card allocation in either.
TEST(HeterComm, ReplicatedStepCountsAgainstSharded) {
  GPUBOX_REQUIRE_CARDS(3);
  constexpr int kCards = 3;
  const AccessorConfig cfg = test_config(SparseOptimizerKind::kAdagrad);
  const RowLayout layout = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim);
  HeterCommOptions replicated;
  replicated.placement = Placement::kReplicated;
  BatchMaker maker(13, layout.push_dim());
  const std::vector<Batch> batches = {maker.make(300), maker.make(0), maker.make(120)};
  // Host-side oracle of the step's traffic.
  std::vector<std::set<uint64_t>> unique(kCards);
  for (int c = 0; c < kCards; ++c) unique[c].insert(batches[c].keys.begin(), batches[c].keys.end());
  std::size_t max_unique = 0;
  uint64_t sharded_bytes = 0;
  for (int c = 0; c < kCards; ++c) {
    max_unique = std::max(max_unique, unique[c].size());
    // Keys and summed records leave card c, and each key's pull record comes back (counted on
    // its owner).
    sharded_bytes += unique[c].size() *
                     (sizeof(uint64_t) + (layout.push_dim() + layout.pull_dim()) * sizeof(float));
  }
  const uint64_t replicated_bytes_per_card =
      kCards * max_unique * (sizeof(uint64_t) + layout.push_dim() * sizeof(float));

  struct StepCounts {
    std::vector<device::DeviceCounts> device;  // per card, the last step only
    std::vector<HeterCommStats> stats;         // per card, the last step's pull + push
  };
  auto run = [&](const HeterCommOptions& options) {
    Cluster cluster(kCards, cfg, options);
    StepCounts counts{std::vector<device::DeviceCounts>(kCards),
                      std::vector<HeterCommStats>(kCards)};
    for (int step = 0; step < 4; ++step) {
      cluster.run([&](device::Card& card) {
        const int c = card.local_index();
        HeterComm& hc = cluster.heter_comm(c);
        auto keys = device::to_device(batches[c].keys, card.memory(), card.stream());
        auto grads = device::to_device(batches[c].grads, card.memory(), card.stream());
        auto out = card.make_buffer<float>(batches[c].keys.size() * hc.pull_dim());
        card.stream().synchronize();
        const device::DeviceCounts before = card.counts();
        hc.pull(keys.data(), batches[c].keys.size(), out.data(), card.stream());
        HeterCommStats step_stats = hc.last_step();
        hc.push_pulled(grads.data(), card.stream());
        const device::DeviceCounts after = card.counts();
        step_stats.bytes_sent += hc.last_step().bytes_sent;
        step_stats.merged_updates = hc.last_step().merged_updates;
        counts.device[c].host_syncs = after.host_syncs - before.host_syncs;
        counts.device[c].collectives = after.collectives - before.collectives;
        counts.device[c].allocations = after.allocations - before.allocations;
        counts.stats[c] = step_stats;
      });
    }
    return counts;
  };
  const StepCounts sharded = run({});
  const StepCounts repl = run(replicated);
  uint64_t sharded_total = 0;
  std::size_t sharded_updates = 0;
  std::set<uint64_t> all_keys;
  for (const auto& u : unique) all_keys.insert(u.begin(), u.end());
  for (int c = 0; c < kCards; ++c) {
    EXPECT_EQ(sharded.device[c].host_syncs, 3u) << "card " << c;
    EXPECT_EQ(repl.device[c].host_syncs, 3u) << "card " << c;
    EXPECT_EQ(sharded.device[c].collectives, 4u) << "card " << c;
    EXPECT_EQ(repl.device[c].collectives, 3u) << "card " << c;
    EXPECT_EQ(sharded.device[c].allocations, 0u) << "card " << c;
    EXPECT_EQ(repl.device[c].allocations, 0u) << "card " << c;
    EXPECT_EQ(repl.stats[c].bytes_sent, replicated_bytes_per_card) << "card " << c;
    sharded_total += sharded.stats[c].bytes_sent;
    sharded_updates += sharded.stats[c].merged_updates;
    // Each replica applies one step per distinct key of the job's batch; the owners share them.
    EXPECT_EQ(repl.stats[c].merged_updates, all_keys.size()) << "card " << c;
  }
  EXPECT_EQ(sharded_total, sharded_bytes);
  EXPECT_EQ(sharded_updates, all_keys.size());
}

}  // namespace
}  // namespace gpubox::heter_comm
