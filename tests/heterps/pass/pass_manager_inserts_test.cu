// The sizing of the next pass's inserts (PassManager::expect_next_pass / prepare_next_pass;
// issue 31, item 1: nothing grows between a pass's steps), on 1-2 simulated cards with the
// in-process host tier: no insert chunk grows a card's table or pool, inserts under a budget find
// the erased slots reclaimed at the boundary, and with several trainers nothing is sized for the
// work. Its faults: pass_manager_error_test.cu (the same binary).
//
// Oracle: an engine without the work (next_pass_chunk_keys 0) given the same passes, whose card
// rows, read through a dump of each card's table, must equal the working engine's as
// std::unordered_map key -> row after every begin_pass, and whose host tier must equal its row
// for row after every end_pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/hash.hpp"
#include "heterps/card_table/card_store.hpp"
#include "heterps/device/card.hpp"
#include "heterps/pass/pass_manager.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/heterps/pass/pass_manager_error_test_util.hpp"

namespace gpubox::pass {
namespace {

using error_test::chunked;
using error_test::pass_keys;
using error_test::Phase;
using error_test::poll_after;
using error_test::Rows;
using error_test::sorted;
using error_test::Tiers;
using error_test::TiersPair;

// Issue 31, item 1: no insert chunk grows a card's table or pool, in the first pass either. The
// next pass's keys are planned only after some steps (as the trainer's pipeline plans them while
// the pass trains), so expect_next_pass sizes each card, at the pass boundary, for as many
// inserts as the current pass found keys missing there (the first pass: all of its 240) and an
// eighth. A next pass of 240 fresh keys fits: every staged row goes in between the steps; one of
// 1600 does not: the inserts stop at the room there is, and begin_pass inserts the rest (before:
// the first insert chunk of each card waited twice and allocated 3 times to grow). With the next
// pass planned when the work is expected, each card is sized for its staged keys exactly. Either
// way: 0 waits and 0 allocations between the steps, and the rows of an engine without the work.
TEST(NextPassInserts, NeverGrowTheCardsBetweenSteps) {
  for (const int cards : {1, 2}) {
    for (const std::size_t next_keys : {std::size_t{240}, std::size_t{1600}}) {
      for (const bool planned_at_expect : {false, true}) {
        GPUBOX_REQUIRE_CARDS(cards);
        SCOPED_TRACE(std::to_string(cards) + " cards, next pass of " + std::to_string(next_keys) +
                     " keys planned " + (planned_at_expect ? "when expected" : "later"));
        TiersPair engines(cards, chunked(100));
        Tiers& early = engines.early;
        Tiers& reference = engines.reference;
        const auto a = pass_keys(240, 0, 5);
        const auto b = pass_keys(next_keys, 1u << 14, 6);  // disjoint from a
        early.manager->begin_pass(a);
        reference.manager->begin_pass(a);
        const StagedRows staged = early.manager->stage_rows(b, {}, a);
        early.manager->expect_next_pass(sorted(a),
                                        poll_after(&staged, planned_at_expect ? 0 : 2 * cards));
        early.prepare(60);
        early.manager->end_pass();
        reference.manager->end_pass();
        const PassStats got = early.manager->begin_pass(b, {}, &staged);
        const PassStats want = reference.manager->begin_pass(b);
        EXPECT_EQ(got.early_host_syncs, 0u);
        EXPECT_EQ(got.early_allocations, 0u);
        EXPECT_GT(got.early_inserted, 0u);
        if (next_keys == 240 || planned_at_expect) {
          EXPECT_EQ(got.early_inserted, staged.keys.size()) << "a staged row was left";
        } else {
          EXPECT_LT(got.early_inserted, staged.keys.size()) << "the cards grew for 1600 keys";
        }
        EXPECT_EQ(got.prefetched, staged.keys.size());
        EXPECT_EQ(got.pulled, 0u);
        EXPECT_EQ(got.hits, want.hits);
        EXPECT_EQ(early.card_rows(), reference.card_rows());
        early.manager->end_pass();
        reference.manager->end_pass();
        EXPECT_EQ(early.host_rows(), reference.host_rows());
      }
    }
  }
}

// Under a card budget the table is sized once, and erased slots count against its load bound
// until a rehash. begin_pass rehashes only when its own inserts need it, so the slots the last
// evictions erased stay, and without a reclaim at the pass boundary (expect_next_pass) they keep
// the next pass's inserts between steps out. Budget 500 rows (1024 slots, a load bound of 614):
// pass z fills the card; pass a (100 keys) evicts 100 of z's rows and inserts beside their
// erased slots; the work for pass b evicts as many of z's rows as b has keys and inserts b's
// staged rows between the steps: all of them while they fit the load bound beside the card's
// other keys (100 keys: all; 130: 114, the bound less the 500 keys), before the reclaim 14. The
// rest goes in at begin_pass. Checked: the counts, every key on the card against an
// unordered_map oracle (the host tier's rows, which the cards' clean rows equal, and b's staged
// rows), every key of b there, the budget kept, the rows of b an engine's without the work.
TEST(NextPassInserts, UnderABudgetFindTheErasedSlotsReclaimed) {
  for (const std::size_t next_keys : {std::size_t{100}, std::size_t{130}}) {
    GPUBOX_REQUIRE_CARDS(1);
    SCOPED_TRACE("a next pass of " + std::to_string(next_keys) + " keys");
    TiersPair engines(1, chunked(50, 500));
    Tiers& early = engines.early;
    Tiers& reference = engines.reference;
    const auto z = pass_keys(500, 1u << 20, 3);
    const auto a = pass_keys(100, 0, 1);
    const auto b = pass_keys(next_keys, 1u << 12, 2);  // the three disjoint
    for (Tiers* tiers : {&early, &reference}) {
      tiers->manager->begin_pass(z);
      tiers->manager->end_pass();
      tiers->manager->begin_pass(a);
    }
    const card_table::CardHashTable& table = early.stores[0]->table();
    ASSERT_EQ(table.capacity(), 1024u);
    ASSERT_EQ(table.erased_slots(), 100u) << "the setup needs erased slots";
    const auto bound = static_cast<std::size_t>(table.options().max_load_factor * 1024);
    const StagedRows staged = early.manager->stage_rows(b, {}, a);
    const std::size_t own_pairs = table.own_pair_rehashes();
    early.manager->expect_next_pass(sorted(a), poll_after(&staged, 0));
    // The purge (the erased slots reclaimed) saves its pairs in the kept listing, lent then.
    EXPECT_EQ(table.erased_slots(), 0u) << "expect_next_pass did not purge";
    EXPECT_EQ(table.own_pair_rehashes(), own_pairs) << "a rehash made pairs beside the listing";
    early.prepare(60);
    early.manager->end_pass();
    reference.manager->end_pass();
    Rows oracle = early.host_rows();
    const std::size_t stride = staged.rows.size() / staged.keys.size();
    for (std::size_t i = 0; i < staged.keys.size(); ++i) {
      oracle[staged.keys[i]].assign(staged.rows.begin() + i * stride,
                                    staged.rows.begin() + (i + 1) * stride);
    }
    const PassStats got = early.manager->begin_pass(b, {}, &staged);
    reference.manager->begin_pass(b);
    EXPECT_EQ(got.early_inserted, std::min(next_keys, bound - 500));
    EXPECT_EQ(got.early_evicted, next_keys);
    EXPECT_EQ(got.early_allocations, 0u);
    EXPECT_EQ(got.prefetched, next_keys);
    Rows now;
    ASSERT_NO_THROW(now = early.card_rows());
    EXPECT_EQ(now.size(), 500u);
    const Rows want = reference.card_rows();
    for (uint64_t key : b) {
      ASSERT_TRUE(now.count(key)) << "key " << key << " of b is not on the card";
      EXPECT_EQ(now.at(key), want.at(key)) << "key " << key;
    }
    for (const auto& [key, row] : now) {
      ASSERT_TRUE(oracle.count(key)) << "key " << key << " came from nowhere";
      EXPECT_EQ(row, oracle.at(key)) << "key " << key;
    }
  }
}

// With several trainers nothing is staged (a card's keys come from every trainer's data), so the
// next pass's work never runs: expect_next_pass sizes nothing for it (before: it grew the table
// and the pool for its guess, 1800 rows after a pass that brought 1600 new keys).
TEST(NextPassInserts, SeveralTrainersReserveNothing) {
  GPUBOX_REQUIRE_CARDS(1);
  Tiers tiers(1, chunked(100), /*trainers=*/2);
  const auto owned_here = [](std::vector<uint64_t> keys) {
    keys.erase(std::remove_if(keys.begin(), keys.end(),
                              [](uint64_t key) { return owner_card(key, 2) != 0; }),
               keys.end());
    return keys;
  };
  const auto a = owned_here(pass_keys(480, 0, 1));
  const auto b = owned_here(pass_keys(3200, 1u << 14, 2));
  tiers.manager->begin_pass(a);
  tiers.manager->end_pass();
  tiers.manager->begin_pass(b);
  const card_table::CardSparseStore& store = *tiers.stores[0];
  const std::size_t slots = store.table().capacity();
  const std::size_t rows = store.pool(0).capacity();
  const device::DeviceCounts before = tiers.card_set.card(0).counts();
  tiers.manager->expect_next_pass(sorted(b), poll_after(nullptr, 1000));
  const device::DeviceCounts sized = tiers.card_set.card(0).counts() - before;
  EXPECT_EQ(tiers.manager->next_pass_phase(0), Phase::kOff);
  EXPECT_EQ(store.table().capacity(), slots);
  EXPECT_EQ(store.pool(0).capacity(), rows);
  EXPECT_EQ(sized.allocations, 0u);
  EXPECT_EQ(sized.pinned_allocations, 0u);
  tiers.manager->end_pass();
}

}  // namespace
}  // namespace gpubox::pass
