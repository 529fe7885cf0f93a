// The next pass's card work (PassManager::expect_next_pass / prepare_next_pass) when a fault
// stops it, on 1-2 simulated cards with the in-process host tier: the card stays exact whichever
// chunk the fault cuts; its fault drain waits with the communicator's bounded wait (a peer that
// never joins fails it in time; a failed wait is named by card and pass before its cause, its
// location apart), and its undo allocates nothing. The sizing of its inserts:
// pass_manager_inserts_test.cu.
//
// Oracles: an engine without the work (next_pass_chunk_keys 0) given the same passes, whose
// card rows, read through a dump of each card's table, must equal the working engine's as
// std::unordered_map key -> row after every begin_pass, and whose host tier must equal its row
// for row after every end_pass; and, right after a fault, every key on a card is the current
// pass's (the oracle's row) or a staged key of the next one (its staged row). The dump fails when
// a table's count of keys (size()) differs from the keys it holds: a row taken off the free list
// and never given back shows there.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/deferred.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/pass/pass_manager.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/heterps/pass/pass_manager_error_test_util.hpp"

namespace gpubox::pass {
namespace {

using Fault = NextPassWork::ChunkFault;
using error_test::chunked;
using error_test::pass_keys;
using error_test::Phase;
using error_test::poll_after;
using error_test::Rows;
using error_test::sorted;
using error_test::Tiers;
using error_test::TiersPair;

// Streams made while it lives defer their work until a wait demands it (cpu backend; the CUDA
// card runs ahead of the host by itself): a chunk's end event has not passed at the next
// prepare, so chunks are in flight when a later one faults.
class DeferredStreams {
 public:
  explicit DeferredStreams(bool on)
      : was_(device::deferred_execution_enabled()), seed_(device::deferred_execution_seed()) {
    if (on) device::set_deferred_execution(true, 0);
  }
  ~DeferredStreams() { device::set_deferred_execution(was_, seed_); }
  DeferredStreams(const DeferredStreams&) = delete;
  DeferredStreams& operator=(const DeferredStreams&) = delete;

 private:
  bool was_;
  uint64_t seed_;
};

// Every key of `rows` is one of the oracle's (`current`) with its row, or a staged key with its
// staged row (inserted early, whole); every key of the current pass (`pass`) is there.
void expect_current_or_staged(const Rows& rows, const Rows& current,
                              const std::vector<uint64_t>& pass, const StagedRows& staged) {
  Rows staged_rows;
  const std::size_t stride = staged.rows.size() / std::max<std::size_t>(1, staged.keys.size());
  for (std::size_t i = 0; i < staged.keys.size(); ++i) {
    staged_rows[staged.keys[i]].assign(staged.rows.begin() + i * stride,
                                       staged.rows.begin() + (i + 1) * stride);
  }
  for (uint64_t key : pass) {
    ASSERT_TRUE(rows.count(key)) << "key " << key << " of the current pass left its card";
  }
  for (const auto& [key, row] : rows) {
    const Rows& from = current.count(key) ? current : staged_rows;
    ASSERT_TRUE(from.count(key)) << "key " << key << " is neither the pass's nor staged";
    ASSERT_EQ(std::memcmp(row.data(), from.at(key).data(), row.size() * sizeof(float)), 0)
        << "key " << key << ": its record is not its row";
  }
}

// Places staged.keys[0] with its staged row on card 0, after the next pass's look-ups found it
// missing: the first insert chunk counts it, takes its candidate row, and does not take it.
void place_first_staged(Tiers& tiers, const StagedRows& staged) {
  device::Card& card = tiers.card_set.card(0);
  const auto stride = static_cast<std::size_t>(tiers.stores[0]->record_stride());
  auto d_key =
      device::to_device(std::vector<uint64_t>{staged.keys[0]}, card.memory(), card.stream());
  auto d_row =
      device::to_device(std::vector<float>(staged.rows.begin(), staged.rows.begin() + stride),
                        card.memory(), card.stream());
  ASSERT_EQ(tiers.stores[0]->insert_rows(d_key.data(), d_row.data(), 1, card.stream()), 1u);
}

struct FaultCase {
  const char* name;
  Phase phase;
  int64_t ok_chunks;  // chunks of `phase` that run before the failing one
  Fault point;
  bool deferred;  // chunks stay in flight across prepares
  std::size_t row_budget;
};

void PrintTo(const FaultCase& tc, std::ostream* os) { *os << tc.name; }

class NextPassFaultTest : public ::testing::TestWithParam<FaultCase> {};

// A fault stops the next pass's work on the card with chunks in flight. The first insert
// chunk holds a key that will not take its row (the test places that key on the card after
// the look-ups found it missing: the chunk's insert counts it, takes its candidate row, and
// only the chunk's late read repairs that). Whether the fault cuts that chunk short after its
// table call, strikes the chunk after it while it is in flight, or cuts both, the card stays
// exact: its size() equals its dump's count, its rows are the oracle's, and the next pass's
// begin_pass places the rows of an engine without the work. Faults in a look-up and in an
// erase (under a budget, 60 rows outside both passes to evict) too.
TEST_P(NextPassFaultTest, LeavesTheCardExact) {
  const FaultCase tc = GetParam();
  GPUBOX_REQUIRE_CARDS(1);
  const DeferredStreams deferred(tc.deferred);
  TiersPair engines(1, chunked(50, tc.row_budget));
  Tiers& early = engines.early;
  Tiers& reference = engines.reference;
  const auto z = pass_keys(240, 1u << 20, 3);  // an older pass: 60 of its rows stay (budget)
  const auto a = pass_keys(240, 0, 1);
  const auto b = pass_keys(240, 1u << 12, 2);  // disjoint from a and z
  for (Tiers* tiers : {&early, &reference}) {
    if (tc.row_budget > 0) {
      tiers->manager->begin_pass(z);
      tiers->manager->end_pass();
    }
    tiers->manager->begin_pass(a);
  }
  const StagedRows staged = early.manager->stage_rows(b, {}, a);
  ASSERT_EQ(staged.keys.size(), b.size());
  early.manager->expect_next_pass(sorted(a), poll_after(&staged, 0));
  early.manager->fail_next_pass_chunk_after(tc.ok_chunks, tc.phase, tc.point);
  // To the inserts, then the key that will fail: staged.keys[0], the first insert's first key.
  for (int i = 0; i < 200 && early.manager->next_pass_phase(0) != Phase::kInsert &&
                  early.manager->next_pass_phase(0) != Phase::kOff;
       ++i) {
    early.prepare(1);
  }
  if (tc.phase == Phase::kInsert) {
    ASSERT_EQ(early.manager->next_pass_phase(0), Phase::kInsert);
    ASSERT_NO_FATAL_FAILURE(place_first_staged(early, staged));
    early.prepare(12);
  }
  EXPECT_EQ(early.manager->next_pass_phase(0), Phase::kOff) << "the fault never struck";

  Rows now;
  ASSERT_NO_THROW(now = early.card_rows()) << "the card's count of keys is off";
  expect_current_or_staged(now, reference.card_rows(), a, staged);
  if (tc.row_budget > 0) {
    EXPECT_LE(early.stores[0]->size(), tc.row_budget);
  }

  early.manager->end_pass();
  reference.manager->end_pass();
  const PassStats got = early.manager->begin_pass(b, {}, &staged);
  const PassStats want = reference.manager->begin_pass(b);
  EXPECT_EQ(got.hits + got.pulled + got.prefetched, b.size());
  EXPECT_EQ(got.pulled, 0u);
  EXPECT_EQ(got.created, want.created);
  Rows got_rows;
  ASSERT_NO_THROW(got_rows = early.card_rows());
  const Rows want_rows = reference.card_rows();
  for (uint64_t key : b) {
    ASSERT_TRUE(got_rows.count(key)) << "key " << key;
    ASSERT_EQ(got_rows.at(key), want_rows.at(key)) << "key " << key;
  }
  if (tc.row_budget == 0) {
    EXPECT_EQ(got_rows, want_rows);
  }
  early.manager->end_pass();
  reference.manager->end_pass();
  EXPECT_EQ(early.host_rows(), reference.host_rows());
}

INSTANTIATE_TEST_SUITE_P(
    Faults, NextPassFaultTest,
    ::testing::Values(
        // The insert chunk with the failing key cut short after its table call.
        FaultCase{"insert_cut_after_table_call", Phase::kInsert, 0, Fault::kAfterTableCall, false,
                  0},
        // The chunk after it faults as it begins, with it in flight (its late read not come).
        FaultCase{"insert_begins_with_one_in_flight", Phase::kInsert, 1, Fault::kBegin, true, 0},
        // ... or after its own table call: one chunk read by the drain, one undone.
        FaultCase{"insert_cut_with_one_in_flight", Phase::kInsert, 1, Fault::kAfterTableCall, true,
                  0},
        FaultCase{"lookup_cut_with_one_in_flight", Phase::kLookup, 2, Fault::kAfterTableCall, true,
                  0},
        FaultCase{"erase_cut_after_table_call", Phase::kErase, 0, Fault::kAfterTableCall, true,
                  300}),
    [](const auto& info) { return std::string(info.param.name); });

// A fault between steps drains the card's chunks in flight with the bounded wait the step uses
// (the communicator's), not a bare Stream::synchronize: on a GPU a step's collective may be
// pending on the stream, and a peer that never joins it would hang a bare wait for ever. Card 1's
// stream holds, behind its first insert chunk, a collective whose peer never arrives (simulated:
// work that ends only when the group is aborted, as NCCL's kernels end at ncclCommAbort); card 0
// waits in a barrier that card 1 never joins, and the group's timeout (300 ms) aborts the group.
// Card 1's next chunk faults: its drain fails within the bound, naming the card, the pass and
// the wait (before: the bare wait returned after the abort and the work went on as if the card
// were sound).
TEST(NextPassFaultDrain, FailsWithinTheGroupTimeoutWhenAPeerNeverJoins) {
  GPUBOX_REQUIRE_CARDS(2);
  const DeferredStreams deferred(true);
  Tiers early(2, chunked(50));
  const std::unique_ptr<comm::CommGroup> group =
      comm::make_in_process_group(2, std::chrono::milliseconds(300));
  early.wait_through(*group);
  const auto a = pass_keys(240, 0, 1);
  const auto b = pass_keys(240, 1u << 12, 2);
  early.manager->begin_pass(a);
  const StagedRows staged = early.manager->stage_rows(b, {}, a);
  early.manager->expect_next_pass(sorted(a), poll_after(&staged, 0));
  comm::CommGroup& peers = *group;
  std::string waited_error;
  std::string drain_error;
  double drain_seconds = -1;
  early.card_set.run_on_cards([&](device::Card& card) {
    if (card.local_index() == 0) {
      try {
        peers.at(0).barrier(card.stream());
      } catch (const std::exception& e) {
        waited_error = e.what();
      }
      return;
    }
    for (int i = 0; i < 200 && early.manager->next_pass_phase(1) != Phase::kInsert; ++i) {
      early.manager->prepare_next_pass(1);
    }
    ASSERT_EQ(early.manager->next_pass_phase(1), Phase::kInsert);
    early.manager->prepare_next_pass(1);  // the first insert chunk, in flight
    device::enqueue(card.stream(), "a collective whose peer never arrives", [&peers] {
      while (!peers.aborted()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    early.manager->fail_next_pass_chunk_after(0, Phase::kInsert, Fault::kBegin);
    const auto start = std::chrono::steady_clock::now();
    try {
      for (int i = 0; i < 12; ++i) early.manager->prepare_next_pass(1);
    } catch (const std::exception& e) {
      drain_error = e.what();
    }
    drain_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  EXPECT_FALSE(waited_error.empty()) << "card 0's barrier did not time out";
  EXPECT_TRUE(group->aborted());
  const std::string pass = "during pass " + std::to_string(early.manager->current().pass_id);
  EXPECT_NE(drain_error.find("card 1: the next pass's card work " + pass), std::string::npos)
      << "the drain did not fail naming the card and the pass: '" << drain_error << "'";
  EXPECT_NE(drain_error.find("the chunks in flight when a fault stopped it"), std::string::npos)
      << drain_error;
  EXPECT_GE(drain_seconds, 0.0);
  EXPECT_LT(drain_seconds, 30.0) << "the drain did not fail within the bound";
}

// A wait of the fault drain that fails: the error names the card and the pass, then the wait's
// own message (here a step context, as the communicator's), its location kept apart from the
// user's line (common/error_report.hpp), never in the middle of it.
TEST(NextPassFaultDrain, AFailedWaitNamesTheCardAndThePassBeforeItsCause) {
  GPUBOX_REQUIRE_CARDS(1);
  Tiers early(1, chunked(50));
  early.manager->set_card_wait([](int, const device::Stream& stream, const char*) {
    stream.synchronize();
    GPUBOX_FAIL("pass 7, step 3: a peer never joined");
  });
  const auto a = pass_keys(240, 0, 1);
  early.manager->begin_pass(a);
  const StagedRows staged = early.manager->stage_rows(pass_keys(240, 1u << 12, 2), {}, a);
  early.manager->expect_next_pass(sorted(a), poll_after(&staged, 0));
  early.manager->fail_next_pass_chunk_after(0, Phase::kInsert, Fault::kAfterTableCall);
  early.prepare_until(Phase::kInsert);
  ASSERT_EQ(early.manager->next_pass_phase(0), Phase::kInsert);
  try {
    early.manager->prepare_next_pass(0);
    ADD_FAILURE() << "the drain's wait did not fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "card 0: the next pass's card work during pass " +
                               std::to_string(early.manager->current().pass_id) +
                               " could not wait for the chunks in flight when a fault stopped it: "
                               "pass 7, step 3: a peer never joined");
    EXPECT_NE(e.where().find("pass_manager_error_test.cu:"), std::string::npos) << e.where();
  }
}

// The undo of an insert chunk cut short by a fault runs between steps as the chunk itself does:
// no card or pinned allocation and no pageable copy (it read its rows back into std::vectors and
// made five card buffers), its waits counted. The chunk holds a key that does not take its row
// (placed on the card after the look-ups), so both halves run: the rows nobody took back to the
// free list, the keys that took theirs erased. The card is then exact: its dump's count is its
// size(), its rows those of an engine without the work plus the key placed (an unordered_map
// oracle), and the next begin_pass places the oracle's rows.
TEST(NextPassFaultDrain, UndoAllocatesNothingAndCopiesNoPageableMemory) {
  GPUBOX_REQUIRE_CARDS(1);
  TiersPair engines(1, chunked(50));
  Tiers& early = engines.early;
  Tiers& reference = engines.reference;
  const auto a = pass_keys(240, 0, 1);
  const auto b = pass_keys(240, 1u << 12, 2);
  early.manager->begin_pass(a);
  reference.manager->begin_pass(a);
  const StagedRows staged = early.manager->stage_rows(b, {}, a);
  early.manager->expect_next_pass(sorted(a), poll_after(&staged, 0));
  early.manager->fail_next_pass_chunk_after(0, Phase::kInsert, Fault::kAfterTableCall);
  early.prepare_until(Phase::kInsert);
  ASSERT_EQ(early.manager->next_pass_phase(0), Phase::kInsert);
  ASSERT_NO_FATAL_FAILURE(place_first_staged(early, staged));
  device::Card& card = early.card_set.card(0);
  const device::DeviceCounts before = card.counts();
  early.prepare(1);
  const device::DeviceCounts undo = card.counts() - before;
  ASSERT_EQ(early.manager->next_pass_phase(0), Phase::kOff) << "the fault never struck";
  EXPECT_EQ(undo.allocations, 0u);
  EXPECT_EQ(undo.pinned_allocations, 0u);
  EXPECT_EQ(undo.pageable_copies, 0u);
  EXPECT_GT(undo.pinned_copies, 0u);
  EXPECT_EQ(undo.host_syncs, 3u);  // the drain's wait, the undo's two

  Rows oracle = reference.card_rows();
  const auto stride = static_cast<std::size_t>(early.stores[0]->record_stride());
  oracle[staged.keys[0]].assign(staged.rows.begin(), staged.rows.begin() + stride);
  Rows now;
  ASSERT_NO_THROW(now = early.card_rows()) << "the card's count of keys is off";
  EXPECT_EQ(now, oracle);
  early.manager->end_pass();
  reference.manager->end_pass();
  const PassStats got = early.manager->begin_pass(b, {}, &staged);
  reference.manager->begin_pass(b);
  EXPECT_EQ(got.early_inserted, 0u);
  EXPECT_EQ(early.card_rows(), reference.card_rows());
}

}  // namespace
}  // namespace gpubox::pass
