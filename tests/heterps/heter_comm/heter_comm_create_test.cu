// HeterComm's create mode on simulated cards: it counts the rows it creates, on pull and on push;
// a created row takes its slot's width (slot_dims), a key seen in several slots its first slot's;
// a step where only some cards pass slots fails on every card.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/heter_comm/heter_comm.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/heterps/heter_comm/heter_comm_test_util.cuh"
#include "tests/table/slot_dims_config.hpp"

namespace gpubox::heter_comm {
namespace {

using cluster_test::Cluster;
using cluster_test::store_rows;
using cluster_test::test_config;
using table::AccessorConfig;
using table::RowLayout;
using table::SparseOptimizerKind;

// Create mode counts what it creates, on pull and on push (a key pushed without a pull).
TEST(HeterComm, CreateModeCountsCreatedRows) {
  GPUBOX_REQUIRE_CARDS(2);
  const AccessorConfig cfg = test_config(SparseOptimizerKind::kSgd);
  Cluster cluster(2, cfg);
  const int push_dim = RowLayout::make(cfg.optimizer.kind, cfg.mf_dim).push_dim();
  std::vector<uint64_t> pull_keys = {10, 11, 12, 10, 10};  // 3 distinct
  std::vector<uint64_t> push_only = {20, 21, 20};          // 2 distinct, never pulled
  cluster.run([&](device::Card& card) {
    const int c = card.local_index();
    HeterComm& hc = cluster.heter_comm(c);
    // Both cards pull the same keys: each is created once, on its owner.
    auto keys = device::to_device(pull_keys, card.memory(), card.stream());
    auto out = card.make_buffer<float>(pull_keys.size() * hc.pull_dim());
    hc.pull(keys.data(), pull_keys.size(), out.data(), card.stream());
    card.stream().synchronize();  // pull returns with records in flight: wait before allocating
    std::vector<uint64_t> mine = c == 0 ? push_only : std::vector<uint64_t>{};
    auto pk = device::to_device(mine, card.memory(), card.stream());
    auto grads = device::to_device(std::vector<float>(mine.size() * push_dim, 0.5f), card.memory(),
                                   card.stream());
    hc.push(pk.data(), mine.size(), grads.data(), card.stream());
  });
  uint64_t on_pull = 0, on_push = 0, lookups = 0;
  for (int c = 0; c < 2; ++c) {
    on_pull += cluster.heter_comm(c).stats().created_on_pull;
    on_push += cluster.heter_comm(c).stats().created_on_push;
    lookups += cluster.heter_comm(c).stats().owner_lookups;
  }
  EXPECT_EQ(on_pull, 3u);
  EXPECT_EQ(on_push, 2u);
  EXPECT_EQ(cluster.store(0).size() + cluster.store(1).size(), 5u);
  // pull: each card sends 3 unique keys (6 lookups); push: 2 merged keys.
  EXPECT_EQ(lookups, 6u + 2u);
}

// Create mode with the occurrences' slots: with slot_dims (widths 4, 8, 16) every key created on
// pull, or on push (never pulled), takes its slot's width and records its slot, on its owner
// (sharded) or on every replica, against an oracle of each key's width. Without slots a created
// row takes slot 0's width (the default), as before.
TEST(HeterComm, CreateModeGivesEachCreatedRowItsSlotsWidth) {
  GPUBOX_REQUIRE_CARDS(3);
  AccessorConfig base = test_config(SparseOptimizerKind::kAdagrad);
  base.mf_dim = 4;
  const AccessorConfig cfg = table::with_slot_dims(base, {{1, 8}, {2, 16}});
  const auto slot_of = [](uint64_t key) { return static_cast<int32_t>(key % 3); };
  const auto width_of = [](int32_t slot) { return slot == 1 ? 8 : slot == 2 ? 16 : 4; };
  for (const Placement placement : {Placement::kSharded, Placement::kReplicated}) {
    for (const int cards : {1, 2, 3}) {
      for (const bool with_slots : {true, false}) {
        SCOPED_TRACE(std::to_string(cards) + " cards, " +
                     (placement == Placement::kSharded ? "sharded" : "replicated") +
                     (with_slots ? "" : ", no slots"));
        HeterCommOptions options;
        options.placement = placement;
        options.missing_keys = MissingKeyPolicy::kCreate;
        Cluster cluster(cards, cfg, options);
        std::mt19937_64 rng(static_cast<uint64_t>(cards));
        std::vector<std::vector<uint64_t>> pull_keys(cards), push_keys(cards);
        std::set<uint64_t> all;
        for (int c = 0; c < cards; ++c) {
          for (int i = 0; i < 200; ++i) pull_keys[c].push_back(rng() % 300);  // shared, repeated
          for (int i = 0; i < 50; ++i) push_keys[c].push_back(1000 + c * 100 + rng() % 60);
          all.insert(pull_keys[c].begin(), pull_keys[c].end());
          all.insert(push_keys[c].begin(), push_keys[c].end());
        }
        const auto slots_of = [&](const std::vector<uint64_t>& keys) {
          std::vector<int32_t> slots;
          for (const uint64_t key : keys) slots.push_back(slot_of(key));
          return slots;
        };
        cluster.run([&](device::Card& card) {
          const int c = card.local_index();
          HeterComm& hc = cluster.heter_comm(c);
          auto keys = device::to_device(pull_keys[c], card.memory(), card.stream());
          auto slots = device::to_device(slots_of(pull_keys[c]), card.memory(), card.stream());
          auto out = card.make_buffer<float>(pull_keys[c].size() * hc.pull_dim());
          hc.pull(keys.data(), pull_keys[c].size(), out.data(), card.stream(),
                  with_slots ? slots.data() : nullptr);
          card.stream().synchronize();
          auto pk = device::to_device(push_keys[c], card.memory(), card.stream());
          auto ps = device::to_device(slots_of(push_keys[c]), card.memory(), card.stream());
          auto grads =
              device::to_device(std::vector<float>(push_keys[c].size() * hc.push_dim(), 0.5f),
                                card.memory(), card.stream());
          hc.push(pk.data(), push_keys[c].size(), grads.data(), card.stream(),
                  with_slots ? ps.data() : nullptr);
        });
        const RowLayout layout = cluster.store(0).layout();
        std::size_t rows = 0;
        for (int c = 0; c < cards; ++c) {
          for (const auto& [key, row] : store_rows(cluster, c, layout)) {
            ++rows;
            ASSERT_TRUE(all.count(key)) << key;
            const int32_t slot = with_slots ? slot_of(key) : 0;
            EXPECT_EQ(row[layout.mf_dim_offset()], static_cast<float>(width_of(slot)))
                << "key " << key << " on card " << c;
            EXPECT_EQ(row[layout.slot()], static_cast<float>(slot)) << "key " << key;
          }
        }
        EXPECT_EQ(rows, placement == Placement::kSharded ? all.size() : all.size() * cards);
      }
    }
  }
}

// Create mode, a key seen in several slots of different widths (in one card's batch and across
// cards): its row is created at the width of the slot it is seen in first — in rank order, then
// batch order, as the host tier creates a pass's key at its first slot in load order — on pull
// and on push, sharded and replicated, against an oracle of each key's first slot. (The owner
// used to take the narrowest of the slots it received.)
TEST(HeterComm, CreateModeGivesARepeatedKeyItsFirstSlotsWidth) {
  GPUBOX_REQUIRE_CARDS(3);
  AccessorConfig base = test_config(SparseOptimizerKind::kAdagrad);
  base.mf_dim = 4;
  const AccessorConfig cfg = table::with_slot_dims(base, {{1, 8}, {2, 16}, {3, 8}});
  for (const Placement placement : {Placement::kSharded, Placement::kReplicated}) {
    for (const int cards : {1, 2, 3}) {
      SCOPED_TRACE(std::to_string(cards) + " cards, " +
                   (placement == Placement::kSharded ? "sharded" : "replicated"));
      HeterCommOptions options;
      options.placement = placement;
      options.missing_keys = MissingKeyPolicy::kCreate;
      Cluster cluster(cards, cfg, options);
      std::mt19937_64 rng(static_cast<uint64_t>(40 + cards));
      std::vector<std::vector<uint64_t>> pull_keys(cards), push_keys(cards);
      std::vector<std::vector<int32_t>> pull_slots(cards), push_slots(cards);
      std::map<uint64_t, int32_t> first_slot;  // the oracle: rank order, then batch order
      for (int c = 0; c < cards; ++c) {
        for (int i = 0; i < 150; ++i) {
          pull_keys[c].push_back(1 + rng() % 40);  // few keys, each in several slots
          pull_slots[c].push_back(static_cast<int32_t>(rng() % 4));
          first_slot.emplace(pull_keys[c].back(), pull_slots[c].back());
        }
      }
      for (int c = 0; c < cards; ++c) {
        for (int i = 0; i < 60; ++i) {
          push_keys[c].push_back(1000 + rng() % 30);  // never pulled: created on push
          push_slots[c].push_back(static_cast<int32_t>(rng() % 4));
          first_slot.emplace(push_keys[c].back(), push_slots[c].back());
        }
      }
      cluster.run([&](device::Card& card) {
        const int c = card.local_index();
        HeterComm& hc = cluster.heter_comm(c);
        auto keys = device::to_device(pull_keys[c], card.memory(), card.stream());
        auto slots = device::to_device(pull_slots[c], card.memory(), card.stream());
        auto out = card.make_buffer<float>(pull_keys[c].size() * hc.pull_dim());
        hc.pull(keys.data(), pull_keys[c].size(), out.data(), card.stream(), slots.data());
        card.stream().synchronize();
        auto pk = device::to_device(push_keys[c], card.memory(), card.stream());
        auto ps = device::to_device(push_slots[c], card.memory(), card.stream());
        auto grads =
            device::to_device(std::vector<float>(push_keys[c].size() * hc.push_dim(), 0.5f),
                              card.memory(), card.stream());
        hc.push(pk.data(), push_keys[c].size(), grads.data(), card.stream(), ps.data());
      });
      const RowLayout layout = cluster.store(0).layout();
      std::size_t rows = 0;
      for (int c = 0; c < cards; ++c) {
        for (const auto& [key, row] : store_rows(cluster, c, layout)) {
          ++rows;
          ASSERT_TRUE(first_slot.count(key)) << key;
          const int32_t slot = first_slot.at(key);
          EXPECT_EQ(row[layout.slot()], static_cast<float>(slot)) << "key " << key << " card " << c;
          EXPECT_EQ(row[layout.mf_dim_offset()], static_cast<float>(table::slot_mf_dim(cfg, slot)))
              << "key " << key << " on card " << c;
        }
      }
      EXPECT_EQ(rows,
                placement == Placement::kSharded ? first_slot.size() : first_slot.size() * cards);
    }
  }
}

// Create mode: every card of a step passes slots or none does. When some do and some do not,
// every card fails with the same error naming both sides, agreed with the key counts before
// any key moves (without the check the slot exchange of one card met the key exchange of
// another: a hang until the group's timeout, or garbage). Sharded and replicated, on pull and
// push, 2 and 3 cards, either side; the group's timeout (5 s) bounds the test if it regresses.
// (A card that sees the group aborted by a peer's error first reports the peer's message.)
TEST(HeterComm, CreateModeSlotsOnSomeCardsOnlyFailsEveryCard) {
  GPUBOX_REQUIRE_CARDS(3);
  AccessorConfig base = test_config(SparseOptimizerKind::kAdagrad);
  base.mf_dim = 4;
  const AccessorConfig cfg = table::with_slot_dims(base, {{1, 8}});
  for (const Placement placement : {Placement::kSharded, Placement::kReplicated}) {
    for (const int cards : {2, 3}) {
      for (const int odd_card : {0, cards - 1}) {
        for (const bool on_push : {false, true}) {
          SCOPED_TRACE(std::to_string(cards) + " cards, odd card " + std::to_string(odd_card) +
                       (placement == Placement::kSharded ? ", sharded" : ", replicated") +
                       (on_push ? ", push" : ", pull"));
          HeterCommOptions options;
          options.placement = placement;
          options.missing_keys = MissingKeyPolicy::kCreate;
          Cluster cluster(cards, cfg, options, {}, std::chrono::seconds(5));
          // Only odd_card passes slots (odd_card 0), or all but it (the last card).
          const auto gives_slots = [&](int c) { return (c == odd_card) == (odd_card == 0); };
          std::vector<std::string> errors(cards);
          const auto started = std::chrono::steady_clock::now();
          const auto step = [&] {
            cluster.run([&](device::Card& card) {
              const int c = card.local_index();
              HeterComm& hc = cluster.heter_comm(c);
              std::vector<uint64_t> host_keys;
              for (uint64_t k = 0; k < 40; ++k) host_keys.push_back(1 + k * 7 + c);
              const std::vector<int32_t> host_slots(host_keys.size(), 1);
              auto keys = device::to_device(host_keys, card.memory(), card.stream());
              auto slots = device::to_device(host_slots, card.memory(), card.stream());
              const int32_t* given = gives_slots(c) ? slots.data() : nullptr;
              auto grads = card.make_buffer<float>(host_keys.size() * hc.push_dim());
              auto out = card.make_buffer<float>(host_keys.size() * hc.pull_dim());
              try {
                if (on_push) {
                  hc.push(keys.data(), host_keys.size(), grads.data(), card.stream(), given);
                } else {
                  hc.pull(keys.data(), host_keys.size(), out.data(), card.stream(), given);
                  card.stream().synchronize();
                }
              } catch (const Error& e) {
                errors[c] = e.what();
                throw;
              }
            });
          };
          EXPECT_THROW(step(), Error);
          EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(4))
              << "the cards waited for the group's timeout instead of failing at once";
          std::string with, without;
          for (int c = 0; c < cards; ++c) {
            std::string& side = gives_slots(c) ? with : without;
            side += (side.empty() ? "" : ",") + std::to_string(c);
          }
          for (int c = 0; c < cards; ++c) {
            EXPECT_NE(errors[c].find("cards " + with + " passed the keys' slots and cards " +
                                     without + " did not"),
                      std::string::npos)
                << "card " << c << ": " << errors[c];
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace gpubox::heter_comm
