// CardSparseStore: host-tier round trips bit-exact, lookup_or_create against init_row, dirty
// tracking through the device ref, collect/erase against an oracle.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/error.hpp"
#include "heterps/card_table/card_store.cuh"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/parallel_for.cuh"
#include "tests/heterps/card_table/card_store_test_util.hpp"

namespace gpubox::card_table {
namespace {

using namespace test_util;  // NOLINT: the tests' shared configs, rows and fixture

TEST_P(CardStoreTest, InsertRowsThenReadRowsIsBitExact) {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3000}, std::size_t{3001}}) {
    SCOPED_TRACE(n);
    HashTableOptions options;
    options.initial_capacity = 16;
    CardSparseStore store(card(), test_config(GetParam()), options);
    const int32_t stride = store.layout().stride();
    EXPECT_EQ(store.bytes_per_row(), sizeof(float) * stride);
    std::mt19937_64 rng(n + 1);
    auto keys = unique_keys(rng, n);
    if (n > 2) keys[0] = kMaxKey, keys[1] = 0;
    const auto rows = random_rows(rng, n, stride);
    auto d_keys = to_device(keys, card().memory(), stream());
    auto d_rows = to_device(rows, card().memory(), stream());
    EXPECT_EQ(store.insert_rows(d_keys.data(), d_rows.data(), n, stream()), n);
    EXPECT_EQ(store.size(), n);
    // Read back in another order.
    std::vector<uint64_t> shuffled = keys;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    std::unordered_map<uint64_t, std::size_t> position;
    for (std::size_t i = 0; i < n; ++i) position[keys[i]] = i;
    auto d_shuffled = to_device(shuffled, card().memory(), stream());
    auto d_out = card().make_buffer<float>(n * stride);
    store.read_rows(d_shuffled.data(), n, d_out.data(), stream());
    const auto out = to_host(d_out);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(
          same_bits(out.data() + i * stride, rows.data() + position[shuffled[i]] * stride, stride))
          << "key " << shuffled[i];
    }
    // Rows from the host tier are clean.
    EXPECT_TRUE(collect(store, /*dirty_only=*/true).empty());
    EXPECT_EQ(collect(store, /*dirty_only=*/false).size(), n);
    if (n > 0) {
      EXPECT_GE(store.memory_bytes(), n * store.bytes_per_row());
    }
  }
}

TEST_P(CardStoreTest, ReadRowsOfAMissingKeyNamesIt) {
  CardSparseStore store(card(), test_config(GetParam()));
  const std::vector<uint64_t> keys = {10, 20};
  const auto rows = std::vector<float>(2 * store.layout().stride(), 1.0f);
  auto d_keys = to_device(keys, card().memory(), stream());
  auto d_rows = to_device(rows, card().memory(), stream());
  store.insert_rows(d_keys.data(), d_rows.data(), 2, stream());
  auto d_ask = to_device(std::vector<uint64_t>{10, 987654321, 20}, card().memory(), stream());
  auto d_out = card().make_buffer<float>(3 * store.layout().stride());
  try {
    store.read_rows(d_ask.data(), 3, d_out.data(), stream());
    FAIL() << "no error for a missing key";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("987654321"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("card 0"), std::string::npos) << e.what();
  }
}

TEST_P(CardStoreTest, LookupOrCreateInitialisesNewRowsAndTracksDirty) {
  const auto config = test_config(GetParam());
  HashTableOptions options;
  options.initial_capacity = 16;
  CardSparseStore store(card(), config, options);
  const int32_t stride = store.layout().stride();
  std::mt19937_64 rng(99);
  // 2000 rows from the host tier.
  const auto known = unique_keys(rng, 2000);
  const auto known_rows = random_rows(rng, known.size(), stride);
  auto d_known = to_device(known, card().memory(), stream());
  auto d_known_rows = to_device(known_rows, card().memory(), stream());
  store.insert_rows(d_known.data(), d_known_rows.data(), known.size(), stream());
  // A batch mixing known keys, new keys (repeated), and reserved keys, with slots.
  const auto fresh = unique_keys(rng, 700);
  std::vector<uint64_t> batch;
  std::vector<int32_t> slots;
  for (int i = 0; i < 5000; ++i) {
    const uint64_t key = (i % 3 == 0) ? fresh[rng() % fresh.size()] : known[rng() % known.size()];
    batch.push_back(i == 7 ? kMaxKey : key);
    slots.push_back(static_cast<int32_t>(key % 26));
  }
  std::set<uint64_t> new_keys;
  std::unordered_map<uint64_t, int32_t> first_slot;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (std::find(known.begin(), known.end(), batch[i]) == known.end()) new_keys.insert(batch[i]);
    first_slot.emplace(batch[i], slots[i]);
  }
  auto d_batch = to_device(batch, card().memory(), stream());
  auto d_slots = to_device(slots, card().memory(), stream());
  auto d_idx = card().make_buffer<row_index_t>(batch.size());

  // Without creation: missing keys answer kInvalidRow and nothing changes.
  std::size_t created = 123;
  store.lookup_or_create(d_batch.data(), d_slots.data(), batch.size(), d_idx.data(),
                         /*create_missing=*/false, &created, stream());
  EXPECT_EQ(created, 0u);
  auto idx = to_host(d_idx);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    EXPECT_EQ(idx[i] == kInvalidRow, new_keys.count(batch[i]) == 1) << batch[i];
  }
  EXPECT_EQ(store.size(), known.size());

  store.lookup_or_create(d_batch.data(), d_slots.data(), batch.size(), d_idx.data(),
                         /*create_missing=*/true, &created, stream());
  EXPECT_EQ(created, new_keys.size());
  EXPECT_EQ(store.size(), known.size() + new_keys.size());
  idx = to_host(d_idx);
  std::unordered_map<uint64_t, row_index_t> row_of;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    ASSERT_NE(idx[i], kInvalidRow);
    auto [it, inserted] = row_of.emplace(batch[i], idx[i]);
    ASSERT_EQ(it->second, idx[i]) << "key " << batch[i] << " got two rows";
  }
  // New rows equal init_row on the host (slot of the key's occurrence; all occurrences of a
  // key share its slot here); known rows are untouched; exactly the new rows are dirty.
  const auto all = collect(store, /*dirty_only=*/false);
  const auto dirty = collect(store, /*dirty_only=*/true);
  EXPECT_EQ(dirty.size(), new_keys.size());
  std::vector<float> expected(stride);
  for (uint64_t key : new_keys) {
    table::init_row(expected.data(), store.layout(), config, key, first_slot[key]);
    ASSERT_EQ(dirty.count(key), 1u) << key;
    ASSERT_TRUE(same_bits(dirty.at(key).data(), expected.data(), stride)) << key;
  }
  for (std::size_t i = 0; i < known.size(); ++i) {
    ASSERT_TRUE(same_bits(all.at(known[i]).data(), known_rows.data() + i * stride, stride));
  }

  // Updates through the ref make rows dirty; clear_dirty makes everything clean.
  store.clear_dirty(stream());
  EXPECT_TRUE(collect(store, true).empty());
  std::vector<uint64_t> touched(known.begin(), known.begin() + 300);
  touched.push_back(424242);  // absent: ignored by the functor
  auto d_touched = to_device(touched, card().memory(), stream());
  device::parallel_for(stream(), touched.size(), TouchRows{store.ref(), d_touched.data()});
  const auto after = collect(store, true);
  EXPECT_EQ(after.size(), 300u);
  for (std::size_t i = 0; i < 300; ++i) {
    ASSERT_EQ(after.count(known[i]), 1u);
    EXPECT_EQ(after.at(known[i])[table::RowLayout::kClick],
              known_rows[i * stride + table::RowLayout::kClick] + 1.0f);
  }
  // insert_rows over a dirty key overwrites it and makes it clean.
  auto d_first = to_device(std::vector<uint64_t>{known[0]}, card().memory(), stream());
  EXPECT_EQ(store.insert_rows(d_first.data(), d_known_rows.data(), 1, stream()), 0u);
  EXPECT_EQ(collect(store, true).size(), 299u);
}

// Growth over many small pages, eviction-like erasure and reinsertion, against a std::map
// oracle; erased rows are reused, so the pool holds at most a page more than the peak of live
// rows.
TEST_P(CardStoreTest, EraseAndCollectMatchOracle) {
  HashTableOptions options;
  options.page_rows = 64;
  CardSparseStore store(card(), test_config(GetParam()), options);
  const int32_t stride = store.layout().stride();
  std::mt19937_64 rng(5);
  std::map<uint64_t, std::vector<float>> oracle;
  std::size_t peak_live = 0;
  for (int round = 0; round < 8; ++round) {
    const auto keys = unique_keys(rng, 1500);
    const auto rows = random_rows(rng, keys.size(), stride);
    auto d_keys = to_device(keys, card().memory(), stream());
    auto d_rows = to_device(rows, card().memory(), stream());
    store.insert_rows(d_keys.data(), d_rows.data(), keys.size(), stream());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      oracle[keys[i]] =
          std::vector<float>(rows.begin() + i * stride, rows.begin() + (i + 1) * stride);
    }
    peak_live = std::max(peak_live, oracle.size());
    EXPECT_LT(store.table().pool().capacity(), peak_live + store.page_rows());
    // Erase a random half of everything, plus absent keys.
    std::vector<uint64_t> doomed;
    for (const auto& [key, row] : oracle) {
      if (rng() % 2) doomed.push_back(key);
    }
    for (uint64_t key : doomed) oracle.erase(key);
    doomed.push_back(1);
    auto d_doomed = to_device(doomed, card().memory(), stream());
    EXPECT_EQ(store.erase(d_doomed.data(), doomed.size(), stream()), doomed.size() - 1);
    EXPECT_EQ(store.size(), oracle.size());
    const auto all = collect(store, false);
    ASSERT_EQ(all.size(), oracle.size());
    for (const auto& [key, row] : oracle) {
      ASSERT_EQ(all.count(key), 1u);
      ASSERT_TRUE(same_bits(all.at(key).data(), row.data(), stride));
    }
  }
  store.clear(stream());
  EXPECT_EQ(store.size(), 0u);
  EXPECT_TRUE(collect(store, false).empty());
}

INSTANTIATE_TEST_SUITE_P(Optimizers, CardStoreTest,
                         ::testing::Values(table::SparseOptimizerKind::kSgd,
                                           table::SparseOptimizerKind::kAdagrad,
                                           table::SparseOptimizerKind::kAdam,
                                           table::SparseOptimizerKind::kSharedAdam));

// Handles: no class bits with one pool (the handle is the index, up to kMaxRows rows); with
// several pools the pool in the top bits, every handle below kInvalidRow, and a pool that would
// outgrow its index bits is a clear error.
TEST(RowHandles, ClassBitsAndLimits) {
  EXPECT_EQ(RowHandleCodec::for_pools(1).index_bits, 32u);
  EXPECT_EQ(RowHandleCodec::for_pools(1).max_rows(), kMaxRows);
  EXPECT_EQ(RowHandleCodec::for_pools(2).index_bits, 31u);
  EXPECT_EQ(RowHandleCodec::for_pools(3).index_bits, 30u);
  EXPECT_EQ(RowHandleCodec::for_pools(8).index_bits, 29u);
  const RowHandleCodec codec = RowHandleCodec::for_pools(8);
  const row_index_t last = codec.first_handle(7) | static_cast<row_index_t>(codec.max_rows() - 1);
  EXPECT_NE(last, kInvalidRow);
  EXPECT_EQ(codec.pool_of(last), 7);
  EXPECT_EQ(last & codec.index_mask(), codec.max_rows() - 1);
  EXPECT_EQ(codec.pool_of(codec.first_handle(3) | 5u), 3);
  CardSet cards = CardSet::from_list("0");
  RowPool pool(cards.card(0), 4, 0, 16, codec, 7);
  pool.reserve_index(codec.max_rows());
  try {
    pool.reserve_index(codec.max_rows() + 1);
    ADD_FAILURE() << "pool 7 of 8 took more rows than its index bits hold";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row pool 7"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gpubox::card_table
