// CardSparseStore with width classes (hyper_parameters.slot_dims): a pool per width, every row
// at its own stride, records of every width gathered and scattered on every thread split.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/parallel_for.cuh"
#include "tests/heterps/card_table/card_store_test_util.hpp"
#include "tests/table/slot_dims_config.hpp"

#if !defined(GPUBOX_BACKEND_CUDA)
#include <omp.h>
#endif

namespace gpubox::card_table {
namespace {

using namespace test_util;  // NOLINT: the tests' shared configs, rows and fixture

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
  // n fresh keys with records of the config's widths drawn at random (or all of `width`),
  // inserted into `store`; returns the keys in insertion order and fills *oracle with their
  // records.
  std::vector<uint64_t> insert_mixed(CardSparseStore& store, std::size_t n, std::mt19937_64& rng,
                                     std::map<uint64_t, std::vector<float>>* oracle,
                                     int32_t width = 0) {
    const std::vector<uint64_t> keys = unique_keys(rng, n);
    insert_keys(store, keys, rng, oracle, width);
    return keys;
  }
  // insert_mixed of the given keys (absent from the store), in one batch.
  void insert_keys(CardSparseStore& store, const std::vector<uint64_t>& keys, std::mt19937_64& rng,
                   std::map<uint64_t, std::vector<float>>* oracle, int32_t width = 0) {
    const std::size_t n = keys.size();
    std::vector<float> records;
    for (const uint64_t key : keys) {
      const std::vector<float> row =
          random_record(rng, store.layout(), width > 0 ? width : store.classes().dims[rng() % 3]);
      records.insert(records.end(), row.begin(), row.end());
      (*oracle)[key] = row;
    }
    if (n > 0) {
      auto d_keys = to_device(keys, card().memory(), stream());
      auto d_records = to_device(records, card().memory(), stream());
      store.insert_rows(d_keys.data(), d_records.data(), n, stream());
    }
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
  // Every (key, row handle) entry of `store` (list_entries), in its order.
  std::vector<std::pair<uint64_t, row_index_t>> entries(const CardSparseStore& store) {
    auto d_keys = card().make_buffer<uint64_t>(0);
    auto d_handles = card().make_buffer<row_index_t>(0);
    const std::size_t live = store.list_entries(/*dirty_only=*/false, d_keys, d_handles, stream());
    const std::vector<uint64_t> keys = to_host(d_keys);
    const std::vector<row_index_t> handles = to_host(d_handles);
    std::vector<std::pair<uint64_t, row_index_t>> out;
    for (std::size_t i = 0; i < live; ++i) out.emplace_back(keys[i], handles[i]);
    return out;
  }
  // `touched` (keys of `store`) become its only dirty rows, each with one click more through the
  // device ref (TouchRows), as `oracle` records.
  void touch_only(CardSparseStore& store, const std::vector<uint64_t>& touched,
                  std::map<uint64_t, std::vector<float>>* oracle) {
    store.clear_dirty(stream());
    auto d_touched = to_device(touched, card().memory(), stream());
    device::parallel_for(stream(), touched.size(), TouchRows{store.ref(), d_touched.data()});
    for (const uint64_t key : touched) (*oracle)[key][table::RowLayout::kClick] += 1.0f;
  }
};

// A listing's entries by pool: pool 1's in listing order, pool 0's by key.
struct EntriesByPool {
  std::vector<std::pair<uint64_t, row_index_t>> pool1;
  std::map<uint64_t, row_index_t> pool0;
};
EntriesByPool by_pool(const std::vector<std::pair<uint64_t, row_index_t>>& entries,
                      const RowHandleCodec& codec) {
  EntriesByPool out;
  for (const auto& [key, handle] : entries) {
    if (codec.pool_of(handle) == 1) {
      out.pool1.emplace_back(key, handle);
    } else {
      out.pool0[key] = handle;
    }
  }
  return out;
}

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
    ASSERT_NO_FATAL_FAILURE(expect_every_row(store, oracle));
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
    touch_only(store, touched, &oracle);
    const std::size_t pages_before = store.pool(1).pages();
    EXPECT_EQ(store.compact_pool(1, stream()), pages_before - (left + kPage - 1) / kPage);
    std::set<uint64_t> dirty_after;
    for (const auto& entry : collect(store, true)) dirty_after.insert(entry.first);
    EXPECT_EQ(dirty_after, std::set<uint64_t>(touched.begin(), touched.end()));
    EXPECT_EQ(store.pool(1).pages(), (left + kPage - 1) / kPage);
    EXPECT_EQ(store.pool(1).in_use(), left);
    // Pool 0 has no page to free: the test-only form makes no listing for it, nor waits.
    const auto before_nothing = card().counts();
    EXPECT_EQ(store.compact_pool(0, stream()), 0u);
    EXPECT_EQ((card().counts() - before_nothing).allocations, 0u);
    EXPECT_EQ((card().counts() - before_nothing).host_syncs, 0u);
    ASSERT_NO_FATAL_FAILURE(expect_every_row(store, oracle));
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
    expect_every_row(store, oracle);
  }
}

// compact_pool waits twice whatever the rows it moves (once when none moves), where it waited
// three times for every page of rows: pool 1 (width 8, pages of 16) full at 12 pages, then every
// row from row 96 up erased but `moved` of them, and `moved` rows below 96, so that 96 rows stay
// and exactly `moved` sit above the 6 pages kept: none, one, a page, a page and one, and five
// pages and ten. The two reserved keys (kErasedKey, kEmptyKey as user keys: side slots, not
// probed ones) are the first rows kept above, one dirty and one clean. Pool 0 (width 4) holds
// 117 rows, 21 or more of them at rows 96 and up, which are not pool 1's to move: its pages, rows
// and handles stay. Every row, handle and dirty flag against the oracle after.
TEST_P(CardStoreWidths, CompactionWaitsTwiceWhateverTheRowsItMoves) {
  constexpr std::size_t kPage = 16;
  constexpr std::size_t kKeep = 6 * kPage;
  constexpr std::size_t kPool0Rows = kKeep + kPage + 5;
  for (const std::size_t moved :
       {std::size_t{0}, std::size_t{1}, kPage, kPage + 1, 5 * kPage + 10}) {
    SCOPED_TRACE(moved);
    HashTableOptions options;
    options.page_rows = kPage;
    CardSparseStore store(card(), mixed_config(GetParam()), options);
    const RowHandleCodec codec = store.table().codec();
    std::mt19937_64 rng(moved + 5);
    std::map<uint64_t, std::vector<float>> oracle;
    // One batch: its last keys take the pool's last rows.
    std::vector<uint64_t> pool1_keys = unique_keys(rng, 2 * kKeep - 2);
    pool1_keys.push_back(kErasedKey);
    pool1_keys.push_back(kEmptyKey);
    insert_keys(store, pool1_keys, rng, &oracle, 8);
    insert_mixed(store, kPool0Rows, rng, &oracle, 4);
    ASSERT_EQ(store.pool(1).pages(), 12u);
    ASSERT_EQ(store.pool(0).pages(), 8u);
    const auto index = [&](row_index_t handle) {
      return static_cast<std::size_t>(handle & codec.index_mask());
    };
    // Pool 1's entries, the reserved keys first (spared first above the kept pages).
    EntriesByPool listed = by_pool(entries(store), codec);
    std::vector<std::pair<uint64_t, row_index_t>>& pool1 = listed.pool1;
    std::size_t pool0_above = 0;
    for (const auto& entry : listed.pool0) pool0_above += index(entry.second) >= kKeep ? 1 : 0;
    ASSERT_GE(pool0_above, kPool0Rows - kKeep) << "pool 0's rows 96 and up hold keys";
    std::stable_partition(pool1.begin(), pool1.end(),
                          [](const auto& entry) { return entry.first >= kErasedKey; });
    ASSERT_EQ(pool1[0].first, kErasedKey);
    ASSERT_GE(index(pool1[0].second), kKeep);
    ASSERT_GE(index(pool1[1].second), kKeep);
    std::vector<uint64_t> doomed;
    std::size_t spared_above = 0;
    std::size_t doomed_below = 0;
    for (const auto& [key, handle] : pool1) {
      if (index(handle) >= kKeep ? spared_above++ < moved : doomed_below++ >= moved) continue;
      doomed.push_back(key);
      oracle.erase(key);
    }
    auto d_doomed = to_device(doomed, card().memory(), stream());
    ASSERT_EQ(store.erase(d_doomed.data(), doomed.size(), stream()), doomed.size());
    // A third of the rows left dirty, kErasedKey among them, kEmptyKey not: a moved row keeps its
    // flag.
    std::vector<uint64_t> touched;
    for (const auto& entry : oracle) {
      if (touched.size() * 3 < oracle.size()) touched.push_back(entry.first);
    }
    if (oracle.count(kErasedKey) != 0) touched.push_back(kErasedKey);
    touch_only(store, touched, &oracle);
    const auto before = card().counts();
    EXPECT_EQ(store.compact_pool(1, stream()), 6u);
    EXPECT_EQ((card().counts() - before).host_syncs, moved == 0 ? 1u : 2u);
    EXPECT_EQ(store.pool(1).pages(), 6u);
    EXPECT_EQ(store.pool(1).in_use(), kKeep);
    EXPECT_EQ(store.pool(0).pages(), 8u);
    EXPECT_EQ(store.pool(0).in_use(), kPool0Rows);
    // Every pool-1 key below the kept pages (none left pointing into a freed page), pool 0's
    // where they were.
    const EntriesByPool relisted = by_pool(entries(store), codec);
    for (const auto& [key, handle] : relisted.pool1)
      EXPECT_LT(index(handle), kKeep) << "key " << key;
    EXPECT_EQ(relisted.pool0, listed.pool0);
    ASSERT_NO_FATAL_FAILURE(expect_every_row(store, oracle));
    EXPECT_EQ(oracle.count(kEmptyKey), moved >= 2 ? 1u : 0u);
    std::set<uint64_t> dirty_after;
    for (const auto& entry : collect(store, true)) dirty_after.insert(entry.first);
    EXPECT_EQ(dirty_after, std::set<uint64_t>(touched.begin(), touched.end()));
  }
}

// compact_pool into a lent listing (the pass boundary's kept one, reserved for the rows)
// allocates nothing: while it moves the 1024 rows of 2048 (width 8, pool 1) that sit above the
// pages it keeps, the card makes no allocation and its peak stays at what it held before, its
// scratch arena warmed. A second listing, or room of its own for the moved rows (it erases and
// inserts nothing, so no rehash saves pairs either), fail it. Every row stays intact.
TEST_P(CardStoreWidths, CompactPoolInALentListingAllocatesNothing) {
  constexpr std::size_t kPage = 16;
  constexpr std::size_t kRows = 2048;  // whole pages, halves too
  HashTableOptions options;
  options.page_rows = kPage;
  CardSparseStore store(card(), mixed_config(GetParam()), options);
  const table::RowLayout record = store.layout();
  const auto stride = static_cast<std::size_t>(record.stride());
  store.reserve_capacity(kRows, stream());
  auto listed_keys = card().make_buffer<uint64_t>(0);
  auto listed_rows = card().make_buffer<row_index_t>(0);
  listed_keys.reserve(kRows);
  listed_rows.reserve(kRows);
  auto d_keys = card().make_buffer<uint64_t>(kPage);
  auto d_records = card().make_buffer<float>(kPage * stride);
  std::mt19937_64 rng(71);
  std::map<uint64_t, std::vector<float>> oracle;
  // Width-8 rows a page at a time, so that no test buffer raises the card's peak.
  std::vector<uint64_t> resident = unique_keys(rng, kRows);  // oldest first
  for (std::size_t b = 0; b < kRows; b += kPage) {
    std::vector<float> records;
    for (std::size_t i = b; i < b + kPage; ++i) {
      oracle[resident[i]] = random_record(rng, record, 8);
      records.insert(records.end(), oracle[resident[i]].begin(), oracle[resident[i]].end());
    }
    device::copy_async(d_keys.data(), resident.data() + b, kPage, stream());
    device::copy_async(d_records.data(), records.data(), records.size(), stream());
    ASSERT_EQ(store.insert_rows(d_keys.data(), d_records.data(), kPage, stream()), kPage);
  }
  // The oldest half leaves, a page of keys at a time: the rows left sit in the upper pages.
  for (std::size_t b = 0; b < kRows / 2; b += kPage) {
    device::copy_async(d_keys.data(), resident.data() + b, kPage, stream());
    ASSERT_EQ(store.erase(d_keys.data(), kPage, stream()), kPage);
    for (std::size_t i = b; i < b + kPage; ++i) oracle.erase(resident[i]);
  }
  // The arena warmed for compact_pool's temporaries (a withholding's and a listing's),
  // so that what it holds beyond the card's bytes is its own buffers alone.
  card().scratch().reserve(64 << 10);
  card().stream().synchronize();
  const std::size_t in_use = card().memory().bytes_in_use();
  ASSERT_EQ(card().memory().peak_bytes(), in_use) << "the check below would see nothing";
  const auto before = card().counts();
  EXPECT_EQ(store.compact_pool(1, listed_keys, listed_rows, stream()), kRows / 2 / kPage);
  EXPECT_EQ((card().counts() - before).allocations, 0u);
  EXPECT_EQ(listed_keys.capacity(), kRows);
  EXPECT_EQ(listed_rows.capacity(), kRows);
  EXPECT_EQ(card().scratch().bytes(), std::size_t{64} << 10) << "the arena did not grow";
  EXPECT_EQ(card().memory().peak_bytes(), in_use);
  const auto all = collect(store, false);
  ASSERT_EQ(all.size(), oracle.size());
  for (const auto& [key, row] : oracle) {
    ASSERT_TRUE(same_bits(all.at(key).data(), row.data(), stride)) << "key " << key;
  }
}

// Runs `body(threads)` at each thread count the cpu backend splits a scatter's or a gather's
// items among mid-record (1, 2, 3 and 7; its run_range form), the thread count put back however
// the test ends; the card at 1 (one thread per field either way). Stops at the first count whose
// body fails fatally, as the loop it replaced did.
template <class Body>
void on_every_thread_split(const Body& body) {
#if !defined(GPUBOX_BACKEND_CUDA)
  struct RestoreThreads {
    int threads = omp_get_max_threads();
    ~RestoreThreads() { omp_set_num_threads(threads); }
  } restore;
  for (const int threads : {1, 2, 3, 7}) {
    omp_set_num_threads(threads);
    body(threads);
    if (::testing::Test::HasFatalFailure()) return;
  }
#else
  body(1);
#endif
}

// insert_rows of 0, 1 and n records of every width on 1 to 7 threads: the cpu backend splits the
// scatter's items among its threads mid-record (its run_range form), the card one thread per
// field; every row holds its record's own fields (collect pads them back), against the oracle.
TEST_P(CardStoreWidths, InsertRowsWritesEveryWidthOnEveryThreadSplit) {
  on_every_thread_split([&](int threads) {
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
  });
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
  on_every_thread_split([&](int threads) {
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
  });
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

}  // namespace
}  // namespace gpubox::card_table
