// PassManager over a sequence of passes with overlapping seeded key sets, on 1-3 simulated cards
// with the in-process host tier (table::SparseTable): the pass boundary's oracles.
//
// Oracle: the same passes and the same training steps run through a second, identical engine
// whose cards forget everything at every end_pass (no cache: every pass pulls all of its keys
// and nothing is ever evicted). Rows move between tiers bit-exactly, so with or without the
// cache, and with or without eviction, host contents after end_pass must be bit-identical, and
// so must the card rows of the pass's keys. Counters are checked against what the key sets
// imply (hits = pass keys already resident, pulled = the rest, created = never seen before).
//
// The other topics of the same binary: rows at the pass boundary (eviction, rows kept dirty, an
// abandoned pass, stage_rows, the budget, the write-back's batches: pass_manager_rows_test.cu),
// the next pass's card work between steps (pass_manager_next_pass_test.cu,
// pass_manager_wait_free_test.cu), its chunks' pacing (chunk_pacer_test.cpp), placement and the
// card tier's plan (pass_manager_plan_test.cu), card memory under a budget
// (pass_manager_memory_test.cu), evaluation passes and host tiers (pass_manager_host_tier_test.cu);
// shared helpers in pass_manager_test_util.cuh.
#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "heterps/pass/pass_manager.hpp"
#include "table/sparse_row/accessor.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/heterps/pass/pass_manager_test_util.cuh"

namespace gpubox::pass {
namespace {

using pass_test::Engine;
using pass_test::make_passes;
using pass_test::rows_equal;

struct Case {
  int cards;
  std::size_t row_budget;  // per card; 0 = none
};

class PassManagerTest : public ::testing::TestWithParam<Case> {};

TEST_P(PassManagerTest, CachedPassesMatchUncachedReferenceAndCountersMatchKeySets) {
  const Case tc = GetParam();
  GPUBOX_REQUIRE_CARDS(tc.cards);
  PassManagerOptions options;
  options.card_row_budget = tc.row_budget;
  options.host_batch_keys = 37;  // many small host requests, several in flight
  Engine cached(tc.cards, options);
  Engine reference(tc.cards, PassManagerOptions{});

  const auto passes = make_passes(5, 240, 77);
  std::set<uint64_t> resident, ever_seen;
  bool evicted_any = false;
  for (std::size_t p = 0; p < passes.size(); ++p) {
    const auto& keys = passes[p];
    std::vector<uint64_t> with_noise = keys;  // duplicates and key 0 are dropped by begin_pass
    with_noise.push_back(keys[0]);
    with_noise.push_back(0);

    const PassStats begin = cached.manager->begin_pass(with_noise);
    reference.manager->begin_pass(keys);
    EXPECT_EQ(begin.keys_in_pass, keys.size());
    std::size_t expect_hits = 0, expect_created = 0;
    for (uint64_t k : keys) {
      expect_hits += resident.count(k);
      expect_created += ever_seen.count(k) == 0;
    }
    if (tc.row_budget == 0) {
      EXPECT_EQ(begin.hits, expect_hits) << "pass " << p;
      EXPECT_EQ(begin.pulled, keys.size() - expect_hits) << "pass " << p;
    } else {
      EXPECT_LE(begin.hits, expect_hits);
      EXPECT_EQ(begin.hits + begin.pulled, keys.size());
      EXPECT_LE(begin.rows_on_cards, tc.row_budget * tc.cards);
      evicted_any |= begin.evicted > 0;
    }
    EXPECT_EQ(begin.created, expect_created) << "pass " << p;

    cached.train(keys, 1000 + p, 4);
    reference.train(keys, 1000 + p, 4);

    // The pass's keys on the cards are identical in both engines.
    auto cached_cards = cached.card_rows();
    auto reference_cards = reference.card_rows();
    for (uint64_t k : keys) {
      ASSERT_TRUE(cached_cards.count(k)) << "key " << k << " not on a card in pass " << p;
      ASSERT_TRUE(rows_equal(cached_cards[k], reference_cards.at(k)))
          << "key " << k << " pass " << p;
    }

    const PassStats end = cached.manager->end_pass();
    const PassStats ref_end = reference.manager->end_pass();
    // Every trained key is dirty once: the cache changes nothing about what is written back.
    EXPECT_EQ(end.written_back, ref_end.written_back) << "pass " << p;
    EXPECT_GT(end.written_back, 0u);
    reference.forget_cards();

    // After end_pass the host tier equals the reference's, row for row, bit for bit, and holds
    // what the cards hold.
    auto cached_host = cached.host_rows();
    auto reference_host = reference.host_rows();
    ASSERT_EQ(cached_host.size(), reference_host.size()) << "pass " << p;
    for (const auto& [k, row] : reference_host) {
      ASSERT_TRUE(rows_equal(cached_host.at(k), row)) << "key " << k << " pass " << p;
    }
    for (const auto& [k, row] : cached.card_rows()) {
      ASSERT_TRUE(rows_equal(cached_host.at(k), row)) << "card row " << k << " differs from host";
    }

    for (uint64_t k : keys) ever_seen.insert(k);
    if (tc.row_budget == 0) {
      resident.insert(keys.begin(), keys.end());
    } else {
      resident.clear();
      for (const auto& [k, row] : cached.card_rows()) resident.insert(k);
    }
  }
  if (tc.row_budget > 0) {
    EXPECT_TRUE(evicted_any) << "the budget never forced an eviction";
  }
}

INSTANTIATE_TEST_SUITE_P(Cards, PassManagerTest,
                         ::testing::Values(Case{1, 0}, Case{2, 0}, Case{3, 0}, Case{1, 300},
                                           Case{2, 170}, Case{3, 120}),
                         [](const auto& info) {
                           return std::to_string(info.param.cards) + "cards_budget" +
                                  std::to_string(info.param.row_budget);
                         });

// The rows of pass p + depth staged while pass p trains (another thread, concurrent with the
// steps), excluding the keys of passes p .. p + depth - 1, then handed to its begin_pass: the
// cards and the host tier stay bit-identical to the same passes without staging, and the
// counters add up to the unstaged ones. With a budget and depth 2, rows of pass p are evicted at
// pass p + 1 and needed again at p + 2: staged without the exclusion they would be stale.
struct StagingCase {
  int cards;
  std::size_t row_budget;  // per card; 0 = none
  int depth;
  // Also exclude the keys on the cards when the staging starts (the trainer's PassPipeline):
  // nothing staged is then a hit at its begin_pass, with depth 1 every staged row is used.
  bool exclude_resident = false;
};

class PassManagerStagingTest : public ::testing::TestWithParam<StagingCase> {};

using RowsByKey = std::map<uint64_t, std::vector<float>>;
using StagedAhead = std::map<std::size_t, StagedRows>;  // pass -> its staged rows

// Pass p's begin_pass counters, handed `mine` (its staged rows, or none), against the unstaged
// begin_pass's: what was pulled unstaged is pulled or prefetched staged.
void expect_begin_adds_up(const PassStats& got, const PassStats& want, const StagedRows* mine,
                          const StagingCase& tc, std::size_t p) {
  EXPECT_EQ(got.hits, want.hits) << "pass " << p;
  EXPECT_EQ(got.pulled + got.prefetched, want.pulled) << "pass " << p;
  EXPECT_EQ(got.created, want.created) << "pass " << p;
  EXPECT_EQ(got.evicted, want.evicted) << "pass " << p;
  if (mine != nullptr && (tc.depth == 1 || tc.row_budget == 0)) {
    EXPECT_EQ(got.pulled, 0u) << "pass " << p << ": a missing row was not staged";
  }
  if (mine != nullptr && tc.exclude_resident && tc.depth == 1) {
    EXPECT_EQ(got.prefetched, mine->keys.size()) << "pass " << p << ": a staged row was a hit";
  }
}

// `staged` trains pass p while another thread stages pass p + depth into `ahead`, excluding the
// keys of passes p .. p + depth - 1 (and the cards' keys under exclude_resident); past the last
// pass it only trains.
void train_while_staging(Engine& staged, const std::vector<std::vector<uint64_t>>& passes,
                         std::size_t p, const StagingCase& tc, StagedAhead* ahead) {
  const auto& keys = passes[p];
  const std::size_t target = p + static_cast<std::size_t>(tc.depth);
  if (target >= passes.size()) {
    staged.train(keys, 2000 + p, 4);
    return;
  }
  std::set<uint64_t> before;
  for (std::size_t q = p; q < target; ++q) before.insert(passes[q].begin(), passes[q].end());
  if (tc.exclude_resident) {
    const std::vector<uint64_t> resident = staged.manager->resident_keys();
    EXPECT_EQ(resident.size(), staged.card_rows().size()) << "pass " << p;
    before.insert(resident.begin(), resident.end());
  }
  const std::vector<uint64_t> exclude(before.begin(), before.end());
  auto staging = std::async(
      std::launch::async, [&] { return staged.manager->stage_rows(passes[target], {}, exclude); });
  staged.train(keys, 2000 + p, 4);
  (*ahead)[target] = staging.get();
  EXPECT_FALSE((*ahead)[target].keys.empty());
  for (uint64_t k : (*ahead)[target].keys) ASSERT_EQ(before.count(k), 0u) << "excluded key staged";
}

// The host tiers agree on every row; the staged side also holds rows the staging created for
// coming passes (`ahead`, rows of `stride` floats), untouched since.
void expect_host_tiers_agree(const RowsByKey& got_host, const RowsByKey& want_host,
                             const StagedAhead& ahead, std::size_t stride, std::size_t p) {
  for (const auto& [k, row] : want_host) {
    ASSERT_TRUE(got_host.count(k)) << "key " << k << " pass " << p;
    ASSERT_TRUE(rows_equal(got_host.at(k), row)) << "key " << k << " pass " << p;
  }
  std::size_t created_early = 0, created_staging = 0;
  for (const auto& [q, rows] : ahead) created_staging += rows.created;
  for (const auto& [k, row] : got_host) {
    if (want_host.count(k)) continue;
    bool found = false;
    for (const auto& [q, rows] : ahead) {
      const auto at = std::find(rows.keys.begin(), rows.keys.end(), k);  // sorted per card
      if (at == rows.keys.end()) continue;
      const auto i = static_cast<std::size_t>(at - rows.keys.begin());
      ASSERT_TRUE(rows_equal(row, std::vector<float>(rows.rows.begin() + i * stride,
                                                     rows.rows.begin() + (i + 1) * stride)));
      found = true;
    }
    ASSERT_TRUE(found) << "host row " << k << " neither trained nor staged";
    ++created_early;
  }
  EXPECT_EQ(created_early, created_staging) << "pass " << p;
}

// The cards agree on every row; and of the rows `unexcluded` staged before pass p trained, some
// differ from the host's after its end_pass (they would be stale).
void expect_cards_agree_and_unexcluded_stale(const RowsByKey& got_cards,
                                             const RowsByKey& want_cards,
                                             const StagedRows& unexcluded,
                                             const RowsByKey& got_host, std::size_t stride,
                                             std::size_t p) {
  ASSERT_EQ(got_cards.size(), want_cards.size()) << "pass " << p;
  for (const auto& [k, row] : want_cards) {
    ASSERT_TRUE(rows_equal(got_cards.at(k), row)) << "card key " << k << " pass " << p;
  }
  std::size_t stale = 0;
  for (std::size_t i = 0; i < unexcluded.keys.size(); ++i) {
    const std::vector<float> row(unexcluded.rows.begin() + i * stride,
                                 unexcluded.rows.begin() + (i + 1) * stride);
    stale += !rows_equal(row, got_host.at(unexcluded.keys[i]));
  }
  EXPECT_GT(stale, 0u) << "pass " << p << ": training changed no row it staged";
}

TEST_P(PassManagerStagingTest, StagedPassesMatchUnstagedBitForBit) {
  const StagingCase tc = GetParam();
  GPUBOX_REQUIRE_CARDS(tc.cards);
  PassManagerOptions options;
  options.card_row_budget = tc.row_budget;
  options.host_batch_keys = 37;
  Engine staged(tc.cards, options);
  Engine reference(tc.cards, options);

  const auto passes = make_passes(7, 240, 78);
  const std::size_t stride = static_cast<std::size_t>(staged.host->layout().stride());
  StagedAhead ahead;
  uint64_t prefetched = 0, evicted = 0;
  for (std::size_t p = 0; p < passes.size(); ++p) {
    const auto& keys = passes[p];
    const StagedRows* mine = ahead.count(p) ? &ahead.at(p) : nullptr;
    const PassStats got = staged.manager->begin_pass(keys, {}, mine);
    const PassStats want = reference.manager->begin_pass(keys);
    expect_begin_adds_up(got, want, mine, tc, p);
    prefetched += got.prefetched;
    evicted += got.evicted;

    // This pass's own rows fetched now would be stale after its end_pass: why each staging
    // excludes the keys of the passes training before it.
    const StagedRows unexcluded = staged.manager->stage_rows(keys, {}, {});
    ASSERT_NO_FATAL_FAILURE(train_while_staging(staged, passes, p, tc, &ahead));
    reference.train(keys, 2000 + p, 4);
    staged.manager->end_pass();
    reference.manager->end_pass();
    ahead.erase(p);

    const auto got_host = staged.host_rows();
    ASSERT_NO_FATAL_FAILURE(
        expect_host_tiers_agree(got_host, reference.host_rows(), ahead, stride, p));
    const auto got_cards = staged.card_rows();  // before the reference's, as each checks itself
    const auto want_cards = reference.card_rows();
    ASSERT_NO_FATAL_FAILURE(expect_cards_agree_and_unexcluded_stale(
        got_cards, want_cards, unexcluded, got_host, stride, p));
  }
  EXPECT_GT(prefetched, 0u);
  if (tc.row_budget > 0) {
    EXPECT_GT(evicted, 0u) << "the budget never forced an eviction";
  }
}

INSTANTIATE_TEST_SUITE_P(Cards, PassManagerStagingTest,
                         ::testing::Values(StagingCase{1, 0, 1}, StagingCase{2, 0, 1},
                                           StagingCase{3, 0, 2}, StagingCase{1, 300, 1},
                                           StagingCase{1, 300, 2}, StagingCase{2, 170, 2},
                                           StagingCase{1, 0, 1, true}, StagingCase{2, 170, 1, true},
                                           StagingCase{1, 300, 2, true},
                                           StagingCase{3, 120, 2, true}),
                         [](const auto& info) {
                           return std::to_string(info.param.cards) + "cards_budget" +
                                  std::to_string(info.param.row_budget) + "_depth" +
                                  std::to_string(info.param.depth) +
                                  (info.param.exclude_resident ? "_resident" : "");
                         });

}  // namespace
}  // namespace gpubox::pass
