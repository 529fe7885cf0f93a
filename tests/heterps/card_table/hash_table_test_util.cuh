// Shared helpers of CardHashTable's tests (hash_table_test.cu, hash_table_wait_free_test.cu):
// keys that collide or are distinct, the comparison of two tables fed the same keys (one by the
// forms that read counts back, one by the wait-free forms), and the memory tests' table.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "common/hash.hpp"
#include "heterps/card_table/hash_table.cuh"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"

namespace gpubox::card_table::hash_table_test {

// Keys whose mix64 shares its low `bits` bits start probing at the same slot of every table of
// up to 2^bits slots.
inline std::vector<uint64_t> colliding_keys(std::size_t count, int bits) {
  std::vector<uint64_t> keys;
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  for (uint64_t k = 1; keys.size() < count; ++k) {
    if ((mix64(k) & mask) == 0) keys.push_back(k);
  }
  return keys;
}

// `n` keys in [1, 1000000] not in `seen`, each added to it.
inline std::vector<uint64_t> distinct_keys(std::mt19937_64& rng, std::size_t n,
                                           std::set<uint64_t>* seen) {
  std::vector<uint64_t> keys;
  while (keys.size() < n) {
    const uint64_t k = rng() % 1000000 + 1;
    if (seen->insert(k).second) keys.push_back(k);
  }
  return keys;
}

// The rows on `table`'s free list, in the order the next inserts take them.
inline std::vector<row_index_t> free_list(const CardHashTable& table,
                                          const device::Stream& stream) {
  const std::size_t n = table.pool().free_count();
  return device::to_host(table.pool().peek_free(n), n, stream);
}

// Both tables find every key of `keys` at the same row (kInvalidRow where neither holds it):
// the rows found.
inline std::vector<row_index_t> expect_same_finds(const CardHashTable& eager,
                                                  const CardHashTable& late,
                                                  const std::vector<uint64_t>& keys,
                                                  device::Card& card) {
  const device::Stream& stream = card.stream();
  auto d_keys = device::to_device(keys, card.memory(), stream);
  auto eager_rows = card.make_buffer<row_index_t>(keys.size());
  auto late_rows = card.make_buffer<row_index_t>(keys.size());
  eager.find(d_keys.data(), keys.size(), eager_rows.data(), stream);
  late.find(d_keys.data(), keys.size(), late_rows.data(), stream);
  const auto want = device::to_host(eager_rows);
  EXPECT_EQ(device::to_host(late_rows), want);
  return want;
}

// Both tables hold the same keys, rows and free list; every key of `keys` is present.
inline void expect_same(const CardHashTable& eager, const CardHashTable& late,
                        const std::vector<uint64_t>& keys, device::Card& card) {
  const device::Stream& stream = card.stream();
  EXPECT_EQ(late.size(), eager.size());
  EXPECT_EQ(late.erased_slots(), eager.erased_slots());
  EXPECT_EQ(free_list(late, stream), free_list(eager, stream));
  for (const row_index_t row : expect_same_finds(eager, late, keys, card)) {
    EXPECT_NE(row, kInvalidRow);
  }
}

// The memory tests' table: on one active card, small (16 slots, 4-float rows in 64-row pages),
// its slots sized once for `budget` keys (reserve_capacity).
struct BudgetedTable {
  explicit BudgetedTable(std::size_t budget)
      : cards(device::CardSet::from_list("0")),
        card(activated(cards.card(0))),
        options(small_options()),
        table(card, options) {
    table.reserve_capacity(budget, card.stream());
  }
  device::CardSet cards;
  device::Card& card;
  const HashTableOptions options;
  CardHashTable table;

 private:
  static device::Card& activated(device::Card& card) {
    card.activate();
    return card;
  }
  static HashTableOptions small_options() {
    HashTableOptions options;
    options.initial_capacity = 16;
    options.row_stride = 4;
    options.page_rows = 64;
    return options;
  }
};

}  // namespace gpubox::card_table::hash_table_test
