// The next pass's card work (PassManager::expect_next_pass / prepare_next_pass) when a fault
// stops it, and the sizing of its inserts (issue 31, item 1: nothing grows between a pass's
// steps), on 1-2 simulated cards with the in-process host tier. Its fault drain waits with the
// communicator's bounded wait (a peer that never joins fails it in time; a failed wait is named
// by card and pass before its cause, its location apart), its undo allocates nothing, its
// inserts under a budget find the erased slots reclaimed at the boundary, and with several
// trainers nothing is sized for it.
//
// Oracles: an engine without the work (next_pass_chunk_keys 0) given the same passes, whose
// card rows, read through a dump of each card's table, must equal the working engine's as
// std::unordered_map key -> row after every begin_pass, and whose host tier must equal its row
// for row after every end_pass; and, right after a fault, every key on a card is the current
// pass's (the oracle's row) or a staged key of the next one (its staged row). The dump fails when
// a table's count of keys (size()) differs from the keys it holds: a row taken off the free list
// and never given back shows there.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "heterps/card_table/card_store.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/deferred.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/pass/pass_manager.hpp"
#include "table/sparse_row/accessor.hpp"
#include "table/sparse_table.hpp"
#include "tests/heterps/device/test_cards.hpp"

namespace gpubox::pass {
namespace {

using Phase = NextPassCard::Phase;
using Fault = NextPassWork::ChunkFault;
using Rows = std::unordered_map<uint64_t, std::vector<float>>;

// Cards, their stores, a host tier and a pass manager; no steps (the rows move between the tiers
// bit for bit, trained or not).
std::string card_list(int cards) {
  std::string list;
  for (int c = 0; c < cards; ++c) list += (c ? "," : "") + std::to_string(c);
  return list;
}

struct Tiers {
  // `trainers`: this process is trainer 0 of that many, each with `cards` cards.
  Tiers(int cards, const PassManagerOptions& options, int trainers = 1)
      : card_set(device::CardSet::from_list(card_list(cards), 0, trainers)) {
    table::AccessorConfig cfg;
    cfg.optimizer.kind = table::SparseOptimizerKind::kAdagrad;
    cfg.mf_dim = 4;
    cfg.embedx_threshold = 0.0f;  // every row has its embedx: records differ key by key
    cfg.optimizer.mf_initial_range = 0.01f;
    cfg.seed = 17;
    host = std::move(table::SparseTable::open(cfg, table::HostTableConfig{}).value());
    std::vector<card_table::CardSparseStore*> raw;
    for (int c = 0; c < cards; ++c) {
      stores.push_back(std::make_unique<card_table::CardSparseStore>(card_set.card(c), cfg));
      raw.push_back(stores.back().get());
    }
    manager = std::make_unique<PassManager>(card_set, raw, *host, options);
  }

  // Card c's rows by key, through a dump of its table (GPUBOX_EXPECTS: its count is size()).
  Rows card_rows(int c) {
    device::Card& card = card_set.card(c);
    const device::Stream& stream = card.stream();
    card_table::CardSparseStore& store = *stores[static_cast<std::size_t>(c)];
    const std::size_t room = store.table().capacity() + 2;  // every slot, the side slots
    auto keys = card.make_buffer<uint64_t>(room);
    auto rows = card.make_buffer<card_table::row_index_t>(room);
    const std::size_t n = store.table().dump(keys.data(), rows.data(), stream);
    auto records = card.make_buffer<float>(n * static_cast<std::size_t>(store.record_stride()));
    store.read_rows(keys.data(), n, records.data(), stream);
    const std::vector<uint64_t> host_keys = device::to_host(keys.data(), n, stream);
    const std::vector<float> host_records = device::to_host(records.data(), records.size(), stream);
    Rows out;
    const auto stride = static_cast<std::size_t>(store.record_stride());
    for (std::size_t i = 0; i < n; ++i) {
      out[host_keys[i]].assign(host_records.begin() + i * stride,
                               host_records.begin() + (i + 1) * stride);
    }
    return out;
  }
  Rows card_rows() {
    Rows all;
    for (int c = 0; c < card_set.num_local_cards(); ++c) all.merge(card_rows(c));
    return all;
  }
  Rows host_rows() {
    Rows out;
    const auto stride = static_cast<std::size_t>(host->layout().stride());
    throw_if_error(host->for_each_row(
        [&](uint64_t key, const float* row) { out[key].assign(row, row + stride); }));
    return out;
  }
  // The next pass's work waits between steps through `group`'s bounded wait, as in a card tier.
  void wait_through(comm::CommGroup& group) {
    manager->set_card_wait([&group](int c, const device::Stream& stream, const char* what) {
      group.at(c).synchronize(stream, what);
    });
  }
  // Card 0's next-pass work until it reaches `phase` (or stops), on the calling thread.
  void prepare_until(Phase phase) {
    for (int i = 0; i < 200 && manager->next_pass_phase(0) != phase &&
                    manager->next_pass_phase(0) != Phase::kOff;
         ++i) {
      manager->prepare_next_pass(0);
    }
  }
  // `rounds` chunks of the next pass's work on every card, each on its card's thread.
  void prepare(int rounds) {
    card_set.run_on_cards([&](device::Card& card) {
      for (int i = 0; i < rounds; ++i) manager->prepare_next_pass(card.local_index());
    });
  }

  device::CardSet card_set;
  std::unique_ptr<table::SparseTable> host;
  std::vector<std::unique_ptr<card_table::CardSparseStore>> stores;
  std::unique_ptr<PassManager> manager;
};

// `n` distinct seeded keys in [base, base + 4n), mixed.
std::vector<uint64_t> pass_keys(std::size_t n, uint64_t base, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::set<uint64_t> keys;
  while (keys.size() < n) keys.insert((base + rng() % (4 * n)) * 0x9E3779B97F4A7C15ULL | 1);
  return {keys.begin(), keys.end()};
}

std::shared_ptr<const std::vector<uint64_t>> sorted(std::vector<uint64_t> keys) {
  std::sort(keys.begin(), keys.end());
  return std::make_shared<const std::vector<uint64_t>>(std::move(keys));
}

// Nothing for the first `polls` calls (every card's together), then `staged`, planned and
// fetched.
std::function<StagingProgress()> poll_after(const StagedRows* staged, int polls) {
  return [staged, polls, count = std::make_shared<std::atomic<int>>(0)] {
    if (count->fetch_add(1) < polls) return StagingProgress{};
    return StagingProgress{staged, true};
  };
}

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
  PassManagerOptions options;
  options.card_row_budget = tc.row_budget;
  options.next_pass_chunk_keys = 50;
  options.next_pass_step_fraction = 0;
  Tiers early(1, options);
  options.next_pass_chunk_keys = 0;
  Tiers reference(1, options);
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
        PassManagerOptions options;
        options.next_pass_chunk_keys = 100;
        options.next_pass_step_fraction = 0;
        Tiers early(cards, options);
        options.next_pass_chunk_keys = 0;
        Tiers reference(cards, options);
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
  PassManagerOptions options;
  options.next_pass_chunk_keys = 50;
  options.next_pass_step_fraction = 0;
  Tiers early(2, options);
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
  PassManagerOptions options;
  options.next_pass_chunk_keys = 50;
  options.next_pass_step_fraction = 0;
  Tiers early(1, options);
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
  PassManagerOptions options;
  options.next_pass_chunk_keys = 50;
  options.next_pass_step_fraction = 0;
  Tiers early(1, options);
  options.next_pass_chunk_keys = 0;
  Tiers reference(1, options);
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
    PassManagerOptions options;
    options.card_row_budget = 500;
    options.next_pass_chunk_keys = 50;
    options.next_pass_step_fraction = 0;
    Tiers early(1, options);
    options.next_pass_chunk_keys = 0;
    Tiers reference(1, options);
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
    early.manager->expect_next_pass(sorted(a), poll_after(&staged, 0));
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
  PassManagerOptions options;
  options.next_pass_chunk_keys = 100;
  options.next_pass_step_fraction = 0;
  Tiers tiers(1, options, /*trainers=*/2);
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
