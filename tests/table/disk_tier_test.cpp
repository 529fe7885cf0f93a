// The RocksDB disk tier under SparseTable: rows moved memory -> disk -> memory stay bit-exact
// (NaN payloads, -0.0, denormals, infinities included), a memory budget holds, and the table
// grows past it.
#include "table/disk_tier.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "tests/table/table_test_util.hpp"

namespace gpubox::table {
namespace {

using testing::ScratchDir;

std::vector<float> odd_row(std::mt19937_64& rng, const RowLayout& layout) {
  std::vector<float> row = testing::random_row(rng, layout);
  // Odd bit patterns in the optimizer state and weights must survive every move.
  const uint32_t nan_payload = 0x7fc00000u | static_cast<uint32_t>(rng() & 0x3fffff);
  std::memcpy(&row[layout.embedx_state()], &nan_payload, sizeof(float));
  row[RowLayout::kEmbedW] = -0.0f;
  row[layout.embedx_w()] = std::numeric_limits<float>::denorm_min();
  if (layout.mf_dim > 1) row[layout.embedx_w() + 1] = -std::numeric_limits<float>::infinity();
  return row;
}

TEST(DiskTier, PutMultiGetScanAndClearAreBitExact) {
  ScratchDir dir;
  constexpr int32_t kStride = 5;
  auto disk = DiskTier::open(dir.sub("db"), kStride);
  ASSERT_TRUE(disk.ok()) << disk.status().to_string();
  DiskTier::Batch batch;
  const float row_a[kStride] = {1, -0.0f, 3, std::numeric_limits<float>::denorm_min(), 5};
  const float row_b[kStride] = {6, 7, 8, 9, 10};
  batch.put(3, 0, row_a, 11, kStride);             // key 0 is a valid key
  batch.put(3, ~uint64_t{0}, row_b, 12, kStride);  // and so is the largest
  batch.put(4, 0, row_b, 13, kStride);             // same key, another shard
  ASSERT_TRUE((*disk)->write(batch).ok());
  const uint64_t keys[] = {0, 1, ~uint64_t{0}};
  float rows[3 * kStride];
  uint32_t epochs[3];
  uint8_t found[3];
  ASSERT_TRUE((*disk)->multi_get(3, keys, 3, rows, epochs, found).ok());
  EXPECT_EQ(found[0], 1);
  EXPECT_EQ(found[1], 0);
  EXPECT_EQ(found[2], 1);
  EXPECT_EQ(std::memcmp(rows, row_a, sizeof(row_a)), 0);
  EXPECT_EQ(std::memcmp(rows + 2 * kStride, row_b, sizeof(row_b)), 0);
  EXPECT_EQ(epochs[0], 11u);
  EXPECT_EQ(epochs[2], 12u);
  // Keys out of order (MultiGet sorts them itself) give the same answers.
  const uint64_t reversed[] = {~uint64_t{0}, 1, 0};
  ASSERT_TRUE((*disk)->multi_get(3, reversed, 3, rows, epochs, found).ok());
  EXPECT_EQ(found[0], 1);
  EXPECT_EQ(found[1], 0);
  EXPECT_EQ(found[2], 1);
  EXPECT_EQ(std::memcmp(rows, row_b, sizeof(row_b)), 0);
  EXPECT_EQ(std::memcmp(rows + 2 * kStride, row_a, sizeof(row_a)), 0);
  EXPECT_EQ(epochs[0], 12u);
  EXPECT_EQ(epochs[2], 11u);
  std::vector<uint64_t> scanned;
  ASSERT_TRUE(
      (*disk)->scan(3, [&](uint64_t k, const float*, uint32_t) { scanned.push_back(k); }).ok());
  EXPECT_EQ(scanned, (std::vector<uint64_t>{0, ~uint64_t{0}}));
  ASSERT_TRUE((*disk)->clear_shard(3).ok());
  scanned.clear();
  ASSERT_TRUE(
      (*disk)->scan(3, [&](uint64_t k, const float*, uint32_t) { scanned.push_back(k); }).ok());
  EXPECT_TRUE(scanned.empty());
  ASSERT_TRUE(
      (*disk)->scan(4, [&](uint64_t k, const float*, uint32_t) { scanned.push_back(k); }).ok());
  EXPECT_EQ(scanned.size(), 1u);  // other shards untouched
}

TEST(DiskTier, OpenWipesAnEarlierDatabase) {
  ScratchDir dir;
  {
    auto disk = DiskTier::open(dir.sub("db"), 2);
    ASSERT_TRUE(disk.ok());
    DiskTier::Batch batch;
    const float row[2] = {1, 2};
    batch.put(0, 9, row, 1, 2);
    ASSERT_TRUE((*disk)->write(batch).ok());
  }
  auto disk = DiskTier::open(dir.sub("db"), 2);
  ASSERT_TRUE(disk.ok());
  int rows = 0;
  ASSERT_TRUE((*disk)->scan(0, [&](uint64_t, const float*, uint32_t) { ++rows; }).ok());
  EXPECT_EQ(rows, 0);
}

TEST(DiskTier, MemoryBudgetSpillsAndPullBringsBackBitExact) {
  ScratchDir dir;
  const AccessorConfig opt = testing::test_optimizer(SparseOptimizerKind::kAdam, 4);
  HostTableConfig cfg;
  cfg.shards = 4;
  cfg.threads = 2;
  cfg.rocksdb_path = dir.sub("rocksdb");
  cfg.memory_row_budget = 200;
  auto table = testing::open_table(opt, cfg);
  const RowLayout layout = table->layout();
  std::mt19937_64 rng(77);
  constexpr std::size_t n = 6000;  // 30x the budget
  std::vector<uint64_t> keys(n);
  std::vector<float> rows;
  for (std::size_t i = 0; i < n; ++i) {
    keys[i] = rng();
    const auto row = odd_row(rng, layout);
    rows.insert(rows.end(), row.begin(), row.end());
  }
  ASSERT_TRUE(table->push(keys.data(), n, rows.data()).ok());
  auto stats = table->stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_LE(stats->rows_in_memory, cfg.memory_row_budget);
  EXPECT_EQ(stats->rows_in_memory + stats->rows_on_disk, n);
  EXPECT_GT(stats->rows_on_disk, n / 2);

  testing::RowMap expected;
  for (std::size_t i = 0; i < n; ++i) {
    expected[keys[i]].assign(rows.begin() + i * layout.stride(),
                             rows.begin() + (i + 1) * layout.stride());
  }
  EXPECT_TRUE(testing::same_rows(testing::snapshot(*table), expected));

  // Pull everything back in batches (each pull brings its rows back, then evicts again).
  std::vector<float> back(n * layout.stride());
  for (std::size_t begin = 0; begin < n; begin += 150) {
    const std::size_t m = std::min<std::size_t>(150, n - begin);
    std::size_t created = 1;
    ASSERT_TRUE(
        table
            ->pull(keys.data() + begin, nullptr, m, back.data() + begin * layout.stride(), &created)
            .ok());
    EXPECT_EQ(created, 0u);
  }
  EXPECT_TRUE(testing::same_bits(back, rows));
  EXPECT_TRUE(testing::same_rows(testing::snapshot(*table), expected));
  stats = table->stats();
  EXPECT_LE(stats->rows_in_memory, cfg.memory_row_budget);
}

TEST(DiskTier, EvictsLowestScoreFirst) {
  ScratchDir dir;
  AccessorConfig opt = testing::test_optimizer();
  HostTableConfig cfg;
  cfg.shards = 1;
  cfg.rocksdb_path = dir.sub("rocksdb");
  cfg.memory_row_budget = 100;
  auto table = testing::open_table(opt, cfg);
  const RowLayout layout = table->layout();
  std::mt19937_64 rng(5);
  constexpr std::size_t n = 400;
  std::vector<uint64_t> keys(n);
  std::vector<float> rows;
  for (std::size_t i = 0; i < n; ++i) {
    keys[i] = i;
    auto row = testing::random_row(rng, layout);
    row[RowLayout::kShow] = static_cast<float>(i);  // score grows with the key
    row[RowLayout::kClick] = 0.0f;
    rows.insert(rows.end(), row.begin(), row.end());
  }
  ASSERT_TRUE(table->push(keys.data(), n, rows.data()).ok());
  // The hottest rows stayed in memory: erasing every key below n - 50 leaves exactly the
  // memory rows plus nothing on disk only when the memory rows are the top ones.
  auto stats = table->stats();
  ASSERT_TRUE(stats.ok());
  const uint64_t in_memory = stats->rows_in_memory;
  ASSERT_GT(in_memory, 0u);
  std::vector<uint64_t> cold(keys.begin(), keys.end() - in_memory);
  ASSERT_TRUE(table->erase(cold.data(), cold.size()).ok());
  stats = table->stats();
  EXPECT_EQ(stats->rows_on_disk, 0u);
  EXPECT_EQ(stats->rows_in_memory, in_memory);
}

TEST(DiskTier, ColdRowsMoveAtShrinkAndAgeOnDisk) {
  ScratchDir dir;
  AccessorConfig opt = testing::test_optimizer();
  opt.delete_threshold = 0.0f;
  opt.delete_after_unseen_days = 2.0f;
  HostTableConfig cfg;
  cfg.shards = 3;
  cfg.rocksdb_path = dir.sub("rocksdb");
  cfg.cold_after_days = 1;
  auto table = testing::open_table(opt, cfg);
  const RowLayout layout = table->layout();
  std::mt19937_64 rng(9);
  std::vector<uint64_t> keys = {1, 2, 3, 4, 5};
  std::vector<float> rows;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto row = odd_row(rng, layout);
    rows.insert(rows.end(), row.begin(), row.end());
  }
  ASSERT_TRUE(table->push(keys.data(), keys.size(), rows.data()).ok());
  EXPECT_EQ(table->shrink().value(), 0u);
  auto stats = table->stats();
  EXPECT_EQ(stats->rows_in_memory, 0u);
  EXPECT_EQ(stats->rows_on_disk, 5u);
  // Seen again: back in memory with unseen_days 0.
  std::vector<float> got(layout.stride());
  ASSERT_TRUE(table->pull(&keys[0], nullptr, 1, got.data(), nullptr).ok());
  EXPECT_EQ(got[RowLayout::kUnseenDays], 0.0f);
  EXPECT_EQ(table->stats()->rows_in_memory, 1u);
  // Day 2: the four disk rows reach unseen 2 (kept), key 1 goes cold again (unseen 1, moved).
  // Day 3: the four reach unseen 3 > 2 and are deleted on disk; key 1 stays (unseen 2).
  EXPECT_EQ(table->shrink().value(), 0u);
  EXPECT_EQ(table->shrink().value(), 4u);
  stats = table->stats();
  EXPECT_EQ(stats->rows_in_memory, 0u);
  EXPECT_EQ(stats->rows_on_disk, 1u);
  EXPECT_EQ(table->size().value(), 1u);
}

}  // namespace
}  // namespace gpubox::table
