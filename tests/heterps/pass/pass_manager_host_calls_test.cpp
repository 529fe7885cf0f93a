// The pass boundary's host-tier calls on threads made once (PassCards::host_calls and
// staging_calls, heterps/pass/host_call_workers.hpp): a pass manager starts its (cards + 2) x
// pulls_in_flight threads when it is made and none in a pass (begin_pass's pulls, a staging's
// fetch, end_pass's pushes, each in many host_batch_keys chunks), every call runs on one of them
// (never the caller's thread), a staging's pulls run staging_nice below the others, and what
// crosses the tiers is what one chunk at a time gives. Part of the pass_manager_error_test binary
// (its Tiers).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/hash.hpp"
#include "common/thread_priority.hpp"
#include "heterps/card_table/card_store.hpp"
#include "heterps/device/card.hpp"
#include "heterps/pass/host_call_workers.hpp"
#include "heterps/pass/pass_manager.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/heterps/pass/pass_manager_error_test_util.hpp"
#include "tests/table/forwarding_host_tier.hpp"

namespace gpubox::pass {
namespace {

using error_test::pass_keys;
using error_test::Tiers;

// The host tier of `tiers`, recording the thread (and its nice value) of every pull, peek and
// push that reaches it.
class RecordingHost : public table::testing::ForwardingHostTier {
 public:
  struct Call {
    std::thread::id thread;
    int nice = 0;
  };
  using ForwardingHostTier::ForwardingHostTier;
  Status pull(const uint64_t* k, const int32_t* s, std::size_t n, float* r,
              std::size_t* c) override {
    record();
    return ForwardingHostTier::pull(k, s, n, r, c);
  }
  Status peek(const uint64_t* k, const int32_t* s, std::size_t n, float* r,
              std::size_t* u) override {
    record();
    return ForwardingHostTier::peek(k, s, n, r, u);
  }
  Status push(const uint64_t* k, std::size_t n, const float* r) override {
    record();
    return ForwardingHostTier::push(k, n, r);
  }
  // The calls since the last take, and none kept.
  std::vector<Call> take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(calls_);
  }

 private:
  void record() {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back({std::this_thread::get_id(), thread_nice()});
  }
  std::mutex mu_;
  std::vector<Call> calls_;
};

// `tiers` with its pass manager made again over `host` (which wraps tiers.host).
void call_through(Tiers& tiers, table::HostTier& host, const PassManagerOptions& options) {
  tiers.manager.reset();
  std::vector<card_table::CardSparseStore*> stores;
  for (const auto& store : tiers.stores) stores.push_back(store.get());
  tiers.manager = std::make_unique<PassManager>(tiers.card_set, stores, host, options);
}

// Rows the cards create in a pass (as steps do for keys the pass did not hold): `n` new keys of
// each card, owned by it, created dirty, so end_pass pushes them (in chunks too).
void create_rows_on_cards(Tiers& tiers, std::size_t n, uint64_t seed) {
  const int total = tiers.card_set.total_cards();
  for (int c = 0; c < tiers.card_set.num_local_cards(); ++c) {
    std::vector<uint64_t> keys;
    for (uint64_t k = seed << 32; keys.size() < n; k += 2) {
      if (owner_card(k | 1, total) == c) keys.push_back(k | 1);
    }
    device::Card& card = tiers.card_set.card(c);
    auto d_keys = device::to_device(keys, card.memory(), card.stream());
    auto d_rows = card.make_buffer<card_table::row_index_t>(keys.size());
    tiers.stores[static_cast<std::size_t>(c)]->lookup_or_create(
        d_keys.data(), nullptr, keys.size(), d_rows.data(), /*create_missing=*/true, nullptr,
        card.stream());
  }
}

TEST(PassHostCalls, ThreadsMadeOnceNoneInAPassSameRowsAsOneChunk) {
  for (const int cards : {1, 2}) {
    GPUBOX_REQUIRE_CARDS(cards);
    SCOPED_TRACE(std::to_string(cards) + " cards");
    PassManagerOptions chunked;
    chunked.host_batch_keys = 16;  // 300 keys a pass: ~10 chunks a card, more than in flight
    chunked.pulls_in_flight = 3;
    PassManagerOptions whole;  // the reference: every pull and push in one chunk
    whole.pulls_in_flight = 1;
    const auto pool_threads = static_cast<std::size_t>((cards + 2) * 3);
    const std::uint64_t before = HostCallWorkers::threads_started();
    Tiers tiers(cards, chunked);
    EXPECT_EQ(HostCallWorkers::threads_started() - before, pool_threads);
    RecordingHost recording(*tiers.host);
    call_through(tiers, recording, chunked);
    Tiers reference(cards, whole);
    const std::uint64_t made = HostCallWorkers::threads_started();
    std::set<std::thread::id> threads;
    std::size_t calls = 0;
    for (int pass = 0; pass < 3; ++pass) {
      SCOPED_TRACE("pass " + std::to_string(pass));
      const auto keys = pass_keys(300, static_cast<uint64_t>(pass) * 200, 40 + pass);
      if (pass == 2) {  // this pass's rows staged ahead (the pipeline's fetch), then begun
        std::vector<uint64_t> resident = tiers.manager->resident_keys();
        std::sort(resident.begin(), resident.end());
        const StagedRows staged = tiers.manager->stage_rows(keys, {}, resident);
        tiers.manager->begin_pass(keys, {}, &staged);
      } else {
        tiers.manager->begin_pass(keys);
      }
      reference.manager->begin_pass(keys);
      EXPECT_EQ(tiers.card_rows(), reference.card_rows());
      create_rows_on_cards(tiers, 100, 9 + static_cast<uint64_t>(pass));
      create_rows_on_cards(reference, 100, 9 + static_cast<uint64_t>(pass));
      const PassStats stats = tiers.manager->end_pass();
      EXPECT_EQ(stats.written_back, reference.manager->end_pass().written_back);
      EXPECT_GE(stats.written_back, 100u * static_cast<uint64_t>(cards));
      EXPECT_EQ(tiers.host_rows(), reference.host_rows());
      for (const RecordingHost::Call& call : recording.take()) {
        threads.insert(call.thread);
        ++calls;
      }
    }
    EXPECT_EQ(HostCallWorkers::threads_started(), made) << "threads started in the passes";
    EXPECT_GT(calls, pool_threads) << "more chunks than threads: the threads are reused";
    EXPECT_LE(threads.size(), pool_threads);
    EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u) << "a call on the caller's thread";
  }
}

// runner.staging_nice: a staging's pulls run that much below the steps' priority (their threads
// made with the pass manager, not by the lowered staging thread), begin_pass's pulls and
// end_pass's pushes at it.
TEST(PassHostCalls, AStagingsPullsRunAtTheStagingNice) {
  GPUBOX_REQUIRE_CARDS(1);
  PassManagerOptions options;
  options.host_batch_keys = 16;
  options.pulls_in_flight = 2;
  options.staging_nice = 4;
  const int steps_nice = thread_nice();
  Tiers tiers(1, options);
  RecordingHost recording(*tiers.host);
  call_through(tiers, recording, options);
  const auto first = pass_keys(200, 0, 5);
  tiers.manager->begin_pass(first);
  create_rows_on_cards(tiers, 50, 3);
  tiers.manager->end_pass();
  const std::vector<RecordingHost::Call> boundary = recording.take();
  ASSERT_FALSE(boundary.empty());
  for (const RecordingHost::Call& call : boundary) EXPECT_EQ(call.nice, steps_nice);

  const auto second = pass_keys(200, 1000, 6);
  std::vector<uint64_t> resident = tiers.manager->resident_keys();
  std::sort(resident.begin(), resident.end());
  const StagedRows staged = tiers.manager->stage_rows(second, {}, resident);
  const std::vector<RecordingHost::Call> staging = recording.take();
  ASSERT_GT(staging.size(), 2u);  // several chunks, on more than one thread
  for (const RecordingHost::Call& call : staging) {
    EXPECT_EQ(call.nice, std::min(19, steps_nice + 4));
    EXPECT_NE(call.thread, std::this_thread::get_id());
  }
  tiers.manager->begin_pass(second, {}, &staged);
  tiers.manager->end_pass();
  for (const RecordingHost::Call& call : recording.take()) EXPECT_EQ(call.nice, steps_nice);
  EXPECT_EQ(thread_nice(), steps_nice);
}

}  // namespace
}  // namespace gpubox::pass
