// The card store's eviction policy (heterps/card_table/eviction_policy.hpp): the victims chosen at
// once (select_victims) and as a listing goes (VictimHeap) against a full sort of the candidates,
// and the store's ranks (CardSparseStore::eviction_ranks) against the accessor's row score.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "heterps/card_table/card_store.hpp"
#include "heterps/card_table/eviction_policy.hpp"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"

namespace gpubox::card_table {
namespace {

// Candidates with many tied ranks (the key then decides), keys distinct.
std::vector<EvictionCandidate> random_candidates(std::mt19937_64& rng, std::size_t n) {
  std::vector<EvictionCandidate> out;
  std::set<uint64_t> keys;
  while (out.size() < n) {
    const uint64_t key = rng() % (4 * n + 1);
    if (!keys.insert(key).second) continue;
    out.push_back({static_cast<float>(rng() % 7) * 0.5f - 1.0f, key});
  }
  return out;
}

// The oracle: the keys of the `count` first candidates in (rank, key) order.
std::set<uint64_t> first_keys(std::vector<EvictionCandidate> candidates, std::size_t count) {
  std::sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.rank, a.key) < std::make_pair(b.rank, b.key);
  });
  std::set<uint64_t> keys;
  for (std::size_t i = 0; i < std::min(count, candidates.size()); ++i) {
    keys.insert(candidates[i].key);
  }
  return keys;
}

std::set<uint64_t> keys_of(const std::vector<EvictionCandidate>& candidates, std::size_t count) {
  std::set<uint64_t> keys;
  for (std::size_t i = 0; i < count; ++i) keys.insert(candidates[i].key);
  return keys;
}

TEST(EvictionPolicy, LeavesBeforeIsRankThenKey) {
  EXPECT_TRUE(leaves_before({0.5f, 9}, {1.0f, 1}));
  EXPECT_FALSE(leaves_before({1.0f, 1}, {0.5f, 9}));
  EXPECT_TRUE(leaves_before({1.0f, 1}, {1.0f, 2}));
  EXPECT_FALSE(leaves_before({1.0f, 2}, {1.0f, 2}));
}

TEST(EvictionPolicy, SelectVictimsMatchesASortedOracle) {
  std::mt19937_64 rng(7);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{1000}}) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, n / 2, n}) {
      if (count > n) continue;
      SCOPED_TRACE(testing::Message() << n << " candidates, " << count << " victims");
      std::vector<EvictionCandidate> candidates = random_candidates(rng, n);
      const std::set<uint64_t> expected = first_keys(candidates, count);
      select_victims(candidates, count);
      EXPECT_EQ(keys_of(candidates, count), expected);
    }
  }
}

TEST(EvictionPolicy, VictimHeapOverChunksMatchesASortedOracle) {
  std::mt19937_64 rng(11);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{500}}) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, n / 3, n, n + 1}) {
      SCOPED_TRACE(testing::Message() << n << " candidates, " << count << " victims");
      const std::vector<EvictionCandidate> candidates = random_candidates(rng, n);
      VictimHeap heap(count);
      // Offered in chunks of random size, as a listing a range of slots at a time would.
      for (std::size_t at = 0; at < n;) {
        const std::size_t chunk = std::min<std::size_t>(n - at, 1 + rng() % 64);
        for (std::size_t i = at; i < at + chunk; ++i) heap.offer(candidates[i]);
        at += chunk;
      }
      EXPECT_EQ(heap.passed_over(), n > count);
      EXPECT_EQ(heap.victims().size(), std::min(count, n));
      EXPECT_EQ(keys_of(heap.victims(), heap.victims().size()), first_keys(candidates, count));
      heap.clear();
      EXPECT_TRUE(heap.victims().empty());
    }
  }
}

TEST(EvictionPolicy, StoreRanksRowsByItsPolicy) {
  device::CardSet cards = device::CardSet::from_list("0");
  device::Card& card = cards.card(0);
  card.activate();
  table::AccessorConfig config;
  config.mf_dim = 4;
  config.nonclk_coeff = 0.1f;
  config.clk_coeff = 2.0f;
  CardSparseStore store(card, config);
  EXPECT_EQ(store.eviction_policy(), EvictionPolicy::kLowestScore);
  // Rows with chosen show and click: the rank is the accessor's score of each.
  const std::size_t n = 64;
  const std::size_t stride = static_cast<std::size_t>(store.record_stride());
  const table::RowLayout& layout = store.layout();
  std::vector<uint64_t> keys(n);
  std::vector<float> rows(n * stride, 0.0f);
  std::mt19937_64 rng(3);
  for (std::size_t i = 0; i < n; ++i) {
    keys[i] = 100 + i;
    float* row = rows.data() + i * stride;
    row[table::RowLayout::kShow] = static_cast<float>(rng() % 50);
    row[table::RowLayout::kClick] = static_cast<float>(rng() % 5);
    row[layout.mf_dim_offset()] = static_cast<float>(layout.mf_dim);
  }
  const device::Stream& stream = card.stream();
  auto d_keys = device::to_device(keys, card.memory(), stream);
  auto d_rows = device::to_device(rows, card.memory(), stream);
  store.insert_rows(d_keys.data(), d_rows.data(), n, stream);
  auto d_handles = card.make_buffer<row_index_t>(n);
  store.lookup_or_create(d_keys.data(), nullptr, n, d_handles.data(), /*create_missing=*/false,
                         nullptr, stream);
  auto d_ranks = card.make_buffer<float>(n);
  store.eviction_ranks(d_handles.data(), n, d_ranks.data(), stream);
  const std::vector<float> ranks = device::to_host(d_ranks);
  // Bit for bit: row_score rounds each operation on its own on the card as on the host
  // (table::show_click_score). 6 of these 64 rows have scores that a fused multiply-add (nvcc's
  // default contraction, either way round) would round otherwise: a contracted score fails here.
  std::size_t fused_differs = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float* row = rows.data() + i * stride;
    const float score = table::row_score(row, config);
    EXPECT_EQ(ranks[i], score) << "key " << keys[i];
    const float show = row[table::RowLayout::kShow];
    const float click = row[table::RowLayout::kClick];
    const float nonclk = config.nonclk_coeff * (show - click);
    const float clk = config.clk_coeff * click;
    fused_differs += std::fma(config.nonclk_coeff, show - click, clk) != score ||
                     std::fma(config.clk_coeff, click, nonclk) != score;
  }
  EXPECT_GT(fused_differs, 0u);
}

}  // namespace
}  // namespace gpubox::card_table
