// The next pass's card work between steps waits for nothing (issue 31, items 1 and 4): its
// look-ups, marks, listing, erases and inserts, each phase over a pass whose next pass needs it,
// wait for the card 0 times and allocate nothing, and begin_pass then places what an engine
// without the work places (NextPassPair); the erases' late check names a victim changed under
// the work; the one wait it keeps, begin_pass's for a chunk still in flight before its scratch is
// kept. Whether the work's result is exact over many passes: pass_manager_next_pass_test.cu.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "heterps/card_table/card_store.cuh"
#include "heterps/device/card.hpp"
#include "heterps/device/deferred.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/pass/next_pass_work.hpp"
#include "heterps/pass/pass_cards.hpp"
#include "heterps/pass/pass_manager.hpp"
#include "tests/heterps/device/lagging_card.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/heterps/pass/pass_manager_test_util.cuh"

namespace gpubox::pass {
namespace {

using pass_test::Engine;
using pass_test::make_passes;
using pass_test::NextPassPair;
using pass_test::poll_of;
using pass_test::sorted_keys;
using pass_test::train_older_then_begin;

// The passes of the tests that make room: rows of `older` (keys from 840 up) stay on the card
// outside both `training` (below 360) and `next` (from 480 to 840: disjoint from both).
struct RoomPasses {
  std::vector<uint64_t> older = make_passes(8, 240, 93).back();
  std::vector<uint64_t> training = make_passes(1, 240, 91).front();
  std::vector<uint64_t> next = make_passes(5, 240, 92).back();
};

// Issue 31, item 4: the next pass's look-ups between steps wait for nothing. A look-up chunk
// neither waits for the step's collectives before it (its scratch is sized when the work is
// expected) nor for its own readback (its rows are read a chunk later, once its event has
// passed): over a pass whose next pass's rows never arrive (look-ups only), the work's chunks
// wait for the card 0 times and allocate nothing; before, each waited 3 times (before the chunk,
// in the table's look-up, and for its rows). What begin_pass then places equals an engine without
// the work.
TEST(PassManager, NextPassLookupsWaitForNothing) {
  PassManagerOptions options;
  options.next_pass_chunk_keys = 50;  // 240 keys: 5 chunks, each read by the next
  NextPassPair engines(1, options);
  const auto a = make_passes(1, 240, 95).front();
  const auto b = make_passes(3, 240, 95).back();  // overlaps a
  engines.begin(a);
  const StagedRows planned = engines.early.manager->plan_staging(b, {}, a);
  engines.train_expecting(a, 1, 12, poll_of(&planned, /*rows_ready=*/false));
  engines.end_pass();
  const auto [got, want] = engines.begin_next(b);
  EXPECT_GE(got.early_chunks, 6u);  // 5 enqueued, the last one read by a sixth
  EXPECT_EQ(got.early_host_syncs, 0u);
  EXPECT_EQ(got.early_allocations, 0u);
  EXPECT_EQ(got.hits, want.hits);
  EXPECT_EQ(got.pulled, want.pulled);
  EXPECT_EQ(engines.early.card_rows(), engines.reference.card_rows());
  engines.end_pass();
}

// Issue 31, item 4: the next pass's marks between steps wait for nothing either, nor does the
// listing after them. Under a row budget that forces room to be made, a card's chunks go: 5
// look-ups (240 keys, 50 a chunk), the sixth poll reads the last and plans the marks, 5 mark
// chunks (the table's find, rows read back late), the twelfth poll reads the last and fixes the
// victims; the thirteenth lists the table (every slot, read back late). So 12 or 13 steps of
// work wait for the card 0 times and allocate nothing (before, each mark chunk waited 3 times,
// and the listing waited); and begin_pass then places what an engine without the work places.
TEST(PassManager, NextPassMarksWaitForNothing) {
  GPUBOX_REQUIRE_CARDS(1);
  const auto a = make_passes(1, 240, 91).front();
  const auto b = make_passes(4, 240, 92).back();  // disjoint from a: 240 rows over the budget
  for (const int steps : {12, 13}) {
    SCOPED_TRACE(std::to_string(steps) + " steps");
    PassManagerOptions options;
    options.card_row_budget = 300;
    options.next_pass_chunk_keys = 50;
    NextPassPair engines(1, options);
    engines.begin(a);
    const StagedRows planned = engines.early.manager->plan_staging(b, {}, a);
    engines.train_expecting(a, 1, steps, poll_of(&planned, /*rows_ready=*/false));
    engines.end_pass();
    const auto [got, want] = engines.begin_next(b);
    EXPECT_EQ(got.early_chunks, static_cast<uint64_t>(steps));
    EXPECT_EQ(got.early_host_syncs, 0u);
    EXPECT_EQ(got.early_allocations, 0u);
    EXPECT_EQ(got.evicted, want.evicted);
    EXPECT_EQ(got.hits + got.pulled + got.prefetched, want.hits + want.pulled + want.prefetched);
    EXPECT_EQ(engines.early.card_rows(), engines.reference.card_rows());
    engines.end_pass();
  }
}

// Issue 31, item 4: the whole of making room between steps waits for nothing. The card holds
// rows outside both passes (60 of an older pass z, clean), so the work lists the table (every
// slot read back late, two list chunks in flight) and erases them (victims known present: no
// count read back; a late check that each was there) before it would insert. With the next
// pass's rows never fetched it stops there: 40 steps of look-ups, marks, listing and erasing wait
// for the card 0 times and allocate nothing. begin_pass then evicts as many rows as an engine
// without the work (the rest among the training pass's rows) and places the same rows of the
// next pass.
TEST(PassManager, NextPassRoomIsMadeWithoutWaiting) {
  GPUBOX_REQUIRE_CARDS(1);
  const RoomPasses passes{};
  PassManagerOptions options;
  options.card_row_budget = 300;
  options.next_pass_chunk_keys = 50;
  NextPassPair engines(1, options);
  engines.begin_after(passes.older, passes.training);  // 180 of z's rows leave: 60 stay
  const StagedRows planned = engines.early.manager->plan_staging(passes.next, {}, passes.training);
  engines.train_expecting(passes.training, 1, 40, poll_of(&planned, /*rows_ready=*/false));
  engines.end_pass();
  const auto [got, want] = engines.begin_next(passes.next);
  // Look-ups, marks, the listing and the erases took fewer chunks than the steps; the work then
  // waits for the rows (polls that count no chunk).
  EXPECT_LT(got.early_chunks, 40u);
  EXPECT_EQ(got.early_host_syncs, 0u);
  EXPECT_EQ(got.early_allocations, 0u);
  EXPECT_EQ(got.early_evicted, 60u) << "z's rows were not erased between steps";
  EXPECT_EQ(got.evicted, want.evicted);
  EXPECT_EQ(got.rows_on_cards, want.rows_on_cards);
  ASSERT_NO_FATAL_FAILURE(engines.expect_same_card_rows(passes.next));
  engines.end_pass();
}

// A poll that reports nothing for its first `polls` calls (every card's together), then
// `staged` planned and fetched.
std::function<StagingProgress()> poll_after(const StagedRows* staged, int polls) {
  return [staged, polls, count = std::make_shared<std::atomic<int>>(0)] {
    if (count->fetch_add(1) < polls) return StagingProgress{};
    return StagingProgress{staged, true};
  };
}

// Issue 31, items 1 and 4: the next pass's inserts between steps wait for nothing either. The
// next pass has 1600 new keys, more than the cards' tables hold without growing. With its keys
// planned when the work is expected, each card's table and pool are sized then (between
// passes) for its staged keys; with its rows fetched, a card's chunks go: its look-ups (100 keys
// a chunk), then inserts of its staged keys, 100 a chunk, each read back a chunk later. Every
// staged row goes in between the steps with 0 waits for the card and 0 allocations (before:
// 1 + 4-5 waits a page of rows, and the table's growth). With its keys planned only later (as
// the trainer's pipeline reads the pass after expect_next_pass), the cards were sized at
// expect() for a guess (after a first pass: an eighth of its keys) and the inserts stop at that
// room, the rest left to begin_pass: no chunk waits or grows a table (before: the first insert
// chunk of each card waited once and grew its table). Either way begin_pass then places
// the rows an engine without the work places, and after the pass trains both host tiers agree
// bit for bit.
TEST(PassManager, NextPassInsertsWaitForNothing) {
  for (const int cards : {1, 2}) {
    for (const bool planned_at_expect : {true, false}) {
      GPUBOX_REQUIRE_CARDS(cards);
      SCOPED_TRACE(std::to_string(cards) + " cards, keys planned " +
                   (planned_at_expect ? "when expected" : "later"));
      PassManagerOptions options;
      options.next_pass_chunk_keys = 100;
      NextPassPair engines(cards, options);
      const auto a = make_passes(1, 240, 95).front();
      const auto b = make_passes(3, 1600, 96).back();  // disjoint from a
      engines.begin(a);
      // The cards hold a: b less a.
      StagedRows staged = engines.early.manager->stage_rows(b, {}, a);
      ASSERT_EQ(staged.keys.size(), b.size());
      engines.train_expecting(a, 1, 40, poll_after(&staged, planned_at_expect ? 0 : 2 * cards));
      EXPECT_EQ(engines.early.manager->next_pass_phase(0), NextPassCard::Phase::kDone);
      engines.end_pass();
      const auto [got, want] = engines.begin_next(b, &staged);
      // Planned at expect(): room for every staged row. Planned later: room for the guess (an
      // eighth of the first pass's keys), the rest left to begin_pass. Never a wait or a growth.
      if (planned_at_expect) {
        EXPECT_EQ(got.early_inserted, staged.keys.size()) << "a staged row was left to begin_pass";
      } else {
        EXPECT_LT(got.early_inserted, staged.keys.size());
      }
      EXPECT_EQ(got.early_host_syncs, 0u);
      EXPECT_EQ(got.early_allocations, 0u);
      EXPECT_EQ(got.pulled, 0u);
      EXPECT_EQ(got.hits, want.hits);
      EXPECT_EQ(got.prefetched, want.pulled);
      EXPECT_EQ(engines.early.card_rows(), engines.reference.card_rows());
      engines.train_and_compare_hosts(b, 2, 4);
    }
  }
}

// The same under a row budget that makes the work erase rows outside both passes first (60 of an
// older pass z): the inserts fill the room the erases made, between the steps, waiting for
// nothing (the victims' erased slots stay within the table's load bound: it was sized for the
// budget). The rows placed are an engine's without the work.
TEST(PassManager, NextPassInsertsAfterErasesWaitForNothing) {
  GPUBOX_REQUIRE_CARDS(1);
  const RoomPasses passes{};
  PassManagerOptions options;
  options.card_row_budget = 300;
  options.next_pass_chunk_keys = 50;
  NextPassPair engines(1, options);
  engines.begin_after(passes.older, passes.training);  // 180 of z's rows leave: 60 stay
  StagedRows staged = engines.early.manager->stage_rows(passes.next, {}, passes.training);
  engines.train_expecting(passes.training, 1, 40, poll_of(&staged));
  engines.end_pass();
  const auto [got, want] = engines.begin_next(passes.next, &staged);
  EXPECT_EQ(got.early_evicted, 60u);
  EXPECT_EQ(got.early_inserted, 60u) << "the room the erases made was not filled";
  EXPECT_EQ(got.early_host_syncs, 0u);
  EXPECT_EQ(got.early_allocations, 0u);
  EXPECT_EQ(got.evicted, want.evicted);
  ASSERT_NO_FATAL_FAILURE(engines.expect_same_card_rows(passes.next));
  engines.train_and_compare_hosts(passes.next, 2, 3);
}

enum class VictimPlant { kNone, kMissing, kMoved };

// The rows card 0 of `engine` holds `keys` at.
std::vector<card_table::row_index_t> card0_rows(Engine& engine, const std::vector<uint64_t>& keys) {
  device::Card& card = engine.card_set.card(0);
  auto d_keys = device::to_device(keys, card.memory(), card.stream());
  auto d_rows = card.make_buffer<card_table::row_index_t>(keys.size());
  engine.stores[0]->table().find(d_keys.data(), keys.size(), d_rows.data(), card.stream());
  return device::to_host(d_rows);
}

// Changes card 0's table under its next pass's work: victims[0] erased (kMissing), or victims[0]
// and victims[1] erased and inserted again in the other order, so each takes the other's row
// with its own record (kMoved).
void plant_victim_change(Engine& engine, VictimPlant plant, const std::vector<uint64_t>& victims) {
  device::Card& card = engine.card_set.card(0);
  const device::Stream& stream = card.stream();
  card_table::CardSparseStore& store = *engine.stores[0];
  if (plant == VictimPlant::kMissing) {
    auto d_key = device::to_device(std::vector<uint64_t>{victims[0]}, card.memory(), stream);
    ASSERT_EQ(store.erase(d_key.data(), 1, stream), 1u);
  } else if (plant == VictimPlant::kMoved) {
    const std::vector<uint64_t> two = {victims[0], victims[1]};
    const auto before = card0_rows(engine, two);
    auto d_two = device::to_device(two, card.memory(), stream);
    auto records = card.make_buffer<float>(2 * store.record_stride());
    store.read_rows(d_two.data(), 2, records.data(), stream);
    std::vector<float> swapped_records = device::to_host(records);
    std::rotate(swapped_records.begin(), swapped_records.begin() + store.record_stride(),
                swapped_records.end());
    ASSERT_EQ(store.erase(d_two.data(), 2, stream), 2u);
    auto d_swapped =
        device::to_device(std::vector<uint64_t>{victims[1], victims[0]}, card.memory(), stream);
    auto d_records = device::to_device(swapped_records, card.memory(), stream);
    ASSERT_EQ(store.insert_rows(d_swapped.data(), d_records.data(), 2, stream), 2u);
    const auto after = card0_rows(engine, two);
    ASSERT_EQ(after[0], before[1]) << "the plant did not move the rows";
    ASSERT_EQ(after[1], before[0]) << "the plant did not move the rows";
  }
}

const char* phase_name(NextPassCard::Phase phase) {
  static const char* const kNames[] = {"kOff",  "kWaiting", "kLookup", "kMark",
                                       "kList", "kErase",   "kInsert", "kDone"};
  return kNames[static_cast<int>(phase)];
}

// One chunk of card 0's next-pass work. `after_card`: as after a step, the card first runs what
// was enqueued before (the steps between two polls do, in training); otherwise back to back, the
// host outrunning the card. On a GPU a chunk's results come back only once the card has run it,
// and a poll that finds its end event pending does nothing; the cpu backend runs the work when
// it is enqueued (or, deferred, at a poll: LaggingCard).
void prepare(Engine& engine, bool after_card) {
  if (after_card) engine.card_set.card(0).stream().synchronize();
  engine.manager->prepare_next_pass(0);
}

// Polls card 0's next-pass work (prepare) until it is in `phase` or stopped, or `limit` polls:
// how many it took.
int poll_until(Engine& engine, NextPassCard::Phase phase, int limit, bool after_card) {
  int polls = 0;
  for (; polls < limit && engine.manager->next_pass_phase(0) != phase &&
         engine.manager->next_pass_phase(0) != NextPassCard::Phase::kOff;
       ++polls) {
    prepare(engine, after_card);
  }
  return polls;
}

// The card 6 polls behind the host in the lagged tests below (LaggingCard).
constexpr unsigned kLag = 6;

// Issue 31: the next pass's erases check that each victim is still on the card at the row its
// listing gave it. The card holds 60 rows of an older pass z outside both passes (the victims:
// all leave, in one erase chunk); the work runs a chunk at a time until they are chosen (kErase),
// then the test changes the table under it: one victim erased (missing), or two victims' rows
// swapped (moved). The job stops with an error naming the card and the key, whether the erase is
// read by the work's next chunk or, still in flight when the pass ends, by end_pass before its
// write-back lists the table (NextPassWork::settle). Untouched, the same work goes on and
// begin_pass uses it. With `lagging` the card is kLag polls behind the host (LaggingCard, cpu
// backend) and the host polls back to back, never waiting for it: each phase then takes up to
// kLag times the polls.
void check_victim_plants(bool lagging) {
  const RoomPasses passes{};
  const std::vector<uint64_t>& a = passes.training;
  const std::vector<uint64_t>& b = passes.next;
  std::set<uint64_t> passes_keys(a.begin(), a.end());
  passes_keys.insert(b.begin(), b.end());
  const int lag = lagging ? static_cast<int>(kLag) : 1;
  for (const VictimPlant plant : {VictimPlant::kNone, VictimPlant::kMissing, VictimPlant::kMoved}) {
    for (const bool at_pass_end : {false, true}) {
      SCOPED_TRACE(std::string(plant == VictimPlant::kNone      ? "untouched"
                               : plant == VictimPlant::kMissing ? "missing"
                                                                : "moved") +
                   (at_pass_end ? ", read at the pass's end" : ", read by the work"));
      std::optional<device::testing::LaggingCard> lagging_card;
      if (lagging) lagging_card.emplace(kLag);
      PassManagerOptions options;
      options.card_row_budget = 300;
      options.next_pass_chunk_keys = 100;
      Engine early(1, options);
      train_older_then_begin(early, passes.older, a);
      const StagedRows planned = early.manager->plan_staging(b, {}, a);
      early.manager->expect_next_pass(sorted_keys(a), poll_of(&planned, /*rows_ready=*/false));
      const int polls = poll_until(early, NextPassCard::Phase::kErase, lag * 100, !lagging);
      ASSERT_EQ(early.manager->next_pass_phase(0), NextPassCard::Phase::kErase)
          << "after " << polls << " polls the work is in "
          << phase_name(early.manager->next_pass_phase(0));
      std::vector<uint64_t> victims;
      for (uint64_t k : early.manager->resident_keys()) {
        if (passes_keys.count(k) == 0) victims.push_back(k);
      }
      ASSERT_EQ(victims.size(), 60u);
      std::sort(victims.begin(), victims.end());
      plant_victim_change(early, plant, victims);
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
      try {
        if (at_pass_end) {
          prepare(early, !lagging);  // the erase enqueued, its check not read
          early.manager->end_pass();
          EXPECT_EQ(early.manager->begin_pass(b).early_evicted, 60u);
        } else {
          // The erase enqueued, then read (its check) and the phase over.
          (void)poll_until(early, NextPassCard::Phase::kInsert, lag * 5, !lagging);
          EXPECT_EQ(early.manager->next_pass_phase(0), NextPassCard::Phase::kInsert)
              << "the work is in " << phase_name(early.manager->next_pass_phase(0));
        }
        EXPECT_TRUE(plant == VictimPlant::kNone)
            << "a victim changed under the work went unnoticed";
      } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_TRUE(plant != VictimPlant::kNone) << what;
        EXPECT_NE(what.find("card 0"), std::string::npos) << what;
        const bool named = what.find("key " + std::to_string(victims[0])) != std::string::npos ||
                           (plant == VictimPlant::kMoved &&
                            what.find("key " + std::to_string(victims[1])) != std::string::npos);
        EXPECT_TRUE(named) << what;
      }
    }
  }
}

TEST(PassManager, NextPassErasesCheckEachVictimsRow) {
  GPUBOX_REQUIRE_CARDS(1);
  check_victim_plants(/*lagging=*/false);
}

TEST(PassManager, NextPassErasesCheckEachVictimsRowWithTheCardBehindTheHost) {
#if defined(GPUBOX_BACKEND_CUDA)
  GTEST_SKIP() << "LaggingCard lags the cpu backend's deferred streams only: on a GPU this "
                  "would repeat NextPassErasesCheckEachVictimsRow (NextPassWorkKeepsGoingWith"
                  "TheCardBehindTheHost polls the real card back to back)";
#else
  GPUBOX_REQUIRE_CARDS(1);
  check_victim_plants(/*lagging=*/true);
#endif
}

// The phases card 0's next-pass work went through, each with the poll (1, 2, ...) after which
// it was first in it, polled back to back (no wait for the card) until done or stopped, or
// `limit` polls.
using PhasePolls = std::vector<std::pair<NextPassCard::Phase, int>>;
PhasePolls phases_polled_back_to_back(Engine& engine, int limit) {
  PhasePolls reached;
  for (int poll = 1; poll <= limit; ++poll) {
    const NextPassCard::Phase before = engine.manager->next_pass_phase(0);
    if (before == NextPassCard::Phase::kDone || before == NextPassCard::Phase::kOff) break;
    engine.manager->prepare_next_pass(0);
    const NextPassCard::Phase after = engine.manager->next_pass_phase(0);
    if (reached.empty() || reached.back().first != after) reached.emplace_back(after, poll);
  }
  return reached;
}

std::string describe(const PhasePolls& reached) {
  std::string out;
  for (const auto& [phase, poll] : reached) {
    out +=
        std::string(out.empty() ? "" : ", ") + phase_name(phase) + " after " + std::to_string(poll);
  }
  return out;
}

// Issue 31 with the card behind the host: the whole job of the next pass (look-ups, marks, the
// listing, 60 erases of an older pass's rows and 60 inserts of fetched rows, RoomPasses under a
// budget) polled back to back, the host never waiting for the card. On the cpu backend the card
// is first one poll behind (a chunk passes at the first poll that finds it pending), then kLag
// polls behind (LaggingCard): the work goes through the same phases, reaching each within kLag
// times the polls it took one poll behind (each chunk kLag polls instead of one: none waits
// longer, nothing livelocks) and finishing later (the lag held it back: else this tests
// nothing). On a GPU the card is as far behind as it is: the work must only finish. Either way
// it waits for the card 0 times and allocates nothing, and begin_pass then places what an
// engine without the work places, bit for bit.
TEST(PassManager, NextPassWorkKeepsGoingWithTheCardBehindTheHost) {
  GPUBOX_REQUIRE_CARDS(1);
#if defined(GPUBOX_BACKEND_CUDA)
  const std::vector<unsigned> lags = {0};  // no LaggingCard: the card's own lag
  constexpr int kLimit = 200000;
#else
  const std::vector<unsigned> lags = {1, kLag};
  constexpr int kLimit = 1000 * static_cast<int>(kLag);
#endif
  const RoomPasses passes{};
  PhasePolls one_behind;
  for (const unsigned lag : lags) {
    SCOPED_TRACE("the card " + std::to_string(lag) + " polls behind (0: as it is)");
    std::optional<device::testing::LaggingCard> lagging_card;
    if (lag > 0) lagging_card.emplace(lag);
    PassManagerOptions options;
    options.card_row_budget = 300;
    options.next_pass_chunk_keys = 50;
    NextPassPair engines(1, options);
    engines.begin_after(passes.older, passes.training);  // 180 of z's rows leave: 60 stay
    StagedRows staged = engines.early.manager->stage_rows(passes.next, {}, passes.training);
    engines.early.manager->expect_next_pass(sorted_keys(passes.training), poll_of(&staged));
    const PhasePolls reached = phases_polled_back_to_back(engines.early, kLimit);
    ASSERT_FALSE(reached.empty());
    ASSERT_EQ(reached.back().first, NextPassCard::Phase::kDone) << describe(reached);
    if (lag == 1) one_behind = reached;
    if (lag == kLag) {
      ASSERT_EQ(reached.size(), one_behind.size())
          << describe(reached) << "; one poll behind: " << describe(one_behind);
      for (std::size_t i = 0; i < reached.size(); ++i) {
        EXPECT_EQ(reached[i].first, one_behind[i].first) << "phase " << i;
        EXPECT_LE(reached[i].second, static_cast<int>(kLag) * one_behind[i].second)
            << phase_name(reached[i].first) << ": " << describe(reached)
            << "; one poll behind: " << describe(one_behind);
      }
      EXPECT_GT(reached.back().second, one_behind.back().second)
          << "the lag held nothing back: " << describe(reached);
    }
    engines.end_pass();
    const auto [got, want] = engines.begin_next(passes.next, &staged);
    EXPECT_EQ(got.early_evicted, 60u);
    EXPECT_EQ(got.early_inserted, 60u);
    EXPECT_EQ(got.early_host_syncs, 0u);
    EXPECT_EQ(got.early_allocations, 0u);
    EXPECT_EQ(got.evicted, want.evicted);
    ASSERT_NO_FATAL_FAILURE(engines.expect_same_card_rows(passes.next));
    engines.train_and_compare_hosts(passes.next, 2, 3);
  }
}

// keep_scratch (begin_pass, once it is done with the work) keeps the work's scratch for the next
// pass only after the chunks still in flight have passed: a chunk that ran later would write its
// readbacks into scratch lent to the next pass's work. A look-up chunk enqueued after the pass's
// last wait (the card 6 polls behind the host: LaggingCard), its end event pending, is still on
// the card's stream when keep_scratch runs: it waits once (counted), and the stream is idle after
// it. Through NextPassWork itself: through PassManager every begin_pass that could take such a
// work waits for the card before it keeps the scratch (its look-up or evictions read back), which
// on the cpu backend runs what is pending. Without keep_scratch's wait: 0 waits, the chunk still
// queued.
TEST(PassManager, KeepScratchWaitsForAChunkStillInFlight) {
#if defined(GPUBOX_BACKEND_CUDA)
  GTEST_SKIP() << "LaggingCard holds work pending on the cpu backend's deferred streams only; on a "
                  "GPU the chunk may have passed already";
#else
  GPUBOX_REQUIRE_CARDS(1);
  const device::testing::LaggingCard lagging(kLag);
  PassManagerOptions options;
  options.next_pass_chunk_keys = 100;
  Engine engine(1, options);
  const RoomPasses passes{};
  engine.manager->begin_pass(passes.training);
  const StagedRows staged = engine.manager->stage_rows(passes.next, {}, passes.training);
  engine.manager->end_pass();
  // A work of its own over the engine's cards (the manager's idle), as begin_pass drives it.
  PassCards cards(engine.card_set, {engine.stores[0].get()}, *engine.host, options);
  NextPassWork work(cards);
  work.expect(sorted_keys(passes.training), poll_of(&staged), /*training=*/true, /*pass_id=*/0);
  ASSERT_TRUE(work.prepare(0));
  ASSERT_EQ(work.phase(0), NextPassCard::Phase::kLookup);
  const device::Stream& stream = engine.card_set.card(0).stream();
  ASSERT_NE(stream.deferred(), nullptr);
  ASSERT_FALSE(device::detail::deferred_idle(*stream.deferred())) << "no chunk pending";
  std::vector<NextPassCard> taken = work.take();
  ASSERT_EQ(taken.size(), 1u);
  const device::DeviceCounts before = engine.card_set.card(0).counts();
  work.keep_scratch(0, taken[0]);
  EXPECT_EQ((engine.card_set.card(0).counts() - before).host_syncs, 1u);
  EXPECT_TRUE(device::detail::deferred_idle(*stream.deferred()))
      << "the chunk may still write into the scratch kept for the next pass";
#endif
}

}  // namespace
}  // namespace gpubox::pass
