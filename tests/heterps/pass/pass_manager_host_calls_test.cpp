// The pass boundary's host-tier calls on threads made once (PassCards::host_calls,
// heterps/pass/host_call_workers.hpp): a pass manager starts its (cards + 1) x pulls_in_flight
// threads when it is made and none in a pass (begin_pass's pulls, a staging's fetch, end_pass's
// pushes, each in many host_batch_keys chunks), and what crosses the tiers is what one chunk at a
// time gives. Part of the pass_manager_error_test binary (its Tiers).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/hash.hpp"
#include "heterps/card_table/card_store.hpp"
#include "heterps/device/card.hpp"
#include "heterps/pass/host_call_workers.hpp"
#include "heterps/pass/pass_manager.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/heterps/pass/pass_manager_error_test_util.hpp"

namespace gpubox::pass {
namespace {

using error_test::pass_keys;
using error_test::Tiers;

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
    const std::uint64_t before = HostCallWorkers::threads_started();
    Tiers tiers(cards, chunked);
    EXPECT_EQ(HostCallWorkers::threads_started() - before,
              static_cast<std::uint64_t>((cards + 1) * 3));
    Tiers reference(cards, whole);
    const std::uint64_t made = HostCallWorkers::threads_started();
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
    }
    EXPECT_EQ(HostCallWorkers::threads_started(), made) << "threads started in the passes";
  }
}

}  // namespace
}  // namespace gpubox::pass
