// CardTier::clear() and abandon_pass() between passes (the recovery from a restarted server
// drops the cards' contents and reloads a save: trainer_recovery.cpp) keep the pass manager's
// count of the rows an end_pass kept dirty on the cards equal to what the cards hold. Oracle: a
// recount of every card's dirty rows (CardSparseStore::list_entries, dirty only) after each
// boundary. make_room reads that count as the dirty rows it must spare.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/hash.hpp"
#include "heterps/card_table/card_store.hpp"
#include "heterps/card_tier/card_tier.hpp"
#include "heterps/comm/communicator.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "table/sparse_table.hpp"
#include "tests/heterps/device/test_cards.hpp"

namespace gpubox::tier_owner {
namespace {

// Adagrad rows of mf_dim 4, seeded.
table::AccessorConfig accessor() {
  table::AccessorConfig cfg;
  cfg.optimizer.kind = table::SparseOptimizerKind::kAdagrad;
  cfg.mf_dim = 4;
  cfg.seed = 11;
  return cfg;
}

// `n` sorted keys from `first` on.
std::vector<uint64_t> keys_from(uint64_t first, std::size_t n) {
  std::vector<uint64_t> keys(n);
  for (std::size_t i = 0; i < n; ++i) keys[i] = mix64(first + i) | 1;
  std::sort(keys.begin(), keys.end());
  return keys;
}

// The cards, an in-process host tier and the CardTier over them.
struct Tier {
  explicit Tier(int cards)
      : card_set(device::CardSet::from_list(device::testing::card_list(cards))),
        group(comm::make_group(card_set)),
        host(std::move(table::SparseTable::open(accessor(), table::HostTableConfig{}).value())),
        tier(std::make_unique<CardTier>(card_set, *group, *host, accessor(), CardTierOptions{})) {}

  // Steps on every card, each pulling 40 keys of `pass` and pushing seeded gradients: the rows
  // they touch end dirty.
  void train(const std::vector<uint64_t>& pass, uint64_t seed, int steps) {
    const int push_dim = host->layout().push_dim();
    const int pull_dim = host->layout().pull_dim();
    card_set.run_on_cards(
        [&](device::Card& card) {
          const int c = card.local_index();
          std::mt19937_64 rng(seed * 131 + static_cast<uint64_t>(c));
          for (int step = 0; step < steps; ++step) {
            constexpr std::size_t kKeys = 40;
            std::vector<uint64_t> keys(kKeys);
            std::vector<float> grads(kKeys * push_dim);
            for (std::size_t i = 0; i < kKeys; ++i) {
              keys[i] = pass[rng() % pass.size()];
              grads[i * push_dim] = 1.0f;  // a show
              for (int d = 1; d < push_dim; ++d) {
                grads[i * push_dim + d] = static_cast<float>(rng() % 201) / 1000.0f - 0.1f;
              }
            }
            auto d_keys = device::to_device(keys, card.memory(), card.stream());
            auto d_grads = device::to_device(grads, card.memory(), card.stream());
            auto d_pull = card.make_buffer<float>(kKeys * pull_dim);
            tier->pull(c, d_keys.data(), kKeys, d_pull.data(), card.stream());
            tier->push_pulled(c, d_grads.data(), card.stream());
          }
          card.stream().synchronize();
        },
        [&](const std::string& why) { group->abort(why); });
  }

  // The dirty rows every card holds now, counted on the cards.
  uint64_t dirty_rows() {
    uint64_t dirty = 0;
    for (int c = 0; c < tier->num_cards(); ++c) {
      device::Card& card = card_set.card(c);
      device::device_buffer<uint64_t> keys(0, card.memory(), card.stream());
      device::device_buffer<card_table::row_index_t> rows(0, card.memory(), card.stream());
      dirty += tier->store(c).list_entries(/*dirty_only=*/true, keys, rows, card.stream());
      card.stream().synchronize();
    }
    return dirty;
  }

  device::CardSet card_set;
  std::unique_ptr<comm::CommGroup> group;
  std::unique_ptr<table::SparseTable> host;
  std::unique_ptr<CardTier> tier;
};

// Pass A trains, ends keeping the rows of pass B (which overlaps it) dirty on the cards: the
// count is what the cards hold. Then `drop` empties the cards between passes (clear(), or
// abandon_pass() with no pass open, as drop_card_work calls it): the count follows them to 0.
// A pass after it keeps its own count, and sync() writes every kept row. On 2 cards, or the one
// a one-GPU machine has.
void count_follows_the_cards(const std::function<void(CardTier&)>& drop) {
  Tier t(device::testing::cards_here(2));
  const std::vector<uint64_t> a = keys_from(0, 200);
  const std::vector<uint64_t> b = keys_from(100, 200);  // half of it in a
  t.tier->begin_pass(a, {}, nullptr, pass::PassAccess::kTrain);
  t.train(a, 1, 6);
  const pass::PassStats ended = t.tier->end_pass(b);
  const uint64_t kept = t.dirty_rows();
  ASSERT_GT(kept, 0u) << "pass A dirtied none of B's rows: the test proves nothing";
  EXPECT_EQ(ended.kept_dirty, kept);
  EXPECT_EQ(t.tier->kept_dirty(), kept);

  drop(*t.tier);
  EXPECT_EQ(t.dirty_rows(), 0u);
  EXPECT_EQ(t.tier->kept_dirty(), 0u) << "the rows kept dirty went with the cards";

  const pass::PassStats began = t.tier->begin_pass(b, {}, nullptr, pass::PassAccess::kTrain);
  EXPECT_EQ(began.hits, 0u) << "the cards were emptied";
  t.train(b, 2, 6);
  const std::vector<uint64_t> c = keys_from(250, 100);  // half of it in b
  t.tier->end_pass(c);
  EXPECT_EQ(t.tier->kept_dirty(), t.dirty_rows());
  EXPECT_GT(t.tier->kept_dirty(), 0u);
  t.tier->sync();
  EXPECT_EQ(t.dirty_rows(), 0u);
  EXPECT_EQ(t.tier->kept_dirty(), 0u);
}

TEST(CardTierClear, TheRowsKeptDirtyGoWithTheCards) {
  count_follows_the_cards([](CardTier& tier) { tier.clear(); });
}

TEST(CardTierClear, AbandoningBetweenPassesDropsTheRowsKeptDirtyWithTheCards) {
  count_follows_the_cards([](CardTier& tier) {
    ASSERT_FALSE(tier.in_pass());
    tier.abandon_pass();
  });
}

}  // namespace
}  // namespace gpubox::tier_owner
