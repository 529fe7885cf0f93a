// CardSparseStore tests' shared pieces (card_store_test.cu, card_store_widths_test.cu): configs,
// exact-bit rows, distinct keys and the one-card fixture that reads a store back.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "heterps/card_table/card_store.cuh"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"

namespace gpubox::card_table::test_util {

using device::Card;
using device::CardSet;
using device::to_device;
using device::to_host;

inline constexpr uint64_t kMaxKey = ~uint64_t{0};

inline table::AccessorConfig test_config(table::SparseOptimizerKind kind) {
  table::AccessorConfig config;
  config.optimizer.kind = kind;
  config.mf_dim = 8;
  config.optimizer.initial_range = 0.5f;
  config.seed = 1234;
  return config;
}

// Rows with arbitrary bit patterns (finite, denormal, signed zero) to check copies are exact.
inline std::vector<float> random_rows(std::mt19937_64& rng, std::size_t n, int32_t stride) {
  std::vector<float> rows(n * static_cast<std::size_t>(stride));
  for (auto& v : rows) {
    uint32_t bits = static_cast<uint32_t>(rng());
    if ((bits & 0x7f800000u) == 0x7f800000u) bits &= ~0x00800000u;  // no inf/NaN
    std::memcpy(&v, &bits, sizeof v);
  }
  return rows;
}

inline std::vector<uint64_t> unique_keys(std::mt19937_64& rng, std::size_t n) {
  std::set<uint64_t> seen;
  std::vector<uint64_t> keys;
  while (keys.size() < n) {
    const uint64_t k = rng();
    if (seen.insert(k).second) keys.push_back(k);
  }
  return keys;
}

inline bool same_bits(const float* a, const float* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

class CardStoreTest : public ::testing::TestWithParam<table::SparseOptimizerKind> {
 protected:
  CardStoreTest() : cards_(CardSet::from_list("0")) { card().activate(); }
  Card& card() { return cards_.card(0); }
  const device::Stream& stream() { return card().stream(); }

  // Every row of the store, and no other, holds the oracle's floats to the bit.
  void expect_every_row(CardSparseStore& store,
                        const std::map<uint64_t, std::vector<float>>& oracle) {
    const auto all = collect(store, false);
    ASSERT_EQ(all.size(), oracle.size());
    for (const auto& [key, row] : oracle) {
      ASSERT_EQ(all.count(key), 1u) << key;
      ASSERT_TRUE(same_bits(all.at(key).data(), row.data(), store.layout().stride()))
          << "key " << key;
    }
  }

  // key -> row read back from the store, via collect_all or collect_dirty.
  std::map<uint64_t, std::vector<float>> collect(CardSparseStore& store, bool dirty_only) {
    auto keys = card().make_buffer<uint64_t>(0);
    auto rows = card().make_buffer<float>(0);
    const std::size_t n = dirty_only ? store.collect_dirty(keys, rows, stream())
                                     : store.collect_all(keys, rows, stream());
    EXPECT_EQ(keys.size(), n);
    EXPECT_EQ(rows.size(), n * store.layout().stride());
    const auto h_keys = to_host(keys);
    const auto h_rows = to_host(rows);
    std::map<uint64_t, std::vector<float>> out;
    const std::size_t stride = store.layout().stride();
    for (std::size_t i = 0; i < n; ++i) {
      EXPECT_TRUE(out.emplace(h_keys[i], std::vector<float>(h_rows.begin() + i * stride,
                                                            h_rows.begin() + (i + 1) * stride))
                      .second)
          << "key " << h_keys[i] << " collected twice";
    }
    return out;
  }

  CardSet cards_;
};

// Adds one click to each listed row through the device ref, as an optimizer would.
struct TouchRows {
  CardStoreRef store;
  const uint64_t* keys;
  GPUBOX_HD void operator()(std::size_t i) const {
    const row_index_t r = store.find(keys[i]);
    if (r == kInvalidRow) return;
    store.row(r)[table::RowLayout::kClick] += 1.0f;
    store.mark_dirty(r);
  }
};

}  // namespace gpubox::card_table::test_util
