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
#include "tests/table/slot_dims_config.hpp"

#if !defined(GPUBOX_BACKEND_CUDA)
#include <omp.h>
#endif

namespace gpubox::card_table {
namespace {

using device::Card;
using device::CardSet;
using device::to_device;
using device::to_host;

constexpr uint64_t kMaxKey = ~uint64_t{0};

table::AccessorConfig test_config(table::SparseOptimizerKind kind) {
  table::AccessorConfig config;
  config.optimizer.kind = kind;
  config.mf_dim = 8;
  config.optimizer.initial_range = 0.5f;
  config.seed = 1234;
  return config;
}

// Rows with arbitrary bit patterns (finite, denormal, signed zero) to check copies are exact.
std::vector<float> random_rows(std::mt19937_64& rng, std::size_t n, int32_t stride) {
  std::vector<float> rows(n * static_cast<std::size_t>(stride));
  for (auto& v : rows) {
    uint32_t bits = static_cast<uint32_t>(rng());
    if ((bits & 0x7f800000u) == 0x7f800000u) bits &= ~0x00800000u;  // no inf/NaN
    std::memcpy(&v, &bits, sizeof v);
  }
  return rows;
}

std::vector<uint64_t> unique_keys(std::mt19937_64& rng, std::size_t n) {
  std::set<uint64_t> seen;
  std::vector<uint64_t> keys;
  while (keys.size() < n) {
    const uint64_t k = rng();
    if (seen.insert(k).second) keys.push_back(k);
  }
  return keys;
}

bool same_bits(const float* a, const float* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

class CardStoreTest : public ::testing::TestWithParam<table::SparseOptimizerKind> {
 protected:
  CardStoreTest() : cards_(CardSet::from_list("0")) { card().activate(); }
  Card& card() { return cards_.card(0); }
  const device::Stream& stream() { return card().stream(); }

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

// --- width classes (hyper_parameters.slot_dims): a pool per width ------------------------------

// Default width 4, slot 1 at 8, slot 2 at 16 (slot 3 takes the default).
table::AccessorConfig mixed_config(table::SparseOptimizerKind kind) {
  table::AccessorConfig config = test_config(kind);
  config.mf_dim = 4;
  return table::with_slot_dims(config, {{1, 8}, {2, 16}});
}

// A record of `record`'s stride holding a row of `width` (random bits, its width field set),
// zeros after the row.
std::vector<float> random_record(std::mt19937_64& rng, const table::RowLayout& record,
                                 int32_t width) {
  const table::RowLayout own = table::RowLayout::make(record.kind, width, record.storage);
  std::vector<float> out = random_rows(rng, 1, own.stride());
  out[static_cast<std::size_t>(own.mf_dim_offset())] = static_cast<float>(width);
  out.resize(static_cast<std::size_t>(record.stride()), 0.0f);
  return out;
}

class CardStoreWidths : public CardStoreTest {
 protected:
  // n fresh keys with records of the config's widths drawn at random, inserted into `store`;
  // returns the keys in insertion order and fills *oracle with their records.
  std::vector<uint64_t> insert_mixed(CardSparseStore& store, std::size_t n, std::mt19937_64& rng,
                                     std::map<uint64_t, std::vector<float>>* oracle) {
    const std::vector<uint64_t> keys = unique_keys(rng, n);
    std::vector<float> records;
    for (const uint64_t key : keys) {
      const std::vector<float> row =
          random_record(rng, store.layout(), store.classes().dims[rng() % 3]);
      records.insert(records.end(), row.begin(), row.end());
      (*oracle)[key] = row;
    }
    if (n > 0) {
      auto d_keys = to_device(keys, card().memory(), stream());
      auto d_records = to_device(records, card().memory(), stream());
      store.insert_rows(d_keys.data(), d_records.data(), n, stream());
    }
    return keys;
  }
  // Rows per pool, as the oracle has them, against the pools' counters and strides.
  void expect_pools(const CardSparseStore& store,
                    const std::map<uint64_t, std::vector<float>>& oracle) {
    const table::RowLayout record = store.layout();
    std::vector<std::size_t> per_pool(static_cast<std::size_t>(store.pool_count()), 0);
    for (const auto& [key, row] : oracle) {
      ++per_pool[static_cast<std::size_t>(
          store.classes().class_of(record.of_row(row.data()).mf_dim))];
    }
    std::size_t own_bytes = 0;
    for (int32_t p = 0; p < store.pool_count(); ++p) {
      const table::RowLayout own =
          table::RowLayout::make(record.kind, store.classes().dims[p], record.storage);
      EXPECT_EQ(store.bytes_per_row(p), sizeof(float) * own.stride()) << "pool " << p;
      EXPECT_EQ(store.pool(p).in_use(), per_pool[static_cast<std::size_t>(p)]) << "pool " << p;
      own_bytes += per_pool[static_cast<std::size_t>(p)] * store.bytes_per_row(p);
    }
    // The rows take their own strides' bytes, not the widest's for each.
    if (per_pool[0] > 0) {
      EXPECT_LT(own_bytes, oracle.size() * store.bytes_per_row());
    }
  }
};

// Random batches of lookup_or_create (slots of every width, repeats, known keys), insert_rows of
// host rows of every width, and erase, against an std::map oracle of records; every row read
// back (collect_all, read_rows) bit-exact, every pool holding its own width's rows.
TEST_P(CardStoreWidths, EachWidthInItsOwnPoolAgainstAnOracle) {
  HashTableOptions options;
  options.initial_capacity = 16;
  options.page_rows = 32;
  const table::AccessorConfig config = mixed_config(GetParam());
  CardSparseStore store(card(), config, options);
  ASSERT_EQ(store.pool_count(), 3);
  const table::RowLayout record = store.layout();
  ASSERT_EQ(record.stride(), table::RowLayout::make(config.optimizer.kind, 16).stride());
  const auto stride = static_cast<std::size_t>(record.stride());
  std::mt19937_64 rng(17);
  std::map<uint64_t, std::vector<float>> oracle;
  std::vector<uint64_t> known;
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE(round);
    // Created on the card from their slots (a few known keys and repeats among them).
    std::vector<uint64_t> keys = unique_keys(rng, 300);
    std::vector<int32_t> slots(keys.size());
    for (auto& slot : slots) slot = static_cast<int32_t>(rng() % 4);
    for (std::size_t i = 0; i < 20 && !known.empty(); ++i) keys[i] = known[rng() % known.size()];
    keys[299] = keys[298];  // a repeat, in the same slot (which of two slots wins is not said)
    slots[299] = slots[298];
    std::map<uint64_t, std::vector<float>> created;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (oracle.count(keys[i]) || created.count(keys[i])) continue;
      std::vector<float> row(stride, 0.0f);
      table::init_row(row.data(), table::RowLayout::for_slot(config, slots[i]), config, keys[i],
                      slots[i]);
      created[keys[i]] = row;
    }
    auto d_keys = to_device(keys, card().memory(), stream());
    auto d_slots = to_device(slots, card().memory(), stream());
    auto d_rows = card().make_buffer<row_index_t>(keys.size());
    std::size_t made = 0;
    store.lookup_or_create(d_keys.data(), d_slots.data(), keys.size(), d_rows.data(), true, &made,
                           stream());
    EXPECT_EQ(made, created.size());
    oracle.insert(created.begin(), created.end());
    // Rows from the host tier, of every width; a known key keeps its width.
    std::vector<uint64_t> host_keys = unique_keys(rng, 200);
    for (std::size_t i = 0; i < 30; ++i) host_keys[i] = keys[20 + i];
    std::vector<float> records;
    for (const uint64_t key : host_keys) {
      const auto it = oracle.find(key);
      const int32_t width = it != oracle.end() ? record.of_row(it->second.data()).mf_dim
                                               : store.classes().dims[rng() % 3];
      const std::vector<float> row = random_record(rng, record, width);
      records.insert(records.end(), row.begin(), row.end());
      oracle[key] = row;
    }
    auto d_host_keys = to_device(host_keys, card().memory(), stream());
    auto d_records = to_device(records, card().memory(), stream());
    store.insert_rows(d_host_keys.data(), d_records.data(), host_keys.size(), stream());
    // Erase about a third.
    std::vector<uint64_t> doomed;
    for (const auto& [key, row] : oracle) {
      if (rng() % 3 == 0) doomed.push_back(key);
    }
    for (const uint64_t key : doomed) oracle.erase(key);
    auto d_doomed = to_device(doomed, card().memory(), stream());
    EXPECT_EQ(store.erase(d_doomed.data(), doomed.size(), stream()), doomed.size());
    known.clear();
    for (const auto& [key, row] : oracle) known.push_back(key);

    ASSERT_EQ(store.size(), oracle.size());
    const auto all = collect(store, false);
    ASSERT_EQ(all.size(), oracle.size());
    for (const auto& [key, row] : oracle) {
      ASSERT_EQ(all.count(key), 1u) << key;
      ASSERT_TRUE(same_bits(all.at(key).data(), row.data(), stride)) << "key " << key;
    }
    auto d_known = to_device(known, card().memory(), stream());
    auto d_out = card().make_buffer<float>(known.size() * stride);
    store.read_rows(d_known.data(), known.size(), d_out.data(), stream());
    const auto out = to_host(d_out);
    for (std::size_t i = 0; i < known.size(); ++i) {
      ASSERT_TRUE(same_bits(out.data() + i * stride, oracle.at(known[i]).data(), stride))
          << "key " << known[i];
    }
    expect_pools(store, oracle);
  }
}

// A width's pool at its page boundary (0, 1, n, n + 1 rows of page size n), beside rows of another
// width: pages come per pool, the pools do not share them, and compact_pool gives a pool's free
// pages back with every row intact.
TEST_P(CardStoreWidths, PoolPageBoundaryAndCompaction) {
  constexpr std::size_t kPage = 16;
  const table::AccessorConfig config = mixed_config(GetParam());
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, kPage, kPage + 1}) {
    SCOPED_TRACE(n);
    HashTableOptions options;
    options.page_rows = kPage;
    CardSparseStore store(card(), config, options);
    const table::RowLayout record = store.layout();
    const auto stride = static_cast<std::size_t>(record.stride());
    std::mt19937_64 rng(n + 3);
    // n rows of width 8 (pool 1) and 3 of width 4 (pool 0).
    const std::vector<uint64_t> keys = unique_keys(rng, n + 3);
    std::map<uint64_t, std::vector<float>> oracle;
    std::vector<float> records;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const std::vector<float> row = random_record(rng, record, i < n ? 8 : 4);
      records.insert(records.end(), row.begin(), row.end());
      oracle[keys[i]] = row;
    }
    auto d_keys = to_device(keys, card().memory(), stream());
    auto d_records = to_device(records, card().memory(), stream());
    EXPECT_EQ(store.insert_rows(d_keys.data(), d_records.data(), keys.size(), stream()),
              keys.size());
    EXPECT_EQ(store.pool(1).pages(), (n + kPage - 1) / kPage);
    EXPECT_EQ(store.pool(1).capacity(), (n + kPage - 1) / kPage * kPage);
    EXPECT_EQ(store.pool(0).pages(), 1u);
    EXPECT_EQ(store.pool(2).pages(), 0u);
    EXPECT_EQ(store.pool(1).page_bytes(), kPage * store.bytes_per_row(1));
    expect_pools(store, oracle);
    // Erase the first half of the width-8 rows (the pool hands out its highest free rows first,
    // so the rows left sit in the upper part of the pool), then compact: the pool keeps the
    // pages its rows need, the rows move below them intact.
    std::vector<uint64_t> doomed(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(n / 2));
    for (const uint64_t key : doomed) oracle.erase(key);
    auto d_doomed = to_device(doomed, card().memory(), stream());
    store.erase(d_doomed.data(), doomed.size(), stream());
    const std::size_t left = n - n / 2;
    // The surviving width-8 rows and one width-4 row are dirty, the other width-4 rows clean (as
    // end_pass leaves the next pass's rows): the move keeps each row's flag, so a later
    // write-back still finds them (without it, every moved row came out clean).
    std::vector<uint64_t> touched(keys.begin() + static_cast<std::ptrdiff_t>(n / 2),
                                  keys.begin() + static_cast<std::ptrdiff_t>(n + 1));
    store.clear_dirty(stream());
    auto d_touched = to_device(touched, card().memory(), stream());
    device::parallel_for(stream(), touched.size(), TouchRows{store.ref(), d_touched.data()});
    for (const uint64_t key : touched) oracle[key][table::RowLayout::kClick] += 1.0f;
    const std::size_t pages_before = store.pool(1).pages();
    EXPECT_EQ(store.compact_pool(1, stream()), pages_before - (left + kPage - 1) / kPage);
    std::set<uint64_t> dirty_after;
    for (const auto& entry : collect(store, true)) dirty_after.insert(entry.first);
    EXPECT_EQ(dirty_after, std::set<uint64_t>(touched.begin(), touched.end()));
    EXPECT_EQ(store.pool(1).pages(), (left + kPage - 1) / kPage);
    EXPECT_EQ(store.pool(1).in_use(), left);
    EXPECT_EQ(store.compact_pool(0, stream()), 0u);
    const auto all = collect(store, false);
    ASSERT_EQ(all.size(), oracle.size());
    for (const auto& [key, row] : oracle) {
      ASSERT_EQ(all.count(key), 1u) << key;
      ASSERT_TRUE(same_bits(all.at(key).data(), row.data(), stride)) << "key " << key;
    }
    expect_pools(store, oracle);
    // The compacted pool takes new rows again, from its kept pages first.
    const std::vector<uint64_t> more = unique_keys(rng, kPage);
    std::vector<float> more_records;
    for (const uint64_t key : more) {
      const std::vector<float> row = random_record(rng, record, 8);
      more_records.insert(more_records.end(), row.begin(), row.end());
      oracle[key] = row;
    }
    auto d_more = to_device(more, card().memory(), stream());
    auto d_more_records = to_device(more_records, card().memory(), stream());
    store.insert_rows(d_more.data(), d_more_records.data(), more.size(), stream());
    EXPECT_EQ(store.pool(1).pages(), (left + kPage + kPage - 1) / kPage);
    const auto again = collect(store, false);
    ASSERT_EQ(again.size(), oracle.size());
    for (const auto& [key, row] : oracle) {
      ASSERT_TRUE(same_bits(again.at(key).data(), row.data(), stride)) << "key " << key;
    }
  }
}

// insert_rows of 0, 1 and n records of every width on 1 to 7 threads: the cpu backend splits the
// scatter's items among its threads mid-record (its run_range form), the card one thread per
// field; every row holds its record's own fields (collect pads them back), against the oracle.
TEST_P(CardStoreWidths, InsertRowsWritesEveryWidthOnEveryThreadSplit) {
#if !defined(GPUBOX_BACKEND_CUDA)
  struct RestoreThreads {
    int threads = omp_get_max_threads();
    ~RestoreThreads() { omp_set_num_threads(threads); }
  } restore;
  const std::vector<int> thread_counts = {1, 2, 3, 7};
#else
  const std::vector<int> thread_counts = {1};
#endif
  for (const int threads : thread_counts) {
#if !defined(GPUBOX_BACKEND_CUDA)
    omp_set_num_threads(threads);
#endif
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{500}}) {
      SCOPED_TRACE(std::to_string(threads) + " threads, " + std::to_string(n) + " records");
      CardSparseStore store(card(), mixed_config(GetParam()), HashTableOptions{});
      const auto stride = static_cast<std::size_t>(store.layout().stride());
      std::mt19937_64 rng(43 + n);
      std::map<uint64_t, std::vector<float>> oracle;
      insert_mixed(store, n, rng, &oracle);
      const auto all = collect(store, false);
      ASSERT_EQ(all.size(), oracle.size());
      for (const auto& [key, row] : oracle) {
        ASSERT_EQ(all.count(key), 1u) << key;
        ASSERT_TRUE(same_bits(all.at(key).data(), row.data(), stride)) << "key " << key;
      }
    }
  }
}

// gather_rows of 0, 1 and n rows of every width, in a shuffled order, against the oracle's
// records (each row's fields, zeros past its width), on 1 to 7 threads: the cpu backend splits the
// items among its threads mid-record (its run_range form), the card one thread per field.
TEST_P(CardStoreWidths, GatherRowsPadsEveryWidthOnEveryThreadSplit) {
  CardSparseStore store(card(), mixed_config(GetParam()), HashTableOptions{});
  const auto stride = static_cast<std::size_t>(store.layout().stride());
  std::mt19937_64 rng(41);
  std::map<uint64_t, std::vector<float>> oracle;
  const std::vector<uint64_t> keys = insert_mixed(store, 500, rng, &oracle);
  auto listed_keys = card().make_buffer<uint64_t>(0);
  auto listed_rows = card().make_buffer<row_index_t>(0);
  ASSERT_EQ(store.list_entries(false, listed_keys, listed_rows, stream()), keys.size());
  const std::vector<uint64_t> h_keys = to_host(listed_keys);
#if !defined(GPUBOX_BACKEND_CUDA)
  // The thread count put back however the test ends (a failed ASSERT returns early).
  struct RestoreThreads {
    int threads = omp_get_max_threads();
    ~RestoreThreads() { omp_set_num_threads(threads); }
  } restore;
  const std::vector<int> thread_counts = {1, 2, 3, 7};
#else
  const std::vector<int> thread_counts = {1};
#endif
  for (const int threads : thread_counts) {
#if !defined(GPUBOX_BACKEND_CUDA)
    omp_set_num_threads(threads);
#endif
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, keys.size()}) {
      SCOPED_TRACE(std::to_string(threads) + " threads, " + std::to_string(n) + " rows");
      auto out = card().make_buffer<float>(n * stride);
      store.gather_rows(listed_rows.data(), n, out.data(), stream());
      const std::vector<float> h_out = to_host(out);
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(same_bits(h_out.data() + i * stride, oracle.at(h_keys[i]).data(), stride))
            << "key " << h_keys[i];
      }
    }
  }
}

// A record of a width no slot has is refused naming its key.
TEST_P(CardStoreWidths, RefusesARowOfAnUnknownWidth) {
  CardSparseStore store(card(), mixed_config(GetParam()), HashTableOptions{});
  std::mt19937_64 rng(2);
  std::vector<float> records = random_record(rng, store.layout(), 4);
  const std::vector<float> odd = random_record(rng, store.layout(), 4);
  records.insert(records.end(), odd.begin(), odd.end());
  records[store.layout().stride() + store.layout().mf_dim_offset()] = 6.0f;
  const std::vector<uint64_t> keys = {5, 77};
  auto d_keys = to_device(keys, card().memory(), stream());
  auto d_records = to_device(records, card().memory(), stream());
  try {
    store.insert_rows(d_keys.data(), d_records.data(), 2, stream());
    ADD_FAILURE() << "a row of width 6 was stored";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("key 77"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, CardStoreWidths,
                         ::testing::Values(table::SparseOptimizerKind::kAdagrad,
                                           table::SparseOptimizerKind::kAdam));

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
