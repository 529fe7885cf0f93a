// Placement and the card tier's plan: replicated passes (Collective mode) against sharded ones
// and a replica over the budget; the plan from the stores' real capacities, and the next pass's
// card work's share of it (card and pinned bytes). Peak card memory under a budget:
// pass_manager_memory_test.cu.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "heterps/card_table/card_store.hpp"
#include "heterps/pass/chunk_pacer.hpp"
#include "heterps/pass/next_pass_work.hpp"
#include "heterps/pass/pass_manager.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/heterps/pass/pass_manager_test_util.cuh"
#include "tests/table/slot_dims_config.hpp"

namespace gpubox::pass {
namespace {

using pass_test::Engine;
using pass_test::make_passes;
using pass_test::row_diff;
using pass_test::rows_equal;

// Collective mode's placement: every card holds every key of every pass, the replicas stay
// identical, the host tier gets one replica's dirty rows (the same count as the sharded owners
// write) and ends bit-identical to the sharded run's (same merges in the same order:
// heter_comm.hpp).
TEST(PassManager, ReplicatedPassesMatchShardedAndWriteBackOneReplica) {
  GPUBOX_REQUIRE_CARDS(3);
  PassManagerOptions sharded_options;
  PassManagerOptions replicated_options;
  replicated_options.placement = heter_comm::Placement::kReplicated;
  Engine sharded(3, sharded_options);
  Engine replicated(3, replicated_options);
  const auto passes = make_passes(4, 120, /*seed=*/8);
  std::set<uint64_t> seen;
  for (std::size_t p = 0; p < passes.size(); ++p) {
    const PassStats want_begin = sharded.manager->begin_pass(passes[p]);
    const PassStats got_begin = replicated.manager->begin_pass(passes[p]);
    seen.insert(passes[p].begin(), passes[p].end());
    EXPECT_EQ(got_begin.keys_in_pass, 3 * passes[p].size()) << "pass " << p;
    EXPECT_EQ(got_begin.rows_on_cards, 3 * seen.size()) << "pass " << p << ": nothing evicted";
    EXPECT_EQ(got_begin.created, want_begin.created) << "pass " << p << ": each new row once";
    sharded.train(passes[p], p + 1, 3);
    replicated.train(passes[p], p + 1, 3);
    const PassStats want_end = sharded.manager->end_pass();
    const PassStats got_end = replicated.manager->end_pass();
    EXPECT_EQ(got_end.written_back, want_end.written_back) << "pass " << p;
    const auto want_rows = sharded.host_rows();
    const auto got_rows = replicated.host_rows();
    ASSERT_EQ(got_rows.size(), want_rows.size()) << "pass " << p;
    for (const auto& [key, row] : want_rows) {
      ASSERT_TRUE(rows_equal(got_rows.at(key), row))
          << "pass " << p << " key " << key << ": " << row_diff(got_rows.at(key), row);
    }
    const auto cards = replicated.card_rows();  // checks the replicas against each other
    EXPECT_EQ(cards.size(), seen.size());
    for (const auto& [key, row] : cards) EXPECT_TRUE(rows_equal(row, want_rows.at(key))) << key;
  }
}

// A replica is the whole table: when the table outgrows the card budget, begin_pass fails with
// the table's size in rows and bytes (nothing is evicted), before it pulls anything.
TEST(PassManager, ReplicatedTableOverBudgetFailsWithItsSize) {
  GPUBOX_REQUIRE_CARDS(2);
  PassManagerOptions options;
  options.card_row_budget = 150;
  options.placement = heter_comm::Placement::kReplicated;
  Engine engine(2, options);
  std::vector<uint64_t> first;
  std::vector<uint64_t> second;
  for (uint64_t k = 1; k <= 100; ++k) first.push_back(mix64(k));
  for (uint64_t k = 101; k <= 200; ++k) second.push_back(mix64(k));
  engine.manager->begin_pass(first);  // 100 rows per card: fits
  engine.manager->end_pass();
  try {
    engine.manager->begin_pass(second);  // 200 rows per card: over the budget
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    const std::string bytes = std::to_string(engine.manager->plan_for(200).total_bytes());
    EXPECT_NE(what.find("whole embedding table on every card"), std::string::npos) << what;
    EXPECT_NE(what.find("grown to 200 rows (" + bytes + " bytes"), std::string::npos) << what;
    EXPECT_NE(what.find("budget holds 150 rows"), std::string::npos) << what;
    EXPECT_NE(what.find("runner.card_memory_mb"), std::string::npos) << what;
  }
  EXPECT_EQ(engine.host_rows().size(), 100u) << "nothing pulled for a table that cannot fit";
}

TEST(PassManager, MemoryBudgetPlansFromRealCapacities) {
  PassManagerOptions options;
  Engine probe(1, options);
  const CardTierPlan plan = probe.manager->plan_for(1000);
  const card_table::CardSparseStore& store = *probe.stores[0];
  // Slots at their real power of two (1000 / 0.6 -> 2048), rows in whole pages.
  EXPECT_EQ(plan.table_bytes, 2048u * 16);
  EXPECT_EQ(plan.row_page_bytes, store.page_bytes());
  EXPECT_EQ(plan.row_bytes, store.bytes_per_row());
  EXPECT_GT(plan.bytes_per_key(), store.bytes_per_row() + 27.0);
  EXPECT_NE(plan.to_string().find("1000 rows"), std::string::npos) << plan.to_string();
  // Without a budget the line says so and gives the per-key cost at the worst table fill.
  EXPECT_NE(probe.manager->plan().to_string().find("no budget"), std::string::npos);
  EXPECT_GE(probe.manager->plan().table_bytes, 53u);
  // A byte budget becomes the most rows whose footprint fits.
  options.card_memory_bytes = plan.total_bytes();
  Engine engine(1, options);
  EXPECT_EQ(engine.manager->row_budget(), 1000u);
  EXPECT_EQ(engine.manager->plan().total_bytes(), plan.total_bytes());
  // The store was sized for the budget up front: its table already has the planned slots.
  EXPECT_EQ(engine.stores[0]->table().capacity(), 2048u);
  options.card_memory_bytes = 100;
  EXPECT_THROW(Engine(1, options), Error);
}

// The next pass's card work's scratch is a small part of a budget's plan, whatever the budget:
// with the default chunk of 131072 keys capped by the rows, at most a twentieth of the plan and
// under 6 bytes a row (less than the kept listing's 12). Before the cap was a sixteenth of the
// rows and at least 4096 keys, with list regions of 8 slots a key and insert regions of a chunk:
// 1.1 MiB or more (a quarter of a 32768-row plan), 17 bytes a row above 65536 rows. Its pinned
// host memory is outside the plan's total, at most about 49 MiB a card (the user guide's figure).
TEST(PassManager, NextPassScratchIsASmallPartOfEveryBudget) {
  PassManagerOptions options;
  options.next_pass_chunk_keys = 131072;
  Engine probe(1, options);
  for (const std::size_t rows : {16384u, 32768u, 65536u, 300000u, 2000000u, 10000000u}) {
    SCOPED_TRACE(rows);
    const CardTierPlan plan = probe.manager->plan_for(rows);
    EXPECT_GT(plan.next_pass_bytes, 0u) << "the work runs under a budget";
    EXPECT_LE(plan.next_pass_bytes, plan.total_bytes() / 20) << plan.to_string();
    EXPECT_LT(plan.next_pass_bytes, 6 * rows) << plan.to_string();
    // Its pinned host memory, about as much, is shown beside the card's total, not in it.
    EXPECT_GT(plan.next_pass_pinned_bytes, 0u);
    EXPECT_EQ(plan.total_bytes(), plan.row_page_bytes + plan.table_bytes + plan.index_bytes +
                                      plan.working_bytes + plan.kept_bytes + plan.next_pass_bytes);
    EXPECT_NE(plan.to_string().find("next pass's card work pins "), std::string::npos)
        << plan.to_string();
    // The user guide's bound, at rows of 14 floats: up to about 49 MiB a card.
    EXPECT_LE(plan.next_pass_pinned_bytes, std::size_t{49} << 20) << plan.to_string();
  }
  // From 64 x 131072 rows (8.4 million) the chunk is the default one whole and its pinned memory
  // at that bound, more than its card bytes (its list regions pin 272 bytes a chunk key): 48.5
  // MiB, the same under any larger budget.
  const CardTierPlan largest = probe.manager->plan_for(10000000);
  EXPECT_EQ(largest.row_bytes, 14 * sizeof(float)) << "the bound's rows";
  EXPECT_GT(largest.next_pass_pinned_bytes, std::size_t{48} << 20) << largest.to_string();
  EXPECT_GT(largest.next_pass_pinned_bytes, largest.next_pass_bytes);
  EXPECT_EQ(probe.manager->plan_for(40000000).next_pass_pinned_bytes,
            largest.next_pass_pinned_bytes);
  // Without a budget the chunk is next_pass_chunk_keys whole: its readbacks' pinned memory is
  // about 14.5 MiB a card at rows of 14 floats (look-ups of 5 chunks, 12 bytes a key, and two
  // insert regions of a page of 65536 rows), in the plan's line too.
  const CardTierPlan unbudgeted = probe.manager->plan();
  EXPECT_GT(unbudgeted.next_pass_pinned_bytes, std::size_t{14} << 20);
  EXPECT_NE(unbudgeted.to_string().find("next pass's card work pins "), std::string::npos)
      << unbudgeted.to_string();
  options.next_pass_chunk_keys = 0;
  EXPECT_EQ(Engine(1, options).manager->plan().next_pass_pinned_bytes, 0u) << "the work is off";
}

// The next pass's card work's pinned host memory counts in the host budget
// (PassManagerOptions::host_memory_bytes: runner.host_memory_mb with an in-process host table):
// the plan's term against a hand-computed oracle (no card budget, chunks of 1000 keys: look-ups
// of kDepth chunks, a key and a row index each; an erase check and a failed count a chunk slot;
// two insert regions of 1000 records), and the host table's share at the edge budgets of two
// cards: exactly enough (the table's least, host_table_min_bytes, left for it), one byte short
// (refused when the plan is made, naming the key, the need, the cards and the least budget in
// MiB: the need's and the table's, each rounded up), and the work off (the whole budget the
// table's).
TEST(PassManager, PinnedHostMemoryCountsInTheHostBudget) {
  GPUBOX_REQUIRE_CARDS(2);
  PassManagerOptions options;
  options.next_pass_chunk_keys = 1000;
  Engine probe(2, options);
  const std::size_t depth = ChunkChain::kDepth;
  const std::size_t stride = probe.stores[0]->record_stride();
  ASSERT_GE(probe.stores[0]->page_rows(), 1000u) << "the insert regions are a chunk's";
  const std::size_t per_card = 1000 * depth * (sizeof(uint64_t) + sizeof(card_table::row_index_t)) +
                               depth * (sizeof(card_table::ErasePresentCheck) + sizeof(uint32_t)) +
                               2 * 1000 * stride * sizeof(float);
  EXPECT_EQ(probe.manager->plan().next_pass_pinned_bytes, per_card);
  EXPECT_EQ(probe.manager->plan().host_table_bytes(), 0u) << "no host budget";
  EXPECT_NE(probe.manager->plan().to_string().find("no host budget counts it"), std::string::npos);
  const std::size_t table_least = options.host_table_min_bytes;
  ASSERT_EQ(table_least, std::size_t{1} << 20) << "the default: 1 MiB";
  options.host_memory_bytes = 2 * per_card + table_least;
  const Engine enough(2, options);
  EXPECT_EQ(enough.manager->plan().pinned_host_bytes(), 2 * per_card);
  EXPECT_EQ(enough.manager->plan().host_table_bytes(), table_least);
  EXPECT_NE(enough.manager->plan().to_string().find("inside runner.host_memory_mb: 2 card(s)"),
            std::string::npos)
      << enough.manager->plan().to_string();
  options.host_memory_bytes = 2 * per_card + table_least - 1;
  try {
    const Engine short_by_a_byte(2, options);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("runner.host_memory_mb (" + std::to_string(options.host_memory_bytes) +
                        " bytes) leaves the host table less than the 1048576 bytes it needs"),
              std::string::npos)
        << what;
    const std::size_t least_mib = (2 * per_card + (1 << 20) - 1) / (1 << 20) + 1;
    EXPECT_NE(what.find("at least " + std::to_string(least_mib) + " MiB"), std::string::npos)
        << what;
    EXPECT_NE(what.find("pins " + std::to_string(per_card) + " bytes of host memory on each of 2"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("runner.next_pass_chunk_keys"), std::string::npos) << what;
  }
  options.next_pass_chunk_keys = 0;
  EXPECT_EQ(Engine(2, options).manager->plan().host_table_bytes(), options.host_memory_bytes);
  // Nothing pinned: the budget is the table's whatever it is (its own least is the table's
  // business then, as without a card tier).
  options.host_memory_bytes = 1000;
  EXPECT_EQ(Engine(2, options).manager->plan().host_table_bytes(), 1000u);
}

// The check whether the next pass's card work can run made without a store (the trainer's, to
// skip CardTier::plan_ahead's store when it cannot: nothing would be pinned) agrees with the
// plan's pinned term: on with chunks of 1000, off with chunks of 0, in Collective mode
// (replicated) and with width classes; off with several trainers (more cards than local).
TEST(PassManager, WhetherTheWorkCanRunIsKnownWithoutAStore) {
  GPUBOX_REQUIRE_CARDS(2);
  const table::AccessorConfig one_width = pass_test::test_config();
  const table::AccessorConfig widths = table::with_slot_dims(one_width, {{1, 16}});
  struct Case {
    const char* name;
    std::size_t chunk;
    heter_comm::Placement placement;
    const table::AccessorConfig* cfg;
    bool on;
  };
  for (const Case& c :
       {Case{"on", 1000, heter_comm::Placement::kSharded, &one_width, true},
        Case{"chunk 0", 0, heter_comm::Placement::kSharded, &one_width, false},
        Case{"replicated", 1000, heter_comm::Placement::kReplicated, &one_width, false},
        Case{"width classes", 1000, heter_comm::Placement::kSharded, &widths, false}}) {
    SCOPED_TRACE(c.name);
    PassManagerOptions options;
    options.next_pass_chunk_keys = c.chunk;
    options.placement = c.placement;
    const Engine engine(2, options, nullptr, {}, *c.cfg);
    const int32_t pools = table::width_classes(*c.cfg).count;
    EXPECT_EQ(next_pass_work_possible(options, pools, 2, 2), c.on);
    EXPECT_EQ(engine.manager->plan().next_pass_pinned_bytes > 0, c.on);
    EXPECT_FALSE(next_pass_work_possible(options, pools, 2, 4)) << "several trainers";
  }
}

}  // namespace
}  // namespace gpubox::pass
