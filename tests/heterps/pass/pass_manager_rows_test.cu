// PassManager's rows at the pass boundary, on 1-2 simulated cards with the in-process host tier
// (the cached-against-uncached oracle and the staged passes: pass_manager_test.cu, the same
// binary): eviction of the lowest-scored rows outside the pass, rows kept dirty by end_pass(keep),
// an abandoned pass, stage_rows, a pass over the card budget, the write-back's batches, misuse.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
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
    EXPECT_NE(what.find("a training pass's keys do not fit on card"), std::string::npos) << what;
    EXPECT_NE(what.find("budget is 10 rows"), std::string::npos) << what;
    EXPECT_NE(what.find("more cards"), std::string::npos) << what;
  }
  EXPECT_FALSE(engine.manager->in_pass());
  EXPECT_EQ(engine.host_rows().size(), 0u) << "nothing pulled for a pass that cannot fit";
  // An evaluation's keys are named as such (it was "pass N" in the tier's count, which counts
  // evaluations too: epoch 0's evaluation failed as "pass 5").
  try {
    engine.manager->begin_pass(keys, {}, nullptr, PassAccess::kEvaluate);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the evaluated data's keys do not fit on card"), std::string::npos) << what;
    EXPECT_NE(what.find("runner.test_data_dir, --infer_data_dir"), std::string::npos) << what;
  }
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
