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
// The other topics of the same binary: the next pass's card work between steps
// (pass_manager_next_pass_test.cu, pass_manager_wait_free_test.cu), its chunks' pacing
// (chunk_pacer_test.cpp), placement and the card tier's plan (pass_manager_plan_test.cu), card
// memory under a budget (pass_manager_memory_test.cu), evaluation passes and host tiers
// (pass_manager_host_tier_test.cu); shared helpers in pass_manager_test_util.cuh.
#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "heterps/pass/pass_manager.hpp"
#include "table/sparse_row/accessor.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/heterps/pass/pass_manager_test_util.cuh"

namespace gpubox::pass {
namespace {

using pass_test::Engine;
using pass_test::make_passes;
using pass_test::rows_equal;
using pass_test::test_config;
using table::AccessorConfig;

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

// Eviction removes exactly the `excess` rows outside the pass with the lowest (score, key): an
// oracle from the card rows' scores before each begin_pass (many rows share a score, so the key
// decides among them), over passes that overlap, are all on the card, or are empty. The host's
// row_score is the card's bit for bit (each operation rounded alike: show_click_score).
TEST(PassManager, EvictionRemovesTheLowestScoredRowsOutsideThePass) {
  GPUBOX_REQUIRE_CARDS(1);
  PassManagerOptions options;
  options.card_row_budget = 300;
  options.host_batch_keys = 37;
  Engine engine(1, options);
  const AccessorConfig cfg = test_config();
  auto passes = make_passes(6, 240, 79);
  passes.insert(passes.begin() + 3,
                std::vector<uint64_t>(passes[2].begin(), passes[2].begin() + 90));
  passes.insert(passes.begin() + 4, std::vector<uint64_t>{});
  uint64_t evicted = 0;
  for (std::size_t p = 0; p < passes.size(); ++p) {
    const auto& keys = passes[p];
    const auto before = engine.card_rows();
    std::vector<std::pair<float, uint64_t>> outside;  // (score, key) of rows the pass lacks
    std::size_t missing = 0;
    for (uint64_t k : keys) missing += before.count(k) == 0;
    for (const auto& [k, row] : before) {
      if (!std::binary_search(keys.begin(), keys.end(), k))
        outside.emplace_back(table::row_score(row.data(), cfg), k);
    }
    const std::size_t excess = before.size() + missing > options.card_row_budget
                                   ? before.size() + missing - options.card_row_budget
                                   : 0;
    ASSERT_LE(excess, outside.size());
    std::sort(outside.begin(), outside.end());
    std::set<uint64_t> want(keys.begin(), keys.end());
    for (std::size_t i = excess; i < outside.size(); ++i) want.insert(outside[i].second);

    const PassStats stats = engine.manager->begin_pass(keys);
    EXPECT_EQ(stats.evicted, excess) << "pass " << p;
    std::set<uint64_t> got;
    for (const auto& [k, row] : engine.card_rows()) got.insert(k);
    EXPECT_EQ(got, want) << "pass " << p;
    evicted += stats.evicted;
    if (!keys.empty()) engine.train(keys, 3000 + p, 4);
    engine.manager->end_pass();
  }
  EXPECT_GT(evicted, 0u);
}

// Misuse of end_pass(keep), on `passes` 0-2: keeping this pass's own keys, not the next pass's.
// Eviction spares the dirty rows (the host tier ends equal to the reference's); when too few
// clean rows are left it fails.
void expect_misused_keep_spares_dirty_rows(const std::vector<std::vector<uint64_t>>& passes) {
  PassManagerOptions one_card;
  one_card.card_row_budget = 300;
  Engine misused(1, one_card);
  Engine plain(1, one_card);
  for (std::size_t p = 0; p < 2; ++p) {
    misused.manager->begin_pass(passes[p]);
    plain.manager->begin_pass(passes[p]);
    misused.train(passes[p], 5000 + p, 4);
    plain.train(passes[p], 5000 + p, 4);
    misused.manager->end_pass(passes[p]);
    plain.manager->end_pass();
  }
  misused.manager->sync();
  const auto want_host = plain.host_rows();
  for (const auto& [k, row] : misused.host_rows()) {
    ASSERT_TRUE(rows_equal(row, want_host.at(k))) << "key " << k << " lost its update";
  }
  misused.manager->begin_pass(passes[2]);
  misused.train(passes[2], 5002, 4);
  misused.manager->end_pass(passes[2]);
  std::vector<uint64_t> disjoint;  // none of pass 2's keys: every dirty row is outside it
  for (uint64_t k : passes[2]) disjoint.push_back(k + 2);
  std::sort(disjoint.begin(), disjoint.end());
  try {
    misused.manager->begin_pass(disjoint);
    FAIL() << "evicted a dirty row";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kept"), std::string::npos) << e.what();
  }
}

// end_pass(keep): the rows of the next pass's keys stay on the cards, dirty, and the host tier
// holds their older value until a later end_pass or sync() writes them; the cards (eviction
// included) and, after the last pass, the host tier equal a run that writes everything back
// each pass. A keep that is not the next pass's keys cannot make eviction drop a dirty row: it
// fails, naming the kept rows.
TEST(PassManager, KeptRowsStayDirtyUntilALaterEndPassOrSync) {
  GPUBOX_REQUIRE_CARDS(2);
  PassManagerOptions options;
  options.card_row_budget = 170;
  options.host_batch_keys = 37;
  Engine kept(2, options);
  Engine reference(2, options);
  const auto passes = make_passes(6, 240, 81);
  uint64_t kept_total = 0, evicted = 0, written = 0, written_reference = 0;
  for (std::size_t p = 0; p < passes.size(); ++p) {
    const auto& keys = passes[p];
    const PassStats got_begin = kept.manager->begin_pass(keys);
    const PassStats want_begin = reference.manager->begin_pass(keys);
    EXPECT_EQ(got_begin.hits, want_begin.hits) << "pass " << p;
    EXPECT_EQ(got_begin.evicted, want_begin.evicted) << "pass " << p;
    evicted += got_begin.evicted;
    kept.train(keys, 4000 + p, 4);
    reference.train(keys, 4000 + p, 4);
    const bool last = p + 1 == passes.size();
    const PassStats got = kept.manager->end_pass(last ? std::vector<uint64_t>{} : passes[p + 1]);
    const PassStats want = reference.manager->end_pass();
    // A kept row not trained again stays dirty: a later end_pass writes it (once).
    written += got.written_back;
    written_reference += want.written_back;
    kept_total += got.kept_dirty;
    const auto got_cards = kept.card_rows();
    const auto want_cards = reference.card_rows();
    ASSERT_EQ(got_cards.size(), want_cards.size()) << "pass " << p;
    for (const auto& [k, row] : want_cards) {
      ASSERT_TRUE(got_cards.count(k) && rows_equal(got_cards.at(k), row)) << k << " pass " << p;
    }
    // The host tier: every row equal but the kept ones, which hold an older value.
    const auto got_host = kept.host_rows();
    const auto want_host = reference.host_rows();
    ASSERT_EQ(got_host.size(), want_host.size()) << "pass " << p;
    std::size_t stale = 0;
    for (const auto& [k, row] : want_host) {
      if (rows_equal(got_host.at(k), row)) continue;
      ASSERT_TRUE(!last && std::binary_search(passes[p + 1].begin(), passes[p + 1].end(), k))
          << "host row " << k << " differs but was not kept, pass " << p;
      ++stale;
    }
    EXPECT_EQ(stale, got.kept_dirty) << "pass " << p;
    if (p == 2) {
      // A save's sync() writes the kept rows too.
      EXPECT_EQ(kept.manager->sync(), got.kept_dirty);
      for (const auto& [k, row] : kept.host_rows()) {
        ASSERT_TRUE(rows_equal(row, want_host.at(k))) << "after sync, key " << k;
      }
    }
  }
  EXPECT_GT(kept_total, 0u);
  EXPECT_LT(written, written_reference) << "keeping rows saved no write-back";
  EXPECT_GT(evicted, 0u) << "the budget never forced an eviction";

  ASSERT_NO_FATAL_FAILURE(expect_misused_keep_spares_dirty_rows(passes));
}

// A pass given up (abandon_pass: its write-back failed for a server restart and the schedule
// reloads a save) writes nothing back and ends; with the stores emptied (CardTier::abandon_pass),
// the next begin_pass pulls every row of its keys from the host tier, which holds what it held
// before the pass, rows an earlier end_pass kept dirty on the cards lost with them.
TEST(PassManager, AnAbandonedPassWritesNothingBackAndTheNextPullsFromTheHost) {
  GPUBOX_REQUIRE_CARDS(2);
  PassManagerOptions options;
  options.card_row_budget = 170;
  Engine engine(2, options);
  const auto passes = make_passes(2, 120, 91);
  engine.manager->begin_pass(passes[0]);
  engine.train(passes[0], 6000, 4);
  engine.manager->end_pass(passes[1]);    // pass 1's rows stay dirty on the cards
  engine.manager->begin_pass(passes[1]);  // creates its new keys' rows on the host
  const auto host_before = engine.host_rows();
  engine.train(passes[1], 6001, 4);
  engine.manager->abandon_pass();
  EXPECT_FALSE(engine.manager->in_pass());
  EXPECT_GT(engine.manager->kept_dirty(), 0u);  // kept by end_pass, lost with the cards next
  engine.forget_cards();
  EXPECT_TRUE(engine.card_rows().empty());
  EXPECT_EQ(engine.manager->kept_dirty(), 0u);  // no stale count for make_room to spare
  const auto host_after = engine.host_rows();
  ASSERT_EQ(host_after.size(), host_before.size());
  for (const auto& [k, row] : host_before) {
    ASSERT_TRUE(rows_equal(host_after.at(k), row)) << "key " << k << " written back";
  }
  const PassStats again = engine.manager->begin_pass(passes[1]);
  EXPECT_EQ(again.hits, 0u);
  EXPECT_EQ(again.pulled + again.created, passes[1].size());
  const auto cards = engine.card_rows();
  ASSERT_EQ(cards.size(), passes[1].size());
  for (const auto& [k, row] : cards) {
    if (host_before.count(k) == 1) {
      EXPECT_TRUE(rows_equal(row, host_before.at(k))) << "key " << k;
    }
  }
  engine.manager->end_pass();
}

// stage_rows drops key 0, duplicates (the first slot wins) and the excluded keys, creates new
// rows with their slots, and returns rows in key order equal to a pull's; nothing for no keys.
TEST(PassManager, StageRowsSortsDedupsExcludesAndCreates) {
  Engine engine(1, PassManagerOptions{});
  EXPECT_TRUE(engine.manager->stage_rows({}, {}, {}).keys.empty());
  const std::vector<uint64_t> keys = {mix64(9) | 1, 0, mix64(3) | 1, mix64(9) | 1, mix64(5) | 1};
  const std::vector<int32_t> slots = {4, 1, 2, 7, 3};
  std::vector<uint64_t> exclude = {mix64(5) | 1};
  const StagedRows staged = engine.manager->stage_rows(keys, slots, exclude);
  ASSERT_EQ(staged.owned.size(), 1u);
  EXPECT_EQ(staged.owned[0].keys.size(), 3u) << "the pass's keys, the excluded one too";
  EXPECT_EQ(staged.card_end, std::vector<std::size_t>{2});
  std::vector<uint64_t> want = {mix64(9) | 1, mix64(3) | 1};
  std::sort(want.begin(), want.end());
  ASSERT_EQ(staged.keys, want);
  EXPECT_EQ(staged.created, 2u);
  const int stride = engine.host->layout().stride();
  ASSERT_EQ(staged.rows.size(), 2u * stride);
  EXPECT_EQ(staged.bytes(), 2 * sizeof(uint64_t) + 2 * stride * sizeof(float) +
                                3 * (sizeof(uint64_t) + sizeof(int32_t)));
  const auto host = engine.host_rows();
  EXPECT_EQ(host.size(), 2u) << "the excluded key was pulled";
  for (std::size_t i = 0; i < want.size(); ++i) {
    const std::vector<float> row(staged.rows.begin() + i * stride,
                                 staged.rows.begin() + (i + 1) * stride);
    EXPECT_TRUE(rows_equal(row, host.at(want[i])));
    EXPECT_EQ(row[engine.host->layout().slot()], want[i] == (mix64(9) | 1) ? 4.0f : 2.0f);
  }
  EXPECT_THROW(engine.manager->stage_rows(keys, {1}, {}), Error);
  EXPECT_THROW(engine.manager->stage_rows(keys, {}, {5, 2}), Error);
}

TEST(PassManager, PassLargerThanBudgetFailsBeforeTrainingWithNumbers) {
  GPUBOX_REQUIRE_CARDS(2);
  PassManagerOptions options;
  options.card_row_budget = 10;
  Engine engine(2, options);
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; k <= 100; ++k) keys.push_back(mix64(k));
  try {
    engine.manager->begin_pass(keys);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("does not fit on card"), std::string::npos) << what;
    EXPECT_NE(what.find("budget is 10 rows"), std::string::npos) << what;
    EXPECT_NE(what.find("more cards"), std::string::npos) << what;
  }
  EXPECT_FALSE(engine.manager->in_pass());
  EXPECT_EQ(engine.host_rows().size(), 0u) << "nothing pulled for a pass that cannot fit";
}

// end_pass writes back 1, a batch's worth, and n + 1 rows (batches of 3, 2 in flight: the last
// pushes reuse the first batches' buffers, the last batch holds 1 row) exactly as the reference
// (one batch of every row) writes them.
TEST(PassManager, WriteBackInBatchesOfEverySizeMatchesOneBatch) {
  GPUBOX_REQUIRE_CARDS(1);
  PassManagerOptions options;
  options.host_batch_keys = 3;
  options.pulls_in_flight = 2;
  Engine batched(1, options);
  Engine reference(1, PassManagerOptions{});
  const std::vector<std::vector<uint64_t>> passes = {
      {7}, {7, 8, 9}, {5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, {1, 3, 5, 7, 9, 11, 13}};
  for (std::size_t p = 0; p < passes.size(); ++p) {
    SCOPED_TRACE("pass " + std::to_string(p));
    batched.manager->begin_pass(passes[p]);
    reference.manager->begin_pass(passes[p]);
    batched.train(passes[p], 900 + p, 2);
    reference.train(passes[p], 900 + p, 2);
    const PassStats end = batched.manager->end_pass();
    EXPECT_EQ(end.written_back, reference.manager->end_pass().written_back);
    EXPECT_EQ(end.written_back, passes[p].size());
    const auto got = batched.host_rows();
    const auto want = reference.host_rows();
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [k, row] : want) ASSERT_TRUE(rows_equal(got.at(k), row)) << "key " << k;
  }
}

TEST(PassManager, EmptyPassAndMisuse) {
  GPUBOX_REQUIRE_CARDS(2);
  Engine engine(2, PassManagerOptions{});
  const PassStats begin = engine.manager->begin_pass({});
  EXPECT_EQ(begin.keys_in_pass, 0u);
  EXPECT_THROW(engine.manager->begin_pass({1}), Error);  // twice without end_pass
  const PassStats end = engine.manager->end_pass();
  EXPECT_EQ(end.written_back, 0u);
  EXPECT_THROW(engine.manager->end_pass(), Error);
}

}  // namespace
}  // namespace gpubox::pass
