// The next pass's card work between the current pass's steps (PassManager::expect_next_pass,
// prepare_next_pass): against an engine that does none of it, begin_pass places the same rows
// and the host tier ends the same, bit for bit; its edge cases; a wider keep's dirty rows spared.
// How long each phase of the work waits for the card: pass_manager_wait_free_test.cu.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "heterps/card_table/card_store.cuh"
#include "heterps/pass/pass_manager.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/heterps/pass/pass_manager_test_util.cuh"

namespace gpubox::pass {
namespace {

using pass_test::Engine;
using pass_test::make_passes;
using pass_test::NextPassPair;
using pass_test::poll_of;
using pass_test::rows_equal;
using pass_test::sorted_keys;

// The next pass's card work between the current pass's steps (prepare_next_pass): the next
// pass's staging is planned (its keys known) and its rows fetched on another thread while this
// one trains, as the pipeline does: the poll reports the keys first, in every third pass only
// after some steps (the read takes time), and the rows once fetched, in every other pass only
// during the steps (the cards look up and evict before they can insert). Each card does a chunk
// after each step, and begin_pass does the rest. Against an engine that
// neither stages nor prepares: the pass's card rows after begin_pass and after training, and the
// host tier after every end_pass, are bit-identical; every card row equals its host row after
// end_pass (the rows inserted early are exact copies); the counters add up. Passes overlap, one
// repeats the previous (every key on the card), one is empty, one is disjoint, and an
// evaluation pass between two passes makes begin_pass discard what was done (still exact).
// Few steps or small chunks leave the work unfinished in every phase.
struct NextPassCase {
  int cards;
  std::size_t row_budget;  // per card; 0 = none
  std::size_t chunk;       // next_pass_chunk_keys
  int steps;               // per pass
  // The work reaches its insertions (and evictions, with a budget) in some pass: enough steps
  // for the chunks; otherwise it stays partial (begin_pass finishes it).
  bool reaches_inserts;
  // next_pass_step_fraction: > 0 sizes the chunks by their measured time (ChunkPacer), as the
  // GPU build does; the chunk above is then their largest size.
  double step_fraction = 0;
};

class NextPassWorkTest : public ::testing::TestWithParam<NextPassCase> {};

// A coming pass's staging: planned, then fetched on another thread.
struct Staging {
  std::shared_ptr<StagedRows> plan;
  std::shared_future<void> fetched;
};

// begin_pass's figures with the early work (`got`) against the reference's (`want`).
void expect_begin_pass_stats(const PassStats& got, const PassStats& want, const NextPassCase& tc) {
  EXPECT_EQ(got.keys_in_pass, want.keys_in_pass);
  EXPECT_EQ(got.hits + got.pulled + got.prefetched, got.keys_in_pass);
  EXPECT_EQ(got.created, want.created);
  EXPECT_LE(got.early_inserted, got.prefetched);
  EXPECT_LE(got.early_evicted, got.evicted);
  if (tc.row_budget > 0) {
    EXPECT_LE(got.rows_on_cards, tc.row_budget * tc.cards);
  }
}

// Every key of the pass on early's cards, its row bit-identical to reference's (`when`: where
// the pass stands).
void expect_pass_rows(Engine& early, Engine& reference, const std::vector<uint64_t>& keys,
                      const char* when) {
  const auto got_cards = early.card_rows();
  const auto want_cards = reference.card_rows();
  for (uint64_t k : keys) {
    ASSERT_TRUE(got_cards.count(k)) << when << ": key " << k << " not on its card";
    ASSERT_TRUE(rows_equal(got_cards.at(k), want_cards.at(k))) << when << ": key " << k;
  }
}

// Pass `p` (`keys`) of `early` expects the next one (`next_keys`), staged as the trainer's
// pipeline does (excluding this pass's keys and the keys on the cards) into *next, fetched on
// another thread; the poll reports the keys only after some steps in every third pass, and every
// other pass trains only once the rows are fetched (the cards can insert from the first step;
// the others start at once: the first steps find the keys but no rows). Returns the cards' work
// between steps.
std::function<void(int)> stage_next_pass(Engine& early, const std::vector<uint64_t>& keys,
                                         const std::vector<uint64_t>& next_keys, std::size_t p,
                                         const NextPassCase& tc, Staging* next) {
  std::set<uint64_t> before(keys.begin(), keys.end());
  const std::vector<uint64_t> resident = early.manager->resident_keys();
  before.insert(resident.begin(), resident.end());
  const std::vector<uint64_t> exclude(before.begin(), before.end());
  next->plan = std::make_shared<StagedRows>(early.manager->plan_staging(next_keys, {}, exclude));
  next->fetched = std::async(std::launch::async, [&early, plan = next->plan] {
                    early.manager->fetch_staged(plan.get());
                  }).share();
  const int keys_after = p % 3 == 2 ? tc.steps / 3 * tc.cards : 0;  // polls, all cards
  early.manager->expect_next_pass(
      sorted_keys(keys), [plan = next->plan, fetched = next->fetched, keys_after,
                          polls = std::make_shared<std::atomic<int>>(0)] {
        StagingProgress progress;
        if (polls->fetch_add(1) < keys_after) return progress;
        progress.staged = plan.get();
        progress.rows_ready =
            fetched.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
        return progress;
      });
  if (p % 2 == 0) next->fetched.wait();
  return [&early](int c) { early.manager->prepare_next_pass(c); };
}

// After both ended a pass: the host tiers are bit-identical, but for the rows the next pass's
// staging created (`staged_next`, null when none comes); every card row equals its host row (the
// rows inserted early are exact copies).
void expect_hosts_after_end_pass(Engine& early, Engine& reference, const StagedRows* staged_next) {
  const auto got_host = early.host_rows();
  const auto want_host = reference.host_rows();
  for (const auto& [k, row] : want_host) {
    ASSERT_TRUE(got_host.count(k)) << "key " << k;
    ASSERT_TRUE(rows_equal(got_host.at(k), row)) << "key " << k;
  }
  for (const auto& [k, row] : got_host) {
    if (want_host.count(k)) continue;
    ASSERT_NE(staged_next, nullptr) << "host row " << k << " neither trained nor staged";
    ASSERT_NE(std::find(staged_next->keys.begin(), staged_next->keys.end(), k),
              staged_next->keys.end())
        << "host row " << k << " neither trained nor staged";
  }
  for (const auto& [k, row] : early.card_rows()) {
    ASSERT_TRUE(rows_equal(got_host.at(k), row)) << "card row " << k << " differs from host";
  }
}

// Both engines evaluate `eval_keys` between two passes: the cards' keys change, so what was
// prepared for the next pass is stale.
void evaluate_between(Engine& early, Engine& reference, const std::vector<uint64_t>& eval_keys) {
  early.manager->begin_pass(eval_keys, {}, nullptr, PassAccess::kEvaluate);
  reference.manager->begin_pass(eval_keys, {}, nullptr, PassAccess::kEvaluate);
  EXPECT_FALSE(early.manager->prepare_next_pass(0)) << "stale work went on";
  early.manager->end_pass();
  reference.manager->end_pass();
}

TEST_P(NextPassWorkTest, MatchesBeginPassAloneBitForBit) {
  const NextPassCase tc = GetParam();
  GPUBOX_REQUIRE_CARDS(tc.cards);
  PassManagerOptions options;
  options.card_row_budget = tc.row_budget;
  options.host_batch_keys = 37;
  Engine reference(tc.cards, options);
  options.next_pass_chunk_keys = tc.chunk;
  options.next_pass_step_fraction = tc.step_fraction;
  Engine early(tc.cards, options);

  auto passes = make_passes(5, 240, 79);
  passes.insert(passes.begin() + 2, passes[1]);  // every key on the card already
  passes.insert(passes.begin() + 4, std::vector<uint64_t>{});
  passes.push_back(make_passes(1, 240, 80).front());  // disjoint from the last
  const std::size_t evaluate_before = 6;              // an evaluation pass runs between 5 and 6
  std::map<std::size_t, Staging> ahead;
  uint64_t early_inserted = 0, early_evicted = 0, early_chunks = 0;
  for (std::size_t p = 0; p < passes.size(); ++p) {
    SCOPED_TRACE("pass " + std::to_string(p));
    const auto& keys = passes[p];
    const StagedRows* staged = nullptr;
    if (ahead.count(p)) {
      ahead.at(p).fetched.get();
      staged = ahead.at(p).plan.get();
    }
    const PassStats got = early.manager->begin_pass(keys, {}, staged);
    expect_begin_pass_stats(got, reference.manager->begin_pass(keys), tc);
    early_inserted += got.early_inserted;
    early_evicted += got.early_evicted;
    early_chunks += got.early_chunks;
    if (p > 0) {
      // The work's pinned scratch, made by the first pass's expect and kept since, is the plan's
      // pinned term (host memory: not in the card's total).
      EXPECT_EQ(early.manager->next_pass_kept_pinned_bytes(),
                early.manager->plan().next_pass_pinned_bytes);
    }
    expect_pass_rows(early, reference, keys, "after begin_pass");

    std::function<void(int)> between;
    if (p + 1 < passes.size()) {
      between = stage_next_pass(early, keys, passes[p + 1], p, tc, &ahead[p + 1]);
    }
    early.train(keys, 3000 + p, tc.steps, between);
    reference.train(keys, 3000 + p, tc.steps);
    expect_pass_rows(early, reference, keys, "after training");
    early.manager->end_pass();
    reference.manager->end_pass();
    ahead.erase(p);
    if (ahead.count(p + 1)) ahead.at(p + 1).fetched.wait();  // the host rows it creates
    expect_hosts_after_end_pass(early, reference,
                                ahead.count(p + 1) ? ahead.at(p + 1).plan.get() : nullptr);
    if (::testing::Test::HasFatalFailure()) return;
    if (p + 1 == evaluate_before) evaluate_between(early, reference, passes[0]);
  }
  EXPECT_GT(early_chunks, 0u);
  if (tc.reaches_inserts) {
    EXPECT_GT(early_inserted, 0u) << "no staged row was inserted between steps";
    if (tc.row_budget > 0) {
      EXPECT_GT(early_evicted, 0u) << "no row was evicted between steps";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cards, NextPassWorkTest,
    ::testing::Values(NextPassCase{1, 0, 1000, 12, true}, NextPassCase{2, 0, 7, 12, false},
                      NextPassCase{1, 300, 1000, 12, true}, NextPassCase{1, 300, 1000, 4, false},
                      NextPassCase{2, 170, 1000, 12, true}, NextPassCase{2, 170, 7, 30, false},
                      NextPassCase{3, 120, 16, 40, true}, NextPassCase{3, 120, 1, 6, false},
                      // Paced chunks (their sizes vary with the measured times).
                      NextPassCase{1, 300, 1000, 40, false, 0.25},
                      NextPassCase{2, 0, 1000, 40, false, 0.01}),
    [](const auto& info) {
      return std::to_string(info.param.cards) + "cards_budget" +
             std::to_string(info.param.row_budget) + "_chunk" + std::to_string(info.param.chunk) +
             "_steps" + std::to_string(info.param.steps) +
             (info.param.step_fraction > 0 ? "_paced" : "");
    });

// Edge cases of the next pass's card work on one card (each a helper below, in this order, on
// the same engines: the card's state carries from one to the next), run by NextPassWorkEdgeCases.
//
// No room until begin_pass: the card is full of a's rows, so nothing could be evicted or
// inserted during a. begin_pass evicts among a's rows (evict_among) and inserts b's staged rows
// in the card's kept pages, made by the first begin_pass: no card allocation. Leaves b trained.
void no_room_until_begin_pass(NextPassPair& engines, const std::vector<uint64_t>& a,
                              const std::vector<uint64_t>& b) {
  Engine& early = engines.early;
  engines.begin(a);
  StagedRows staged = early.manager->stage_rows(b, {}, a);
  engines.train_expecting(a, 1, 8, poll_of(&staged));
  engines.end_pass();
  const device::DeviceCounts before = early.card_set.card(0).counts();
  const auto [got, want] = engines.begin_next(b, &staged);
  EXPECT_EQ((early.card_set.card(0).counts() - before).allocations, 0u);
  // Its copies to or from pageable memory (each a wait on CUDA): evict_among reads its ranks
  // and dirty flags back in one, not two (before: 8).
  EXPECT_EQ((early.card_set.card(0).counts() - before).pageable_copies, 7u);
  EXPECT_EQ(got.early_inserted, 0u);
  EXPECT_EQ(got.early_evicted, 0u);
  EXPECT_GT(got.early_chunks, 0u);
  EXPECT_EQ(got.evicted, want.evicted);
  EXPECT_EQ(got.prefetched, b.size());
  EXPECT_EQ(early.card_rows(), engines.reference.card_rows());
  engines.train_and_compare_hosts(b, 2, 3);
}

// A failed staging (its keys known, so the cards looked them up and made room, but its rows
// never came): half of b trains (the card still holds all of b), then a pass of 120 new keys
// whose rows never arrive. The other half of b is evicted during the steps; no row is inserted;
// its begin_pass, given no staged rows as the trainer does, pulls them all and places the same
// rows.
void failed_staging(NextPassPair& engines, const std::vector<uint64_t>& b) {
  SCOPED_TRACE("failed staging");
  Engine& early = engines.early;
  const std::vector<uint64_t> half(b.begin(), b.begin() + 120);
  const auto fresh = make_passes(16, 120, 94).back();  // disjoint from a and b
  engines.begin(half);
  const StagedRows planned = early.manager->plan_staging(fresh, {}, half);
  EXPECT_FALSE(planned.fetched);
  EXPECT_TRUE(planned.rows.empty());
  engines.train_expecting(half, 3, 8, poll_of(&planned, /*rows_ready=*/false));
  EXPECT_FALSE(early.manager->prepare_next_pass(0)) << "the work did not wait for the rows";
  engines.end_pass();
  EXPECT_THROW(early.manager->begin_pass(fresh, {}, &planned), Error) << "rows never fetched";
  const auto [got_fresh, want_fresh] = engines.begin_next(fresh);
  EXPECT_EQ(got_fresh.early_evicted, 120u);
  EXPECT_EQ(got_fresh.early_inserted, 0u);
  EXPECT_EQ(got_fresh.evicted, want_fresh.evicted);
  EXPECT_EQ(got_fresh.pulled, fresh.size());
  // The cards chose other victims (the reference among all of b, the work outside `half`);
  // the pass's rows are the same.
  const auto got_cards = early.card_rows();
  const auto want_cards = engines.reference.card_rows();
  for (uint64_t k : fresh) {
    ASSERT_TRUE(got_cards.count(k)) << "key " << k << " not on the card";
    EXPECT_EQ(got_cards.at(k), want_cards.at(k)) << "key " << k;
  }
  engines.train_and_compare_hosts(fresh, 4, 3);
}

// A next pass over the budget: the cards do nothing; it fails at its begin_pass with its numbers,
// as without the work.
void next_pass_over_budget(Engine& early, const std::vector<uint64_t>& a) {
  SCOPED_TRACE("next pass over the budget");
  const auto big = make_passes(1, 300, 93).front();
  early.manager->begin_pass(a);
  StagedRows next = early.manager->stage_rows(big, {}, a);
  early.manager->expect_next_pass(sorted_keys(a), poll_of(&next));
  EXPECT_FALSE(early.manager->prepare_next_pass(0));
  EXPECT_FALSE(early.manager->prepare_next_pass(0));
  early.manager->end_pass();
  try {
    early.manager->begin_pass(big, {}, &next);
    ADD_FAILURE() << "a pass over the budget began";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("keys do not fit"), std::string::npos) << e.what();
  }
}

// b staged during a into *late (what later_expectation_refused polls), but no step ran after it:
// b's begin_pass does all of the work.
void staged_without_steps(Engine& early, const std::vector<uint64_t>& a,
                          const std::vector<uint64_t>& b, StagedRows* late) {
  early.manager->begin_pass(a);
  *late = early.manager->stage_rows(b, {}, a);
  early.manager->expect_next_pass(sorted_keys(a), poll_of(late));
  early.manager->end_pass();
  const PassStats all = early.manager->begin_pass(b, {}, late);
  EXPECT_EQ(all.early_chunks, 0u);
  EXPECT_EQ(all.hits + all.pulled + all.prefetched, b.size());
  early.manager->end_pass();
}

// A work that expired with a look-up chunk in flight (one poll, then the pass ended): its
// begin_pass does all of the work, and keeping its scratch adds no wait once the chunk has passed
// (always, on the cpu backend).
void expired_work(Engine& early, const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  SCOPED_TRACE("expired work");
  early.manager->begin_pass(a);
  StagedRows expired = early.manager->stage_rows(b, {}, a);
  early.manager->expect_next_pass(sorted_keys(a), poll_of(&expired));
  early.manager->prepare_next_pass(0);
  early.manager->end_pass();
  const device::DeviceCounts before_expired = early.card_set.card(0).counts();
  const PassStats stats = early.manager->begin_pass(b, {}, &expired);
  EXPECT_EQ(stats.hits + stats.pulled + stats.prefetched, b.size());
  // begin_pass's own waits; before, keep_scratch waited for the passed chunk too (9).
  EXPECT_EQ((early.card_set.card(0).counts() - before_expired).host_syncs, 8u);
  early.manager->end_pass();
}

// Too late once a step ran (the trainer's prepare_next_pass after it): its sizing would wait
// beside the step's collectives. Each pass above expected after its begin_pass, past steps.
void later_expectation_refused(Engine& early, const std::vector<uint64_t>& a,
                               const StagedRows& late) {
  early.manager->begin_pass(a);
  EXPECT_FALSE(early.manager->prepare_next_pass(0));
  try {
    early.manager->expect_next_pass(sorted_keys(a), poll_of(&late));
    ADD_FAILURE() << "expect_next_pass after a step was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has run steps already"), std::string::npos) << e.what();
  }
  early.manager->end_pass();
}

TEST(PassManager, NextPassWorkEdgeCases) {
  PassManagerOptions options;
  options.card_row_budget = 240;
  options.next_pass_chunk_keys = 1000;
  NextPassPair engines(1, options);
  const auto a = make_passes(1, 240, 91).front();
  const auto b = make_passes(4, 240, 92).back();  // disjoint from a (a window further on)
  // Each case starts from the card the one before left: a failure ends the test there.
  ASSERT_NO_FATAL_FAILURE(no_room_until_begin_pass(engines, a, b));
  ASSERT_NO_FATAL_FAILURE(failed_staging(engines, b));
  ASSERT_NO_FATAL_FAILURE(next_pass_over_budget(engines.early, a));
  StagedRows late;
  ASSERT_NO_FATAL_FAILURE(staged_without_steps(engines.early, a, b, &late));
  ASSERT_NO_FATAL_FAILURE(expired_work(engines.early, a, b));
  ASSERT_NO_FATAL_FAILURE(later_expectation_refused(engines.early, a, late));
}

// The next pass's card work with a `keep` wider than the next pass's keys (each end_pass keeps
// its own pass's rows too): rows outside both passes may then be dirty, their newest value only
// on the card. The work and begin_pass's remainder spare them; the host tier ends equal to an
// engine that keeps nothing and does no early work.
TEST(PassManager, NextPassWorkSparesRowsAWiderKeepLeftDirty) {
  PassManagerOptions options;
  options.card_row_budget = 600;
  Engine plain(1, options);
  options.next_pass_chunk_keys = 16;
  Engine early(1, options);
  const auto passes = make_passes(6, 240, 83);
  std::shared_future<StagedRows> ahead;
  uint64_t early_evicted = 0;
  for (std::size_t p = 0; p < passes.size(); ++p) {
    SCOPED_TRACE("pass " + std::to_string(p));
    const StagedRows* staged = ahead.valid() ? &ahead.get() : nullptr;
    early_evicted += early.manager->begin_pass(passes[p], {}, staged).early_evicted;
    plain.manager->begin_pass(passes[p]);
    std::function<void(int)> between;
    std::shared_future<StagedRows> next;
    if (p + 1 < passes.size()) {
      std::set<uint64_t> exclude(passes[p].begin(), passes[p].end());
      const std::vector<uint64_t> resident = early.manager->resident_keys();
      exclude.insert(resident.begin(), resident.end());
      next = std::async(std::launch::async, [&early, &passes, p,
                                             excluded = std::vector<uint64_t>(exclude.begin(),
                                                                              exclude.end())] {
               return early.manager->stage_rows(passes[p + 1], {}, excluded);
             }).share();
      next.wait();
      early.manager->expect_next_pass(sorted_keys(passes[p]), poll_of(&next.get()));
      between = [&](int c) { early.manager->prepare_next_pass(c); };
    }
    early.train(passes[p], 7000 + p, 60, between);
    plain.train(passes[p], 7000 + p, 60);
    std::set<uint64_t> keep(passes[p].begin(), passes[p].end());
    if (p + 1 < passes.size()) keep.insert(passes[p + 1].begin(), passes[p + 1].end());
    early.manager->end_pass(std::vector<uint64_t>(keep.begin(), keep.end()));
    plain.manager->end_pass();
    ahead = next;
  }
  early.manager->sync();
  EXPECT_GT(early_evicted, 0u) << "the work never evicted between steps";
  const auto want_host = plain.host_rows();
  const auto got_host = early.host_rows();
  for (const auto& [k, row] : want_host) {
    ASSERT_TRUE(got_host.count(k)) << "key " << k;
    ASSERT_TRUE(rows_equal(got_host.at(k), row)) << "key " << k << " lost its update";
  }
}

// expect_next_pass sizes a card for the next pass's inserts (NextPassWork::reserve_inserts): under
// a budget the table holds the budget's slots from the start, but the pool grows a page at a
// time, so the free rows the inserts take between steps must be made there (no chunk may
// allocate). Budget 2000 rows in pages of 64: pass a leaves 16 free rows in its 4 pages; the 600
// staged rows of the next pass b (disjoint, planned when the work is expected) all go in between
// the steps, 0 allocations there, and begin_pass places b's rows as an engine without the work.
TEST(PassManager, NextPassInsertsFindTheirRowsMadeAtTheBoundary) {
  GPUBOX_REQUIRE_CARDS(1);
  PassManagerOptions options;
  options.card_row_budget = 2000;
  card_table::HashTableOptions table_options;
  table_options.page_rows = 64;
  Engine reference(1, options, nullptr, table_options);
  options.next_pass_chunk_keys = 100;
  Engine early(1, options, nullptr, table_options);
  const auto a = make_passes(1, 240, 97).front();
  const auto b = make_passes(9, 600, 98).back();  // disjoint from a
  early.manager->begin_pass(a);
  reference.manager->begin_pass(a);
  ASSERT_EQ(early.stores[0]->pool(0).pages(), 4u);
  const StagedRows staged = early.manager->stage_rows(b, {}, a);
  early.manager->expect_next_pass(sorted_keys(a), poll_of(&staged));
  early.train(a, 1, 20, [&](int c) { early.manager->prepare_next_pass(c); });
  reference.train(a, 1, 20);
  early.manager->end_pass();
  reference.manager->end_pass();
  const PassStats got = early.manager->begin_pass(b, {}, &staged);
  reference.manager->begin_pass(b);
  EXPECT_EQ(got.early_inserted, b.size()) << "a staged row waited for begin_pass";
  EXPECT_EQ(got.early_allocations, 0u) << "between the steps";
  EXPECT_EQ(got.prefetched, b.size());
  const auto got_cards = early.card_rows();
  const auto want_cards = reference.card_rows();
  for (const uint64_t k : b) {
    ASSERT_TRUE(got_cards.count(k)) << "key " << k;
    EXPECT_TRUE(rows_equal(got_cards.at(k), want_cards.at(k))) << "key " << k;
  }
}

}  // namespace
}  // namespace gpubox::pass
