// CardHashTable against a std::unordered_map oracle: seeded random mixes of insert/find/erase,
// growth, duplicate keys in a batch, the reserved keys, runs past the probe bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "heterps/card_table/hash_table.cuh"
#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/parallel_for.cuh"
#include "tests/heterps/card_table/hash_table_test_util.cuh"

namespace gpubox::card_table {
namespace {

using device::Card;
using device::CardSet;
using device::to_device;
using device::to_host;
using hash_table_test::BudgetedTable;
using hash_table_test::colliding_keys;

constexpr uint64_t kMaxKey = std::numeric_limits<uint64_t>::max();

// The table and its oracle, checked after every operation.
class Harness {
 public:
  Harness(Card& card, HashTableOptions options) : card_(card), table_(card, options) {}

  CardHashTable& table() { return table_; }

  void insert(const std::vector<uint64_t>& keys) {
    auto d_keys = to_device(keys, card_.memory(), card_.stream());
    auto d_rows = card_.make_buffer<row_index_t>(keys.size());
    auto d_created = card_.make_buffer<uint8_t>(keys.size());
    const std::size_t inserted =
        table_.insert(d_keys.data(), keys.size(), d_rows.data(), d_created.data(), card_.stream());
    const auto rows = to_host(d_rows);
    const auto created = to_host(d_created);
    std::unordered_map<uint64_t, row_index_t> fresh;
    std::unordered_map<uint64_t, int> created_count;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const uint64_t key = keys[i];
      ASSERT_NE(rows[i], kInvalidRow) << "key " << key;
      ASSERT_LT(rows[i], table_.pool().capacity()) << "key " << key;
      auto it = oracle_.find(key);
      if (it != oracle_.end()) {
        ASSERT_EQ(rows[i], it->second) << "existing key " << key << " changed row";
        ASSERT_EQ(created[i], 0) << "existing key " << key << " reported as created";
        continue;
      }
      auto [pos, first] = fresh.emplace(key, rows[i]);
      ASSERT_EQ(pos->second, rows[i]) << "duplicates of new key " << key << " got different rows";
      created_count[key] += created[i];
    }
    ASSERT_EQ(inserted, fresh.size());
    for (const auto& [key, row] : fresh) {
      ASSERT_EQ(created_count[key], 1) << "new key " << key;
      ASSERT_EQ(used_rows_.count(row), 0u) << "row " << row << " given to two live keys";
      used_rows_.insert(row);
      oracle_.emplace(key, row);
    }
    ASSERT_EQ(table_.size(), oracle_.size());
    ASSERT_EQ(table_.pool().in_use(), oracle_.size());
  }

  void find(const std::vector<uint64_t>& keys) {
    auto d_keys = to_device(keys, card_.memory(), card_.stream());
    auto d_rows = card_.make_buffer<row_index_t>(keys.size());
    table_.find(d_keys.data(), keys.size(), d_rows.data(), card_.stream());
    const auto rows = to_host(d_rows);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      auto it = oracle_.find(keys[i]);
      ASSERT_EQ(rows[i], it == oracle_.end() ? kInvalidRow : it->second) << "key " << keys[i];
    }
  }

  void erase(const std::vector<uint64_t>& keys) {
    auto d_keys = to_device(keys, card_.memory(), card_.stream());
    auto d_released = card_.make_buffer<row_index_t>(keys.size());
    const std::size_t removed =
        table_.erase(d_keys.data(), keys.size(), card_.stream(), d_released.data());
    const auto released = to_host(d_released);
    // Each present key's row is released exactly once (by one of its repeats).
    std::unordered_map<uint64_t, int> released_count;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (released[i] == kInvalidRow) continue;
      auto it = oracle_.find(keys[i]);
      ASSERT_NE(it, oracle_.end()) << "absent key " << keys[i] << " released a row";
      ASSERT_EQ(released[i], it->second) << "key " << keys[i];
      ++released_count[keys[i]];
    }
    std::size_t expected = 0;
    for (uint64_t key : keys) {
      auto it = oracle_.find(key);
      if (it == oracle_.end()) continue;
      ASSERT_EQ(released_count[key], 1) << "key " << key;
      used_rows_.erase(it->second);
      oracle_.erase(it);
      ++expected;
    }
    ASSERT_EQ(removed, expected);
    ASSERT_EQ(table_.size(), oracle_.size());
    ASSERT_EQ(table_.pool().in_use(), oracle_.size());
  }

  void check_dump() {
    auto d_keys = card_.make_buffer<uint64_t>(table_.size());
    auto d_rows = card_.make_buffer<row_index_t>(table_.size());
    const std::size_t count = table_.dump(d_keys.data(), d_rows.data(), card_.stream());
    ASSERT_EQ(count, oracle_.size());
    const auto keys = to_host(d_keys);
    const auto rows = to_host(d_rows);
    std::unordered_map<uint64_t, row_index_t> dumped;
    for (std::size_t i = 0; i < count; ++i) {
      ASSERT_TRUE(dumped.emplace(keys[i], rows[i]).second) << "key " << keys[i] << " dumped twice";
    }
    ASSERT_EQ(dumped, oracle_);
  }

 private:
  Card& card_;
  CardHashTable table_;
  std::unordered_map<uint64_t, row_index_t> oracle_;
  std::unordered_set<row_index_t> used_rows_;
};

std::vector<uint64_t> random_keys(std::mt19937_64& rng, std::size_t n) {
  std::vector<uint64_t> keys(n);
  for (auto& k : keys) k = rng();
  return keys;
}

// Threads per card: the machine's, and an oversubscribed 4 so inserts really race.
class HashTableTest : public ::testing::TestWithParam<int> {
 protected:
  HashTableTest() : cards_(CardSet::from_list("0", 0, 1, GetParam())) { cards_.card(0).activate(); }
  Card& card() { return cards_.card(0); }
  CardSet cards_;
};

TEST_P(HashTableTest, EdgeSizesAcrossGrowth) {
  // 0, 1, n, n+1 around the serial/parallel switch and across several growths from 16 slots.
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{2048}, std::size_t{2049},
                        std::size_t{20000}, std::size_t{20001}}) {
    SCOPED_TRACE(n);
    HashTableOptions options;
    options.initial_capacity = 16;
    Harness h(card(), options);
    std::mt19937_64 rng(n);
    const auto keys = random_keys(rng, n);
    h.insert(keys);
    h.find(keys);
    h.find(random_keys(rng, 1000));  // misses
    h.check_dump();
    EXPECT_LE(h.table().load_factor(), options.max_load_factor);
    if (n > 100) {
      EXPECT_GT(h.table().capacity(), 16u);
    }
    h.insert(keys);  // all present now: nothing new, nothing grows
    h.erase(keys);
    h.find(keys);
    h.check_dump();
  }
}

TEST_P(HashTableTest, RandomMixMatchesUnorderedMap) {
  std::mt19937_64 rng(42 + GetParam());
  HashTableOptions options;
  options.initial_capacity = 64;
  Harness h(card(), options);
  // A small universe, so batches repeat keys, re-insert erased keys, and erase absent ones.
  std::vector<uint64_t> universe = random_keys(rng, 20000);
  universe.push_back(0);
  universe.push_back(kMaxKey);
  universe.push_back(kMaxKey - 1);
  universe.push_back(kMaxKey - 2);
  auto draw = [&](std::size_t n) {
    std::vector<uint64_t> batch(n);
    for (auto& k : batch) k = universe[rng() % universe.size()];
    return batch;
  };
  for (int round = 0; round < 60; ++round) {
    SCOPED_TRACE(round);
    const std::size_t n = rng() % 6000;
    switch (rng() % 3) {
      case 0:
        h.insert(draw(n));
        break;
      case 1:
        h.erase(draw(n / 2));
        break;
      default:
        h.find(draw(n));
        break;
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
  h.check_dump();
}

TEST_P(HashTableTest, DuplicatesInsideOneBatchShareOneRow) {
  std::mt19937_64 rng(7);
  Harness h(card(), HashTableOptions{});
  const auto distinct = random_keys(rng, 100);
  std::vector<uint64_t> batch;
  for (int copy = 0; copy < 100; ++copy)
    batch.insert(batch.end(), distinct.begin(), distinct.end());
  std::shuffle(batch.begin(), batch.end(), rng);
  h.insert(batch);  // checks: one created flag per key, one row per key
  EXPECT_EQ(h.table().size(), 100u);
  h.check_dump();
}

TEST_P(HashTableTest, ThreadsRacingOnTheSameNewKeys) {
  // The batch is `threads` copies of one sequence of new keys: under the static schedule every
  // thread walks its own copy in step with the others, so they claim the same keys at nearly
  // the same time (the claim/row-publish window of detail::InsertEngine).
  std::mt19937_64 rng(21);
  Harness h(card(), HashTableOptions{});
  for (int round = 0; round < 3; ++round) {
    std::vector<uint64_t> batch;
    const auto keys = random_keys(rng, 30000);
    for (int copy = 0; copy < GetParam(); ++copy)
      batch.insert(batch.end(), keys.begin(), keys.end());
    h.insert(batch);
    if (::testing::Test::HasFatalFailure()) return;
  }
  h.check_dump();
}

TEST_P(HashTableTest, ReservedAndExtremeKeysAreStorable) {
  Harness h(card(), HashTableOptions{});
  const std::vector<uint64_t> extremes = {0,           1,           kMaxKey,    kMaxKey - 1,
                                          kMaxKey - 2, kMaxKey - 3, 1ULL << 63, (1ULL << 63) - 1};
  h.find(extremes);  // all absent
  h.insert(extremes);
  h.insert({kMaxKey, kMaxKey - 1, kMaxKey, 0});  // duplicates, already present
  h.find(extremes);
  h.check_dump();
  h.erase({kMaxKey, 0, kMaxKey - 1});
  h.find(extremes);
  h.check_dump();
  h.insert({kMaxKey - 1, kMaxKey - 1});  // a reserved key back, twice in one batch
  h.find(extremes);
  h.check_dump();
}

TEST_P(HashTableTest, RunsPastTheProbeBoundGrowTheTable) {
  HashTableOptions options;
  options.initial_capacity = 1024;
  Harness h(card(), options);
  // 3 * kMaxProbe keys with one home slot until the table has more than 2^12 slots: the first
  // attempt overflows the probe bound and the table must grow (twice more) and retry.
  const auto keys = colliding_keys(3 * kMaxProbe, 12);
  h.insert(keys);
  EXPECT_GT(h.table().capacity(), 4096u);
  h.find(keys);
  // A missing key on the same crowded run: the bounded find answers "absent".
  const auto more = colliding_keys(3 * kMaxProbe + 5, 12);
  h.find(more);
  h.insert(more);
  h.check_dump();
}

TEST_P(HashTableTest, ErasedSlotsAreReclaimedAndRowsReused) {
  std::mt19937_64 rng(3);
  HashTableOptions options;
  options.initial_capacity = 16;
  Harness h(card(), options);
  const auto first = random_keys(rng, 3000);
  h.insert(first);
  const std::size_t pool_capacity = h.table().pool().capacity();
  const std::size_t table_capacity = h.table().capacity();
  // Insert/erase cycles of the same size: tombstones force rehashes at the same capacity, and
  // the pool reuses the erased rows instead of growing.
  h.erase(first);
  for (int cycle = 0; cycle < 20; ++cycle) {
    const auto keys = random_keys(rng, 3000);
    h.insert(keys);
    h.erase(keys);
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_EQ(h.table().pool().capacity(), pool_capacity);
  EXPECT_LE(h.table().capacity(), 2 * table_capacity);
  EXPECT_LE(h.table().load_factor(), options.max_load_factor);
  h.check_dump();
}

TEST_P(HashTableTest, ClearEmptiesAndKeepsCapacity) {
  std::mt19937_64 rng(5);
  Harness h(card(), HashTableOptions{});
  const auto keys = random_keys(rng, 5000);
  h.insert(keys);
  const std::size_t capacity = h.table().capacity();
  h.table().clear(card().stream());
  EXPECT_EQ(h.table().size(), 0u);
  EXPECT_EQ(h.table().capacity(), capacity);
  EXPECT_EQ(h.table().pool().in_use(), 0u);
  auto d_keys = to_device(keys, card().memory(), card().stream());
  auto d_rows = card().make_buffer<row_index_t>(keys.size());
  h.table().find(d_keys.data(), keys.size(), d_rows.data(), card().stream());
  for (row_index_t r : to_host(d_rows)) ASSERT_EQ(r, kInvalidRow);
}

INSTANTIATE_TEST_SUITE_P(Threads, HashTableTest, ::testing::Values(1, 4));

// A functor that inserts through the insert-only ref with rows the caller allocated.
struct InsertThroughRef {
  TableInsertRef table;
  const uint64_t* keys;
  const row_index_t* rows;
  row_index_t* out;
  GPUBOX_HD void operator()(std::size_t i) const { out[i] = table.insert(keys[i], rows[i]).row; }
};

TEST(HashTableRefs, InsertRefThenRecountAndFindRef) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  CardHashTable table(card, HashTableOptions{});
  std::mt19937_64 rng(11);
  const auto keys = random_keys(rng, 4000);
  auto d_keys = to_device(keys, card.memory(), card.stream());
  auto d_rows = card.make_buffer<row_index_t>(keys.size());
  auto d_out = card.make_buffer<row_index_t>(keys.size());
  table.reserve(keys.size(), card.stream());
  table.pool().allocate(d_rows.data(), keys.size(), card.stream());
  device::parallel_for(
      card.stream(), keys.size(),
      InsertThroughRef{table.insert_ref(), d_keys.data(), d_rows.data(), d_out.data()});
  EXPECT_EQ(to_host(d_out), to_host(d_rows));
  EXPECT_EQ(table.recount(card.stream()), keys.size());
  auto d_found = card.make_buffer<row_index_t>(keys.size());
  table.find(d_keys.data(), keys.size(), d_found.data(), card.stream());
  EXPECT_EQ(to_host(d_found), to_host(d_rows));
}

// A rehash saves the live (key, row) pairs and frees the old slot array before it allocates the
// new one (or refills it in place when the capacity stays): its peak is the new array plus 12
// bytes per live key, never two arrays at once.
TEST(HashTableMemory, RehashPeakIsNewSlotsPlusLivePairs) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  card.activate();
  HashTableOptions options;
  options.initial_capacity = 16;
  CardHashTable table(card, options);
  std::mt19937_64 rng(21);
  const std::size_t batch = 3000;
  auto d_keys = card.make_buffer<uint64_t>(batch);
  auto d_rows = card.make_buffer<row_index_t>(batch);
  // Grow the table through many rehashes, then cycle insert/erase at a stable size (purges).
  for (int round = 0; round < 30; ++round) {
    const auto keys = random_keys(rng, batch);
    device::copy_async(d_keys.data(), keys.data(), batch, card.stream());
    card.stream().synchronize();
    const std::size_t in_use = card.memory().bytes_in_use();
    const std::size_t peak_before = card.memory().peak_bytes();
    const std::size_t table_before = table.memory_bytes();
    const std::size_t slots_before = table.capacity();
    table.insert(d_keys.data(), batch, d_rows.data(), card.stream());
    // Thrust's temporaries (the count and copy of live slots) come from the card's scratch
    // arena, whose size is the algorithms' own (n-sized on the cpu backend, small with CUB).
    const std::size_t bound = in_use + (table.memory_bytes() - table_before) + 12 * table.size() +
                              64 + card.scratch().peak();
    ASSERT_LE(card.memory().peak_bytes(), std::max(peak_before, bound))
        << "round " << round << ": " << slots_before << " -> " << table.capacity() << " slots";
    if (round >= 15) table.erase(d_keys.data(), batch, card.stream());
  }
  EXPECT_GT(table.capacity(), 8192u);
}

// reserve_capacity sizes the slots for a budget once: inserting up to that many keys, and
// erasing and inserting again, never grows the table; the slot count is the power of two the
// budget plans with.
TEST(HashTableMemory, ReserveCapacityMeansNoGrowthUpToTheBudget) {
  const std::size_t budget = 5000;
  BudgetedTable t(budget);
  Card& card = t.card;
  CardHashTable& table = t.table;
  const std::size_t slots = table.capacity();
  EXPECT_EQ(slots, CardHashTable::slot_capacity_for(budget, t.options.max_load_factor));
  EXPECT_EQ(slots, 16384u);  // 5000 / 0.6 = 8334 -> 2^14
  std::mt19937_64 rng(8);
  auto d_keys = card.make_buffer<uint64_t>(1000);
  auto d_rows = card.make_buffer<row_index_t>(1000);
  std::vector<std::vector<uint64_t>> batches;
  for (int round = 0; round < 12; ++round) {
    batches.push_back(random_keys(rng, 1000));
    device::copy_async(d_keys.data(), batches.back().data(), 1000, card.stream());
    table.insert(d_keys.data(), 1000, d_rows.data(), card.stream());
    if (table.size() > 4000) {  // stay within the budget: drop the oldest batch
      auto d_old = to_device(batches[batches.size() - 5], card.memory(), card.stream());
      table.erase(d_old.data(), 1000, card.stream());
    }
    ASSERT_EQ(table.capacity(), slots) << "round " << round;
    ASSERT_LE(table.pool().capacity(), 5056u) << "round " << round;  // 5000 rows in 64-row pages
  }
}

TEST(HashTableOptionsCheck, RejectsBadLoadFactor) {
  CardSet cards = CardSet::from_list("0");
  HashTableOptions options;
  options.max_load_factor = 0.95;
  EXPECT_THROW(CardHashTable(cards.card(0), options), Error);
  options.max_load_factor = 0.0;
  EXPECT_THROW(CardHashTable(cards.card(0), options), Error);
}

TEST(HashTableLimits, BatchOverTheRowLimitIsAClearError) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  CardHashTable table(card, HashTableOptions{});
  // Checked before anything is allocated: the table stays usable.
  EXPECT_THROW(table.reserve(kMaxRows + 1, card.stream()), Error);
  const std::vector<uint64_t> keys = {1, 2};
  auto d_keys = to_device(keys, card.memory(), card.stream());
  auto d_rows = card.make_buffer<row_index_t>(keys.size());
  EXPECT_EQ(table.insert(d_keys.data(), keys.size(), d_rows.data(), card.stream()), 2u);
}

TEST(HashTableMove, MovedTableKeepsItsEntries) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  CardHashTable table(card, HashTableOptions{});
  const std::vector<uint64_t> keys = {5, 6, kMaxKey};
  auto d_keys = to_device(keys, card.memory(), card.stream());
  auto d_rows = card.make_buffer<row_index_t>(keys.size());
  ASSERT_EQ(table.insert(d_keys.data(), keys.size(), d_rows.data(), card.stream()), 3u);
  CardHashTable moved = std::move(table);
  auto d_found = card.make_buffer<row_index_t>(keys.size());
  moved.find(d_keys.data(), keys.size(), d_found.data(), card.stream());
  EXPECT_EQ(to_host(d_found), to_host(d_rows));
  EXPECT_EQ(moved.size(), 3u);
}

// repoint_async points present keys, probed and reserved, at the rows given (here: each other's,
// a rotation), with no wait; a key the table lacks (a probed one on an empty run, a reserved one
// whose side slot is empty) is flagged, and the table's next wait on its flags, an insert's here,
// throws naming the compaction, the table staying failed. Without the check the insert succeeds.
TEST(HashTableRepoint, PresentKeysMoveAndAMissFailsTheNextWait) {
  CardSet cards = CardSet::from_list("0");
  Card& card = cards.card(0);
  const device::Stream& stream = card.stream();
  const std::vector<uint64_t> keys = {5, 6, kMaxKey, kMaxKey - 1};
  const std::vector<uint64_t> absent = {7, kMaxKey - 1};
  const std::vector<uint64_t> more = {8, 9};
  auto d_more = to_device(more, card.memory(), stream);
  auto d_more_rows = card.make_buffer<row_index_t>(more.size());
  for (const uint64_t miss : absent) {
    SCOPED_TRACE(miss);
    CardHashTable table(card, HashTableOptions{});
    // kMaxKey - 1 is left out when it is the key to miss.
    const std::size_t n = miss == kMaxKey - 1 ? 3 : 4;
    auto d_keys = to_device(keys, card.memory(), stream);
    auto d_rows = card.make_buffer<row_index_t>(n);
    ASSERT_EQ(table.insert(d_keys.data(), n, d_rows.data(), stream), n);
    const std::vector<row_index_t> rows = to_host(d_rows);
    std::vector<row_index_t> rotated(rows.begin() + 1, rows.end());
    rotated.push_back(rows.front());
    auto d_rotated = to_device(rotated, card.memory(), stream);
    const device::DeviceCounts before = card.counts();
    table.repoint_async(d_keys.data(), d_rotated.data(), n, stream);
    EXPECT_EQ((card.counts() - before).host_syncs, 0u);
    auto d_found = card.make_buffer<row_index_t>(n);
    table.find(d_keys.data(), n, d_found.data(), stream);
    EXPECT_EQ(to_host(d_found), rotated);
    ASSERT_EQ(table.insert(d_more.data(), 1, d_more_rows.data(), stream), 1u);
    auto d_miss = to_device(std::vector<uint64_t>{miss}, card.memory(), stream);
    table.repoint_async(d_miss.data(), d_rotated.data(), 1, stream);
    try {
      table.insert(d_more.data() + 1, 1, d_more_rows.data(), stream);
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("moved the row of a key the table does not hold"),
                std::string::npos)
          << e.what();
    }
    EXPECT_THROW(table.insert(d_more.data() + 1, 1, d_more_rows.data(), stream), Error);
  }
}

}  // namespace
}  // namespace gpubox::card_table
