// The RocksDB disk tier under SparseTable: rows moved memory -> disk -> memory stay bit-exact
// (NaN payloads, -0.0, denormals, infinities included), a memory budget holds, and the table
// grows past it. A row read back keeps its disk copy: evicting it unchanged writes and deletes
// nothing, a changed one is written on eviction, and scans, saves, shrink and erase see each key
// once, at its newest value. A disk write that fails (DiskTier::fail_writes_after) in the middle
// of a deletion loses no row: what stays in memory is written on its eviction.
#include "table/disk_tier.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <unordered_map>

#include "table/host_memory_plan.hpp"
#include "table/io/save_dir.hpp"
#include "table/sparse_shard.hpp"
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

// One shard over its own disk tier, planned from `cfg`, so that a test can inject disk faults.
struct ShardOnDisk {
  ShardOnDisk(const AccessorConfig& accessor, const HostTableConfig& cfg)
      : opt(accessor),
        layout(record_layout(opt)),
        plan(plan_host_memory(cfg, layout.stride())),
        disk(DiskTier::open(cfg.rocksdb_path, layout.stride(), plan.disk_memory_bytes).value()),
        shard(0, layout, opt, disk.get(), plan, &epochs) {}

  // Pushes keys first.. first+n-1 (rows random, `show` each, unseen 0), recorded in *oracle.
  void push(uint64_t first, std::size_t n, float show, std::mt19937_64& rng,
            std::unordered_map<uint64_t, std::vector<float>>* oracle) {
    std::vector<uint64_t> keys(n);
    std::vector<float> rows;
    for (std::size_t i = 0; i < n; ++i) {
      keys[i] = first + i;
      auto row = testing::random_row(rng, layout);
      row[RowLayout::kShow] = show;
      row[RowLayout::kClick] = 0.0f;
      row[RowLayout::kUnseenDays] = 0.0f;
      rows.insert(rows.end(), row.begin(), row.end());
      (*oracle)[keys[i]] = row;
    }
    const std::vector<uint32_t> pos = positions(n);
    ASSERT_TRUE(shard.push(keys.data(), pos.data(), n, rows.data()).ok());
  }
  Status pull(uint64_t first, std::size_t n) {
    std::vector<uint64_t> keys(n);
    for (std::size_t i = 0; i < n; ++i) keys[i] = first + i;
    std::vector<float> rows(n * layout.stride());
    const std::vector<uint32_t> pos = positions(n);
    return shard.pull(keys.data(), nullptr, pos.data(), n, rows.data(), nullptr);
  }
  // Every key of `oracle` is in the shard (memory or disk) with its bits.
  void expect_holds(const std::unordered_map<uint64_t, std::vector<float>>& oracle) {
    std::unordered_map<uint64_t, std::vector<float>> got;
    ASSERT_TRUE(shard
                    .for_each_row([&](uint64_t key, const float* row) {
                      got[key].assign(row, row + layout.stride());
                    })
                    .ok());
    std::size_t missing = 0, differ = 0;
    for (const auto& [key, row] : oracle) {
      if (!got.count(key)) {
        ++missing;
      } else if (!testing::same_bits(got.at(key), row)) {
        ++differ;
      }
    }
    EXPECT_EQ(missing, 0u);
    EXPECT_EQ(differ, 0u);
  }
  static std::vector<uint32_t> positions(std::size_t n) {
    std::vector<uint32_t> pos(n);
    for (std::size_t i = 0; i < n; ++i) pos[i] = static_cast<uint32_t>(i);
    return pos;
  }

  const AccessorConfig opt;
  const RowLayout layout;
  const HostMemoryPlan plan;
  std::unique_ptr<DiskTier> disk;
  TableEpochs epochs;
  SparseShard shard;
};

HostTableConfig one_shard_of(const ScratchDir& dir, uint64_t rows) {
  HostTableConfig cfg;
  cfg.shards = 1;
  cfg.rocksdb_path = dir.sub("rocksdb");
  cfg.memory_row_budget = rows;
  return cfg;
}

// An erase of more rows than one disk batch (65,536 deletes) whose second batch fails: the
// erase reports it and every row stays, including those whose disk copies the first batch
// deleted; evicted later, they are written, not dropped as clean copies.
TEST(DiskTier, AnEraseWhoseLaterDiskBatchFailsLosesNoRow) {
  ScratchDir dir;
  constexpr std::size_t kCold = 80000, kHot = 100000;
  ShardOnDisk s(testing::test_optimizer(), one_shard_of(dir, kHot));
  std::mt19937_64 rng(41);
  std::unordered_map<uint64_t, std::vector<float>> oracle;
  // Cold rows 0..kCold-1, then hot ones that push every cold row to disk.
  s.push(0, kCold, 0.0f, rng, &oracle);
  s.push(1000000, kHot, 100.0f, rng, &oracle);
  ASSERT_EQ(s.shard.stats().rows_on_disk, kCold);
  // The erase reads the cold rows back (disk copies kept, clean), deletes the first 65,536
  // copies, and fails on the rest.
  std::vector<uint64_t> keys(kCold);
  for (std::size_t i = 0; i < kCold; ++i) keys[i] = i;
  const std::vector<uint32_t> pos = ShardOnDisk::positions(kCold);
  s.disk->fail_writes_after(1);
  EXPECT_FALSE(s.shard.erase(keys.data(), pos.data(), kCold).ok());
  s.disk->fail_writes_after(-1);
  EXPECT_EQ(s.shard.stats().rows_in_memory, kCold + kHot);
  EXPECT_EQ(s.shard.stats().disk_copies, kCold - 65536);
  // One new key: eviction takes the cold rows (unpinned, lowest score) to disk.
  ASSERT_TRUE(s.pull(5000000, 1).ok());
  ASSERT_GE(s.shard.stats().rows_on_disk, kCold);
  s.expect_holds(oracle);
}

// A shrink whose deletion of memory rows fails leaves them aged in memory: their disk copies
// (kept since their read-back) are stale, and eviction writes the aged rows over them.
TEST(DiskTier, AShrinkWhoseDeletionFailsKeepsTheAgedRows) {
  ScratchDir dir;
  AccessorConfig opt = testing::test_optimizer();
  opt.delete_after_unseen_days = 0.5f;  // a shrink deletes every row
  ShardOnDisk s(opt, one_shard_of(dir, 100));
  std::mt19937_64 rng(42);
  std::unordered_map<uint64_t, std::vector<float>> oracle;
  s.push(0, 100, 0.0f, rng, &oracle);  // the score of a new row: unseen days decide below
  s.push(100, 100, 100.0f, rng, &oracle);
  ASSERT_GE(s.shard.stats().rows_on_disk, 100u);  // keys 0..99, and a few hot ones
  ASSERT_TRUE(s.pull(0, 50).ok());                // read back, clean
  ASSERT_EQ(s.shard.stats().disk_copies, 50u);
  // The disk rows' batch is written (all deleted); the memory rows' deletion fails.
  s.disk->fail_writes_after(1);
  EXPECT_FALSE(s.shard.shrink(0).ok());
  s.disk->fail_writes_after(-1);
  std::unordered_map<uint64_t, std::vector<float>> aged;
  for (uint64_t key = 0; key < 50; ++key) {
    std::vector<float> row = oracle.at(key);
    row[RowLayout::kShow] *= opt.show_click_decay_rate;
    row[RowLayout::kClick] *= opt.show_click_decay_rate;
    row[RowLayout::kUnseenDays] += 1.0f;
    aged[key] = row;
  }
  // New rows (pinned, as the read-back ones, and unseen 0) push every aged row to disk.
  ASSERT_TRUE(s.pull(1000, 150).ok());
  ASSERT_EQ(s.shard.stats().disk_copies, 0u);
  s.expect_holds(aged);
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

// Keys 0..n-1 pushed (unpinned, unseen 0) into a one-shard table of `budget` rows, so that all
// but the budget's hottest rows are on disk; returns the rows pushed.
std::vector<float> push_keys(SparseTable& table, std::size_t n, std::mt19937_64& rng) {
  const RowLayout layout = table.layout();
  std::vector<uint64_t> keys(n);
  std::vector<float> rows;
  for (std::size_t i = 0; i < n; ++i) {
    keys[i] = i;
    auto row = testing::random_row(rng, layout);
    row[RowLayout::kShow] = static_cast<float>(n - i);  // keys 0.. are the hottest
    row[RowLayout::kClick] = 0.0f;
    rows.insert(rows.end(), row.begin(), row.end());
  }
  EXPECT_TRUE(table.push(keys.data(), n, rows.data()).ok());
  return rows;
}

HostTableConfig one_shard_of_100_rows(const ScratchDir& dir) {
  HostTableConfig cfg;
  cfg.shards = 1;
  cfg.rocksdb_path = dir.sub("rocksdb");
  cfg.memory_row_budget = 100;
  return cfg;
}

// Key i -> its row in `rows` (push_keys' keys 0..n-1): the oracle of what the table holds.
testing::RowMap rows_by_key(const std::vector<float>& rows, std::size_t n, int32_t stride) {
  testing::RowMap out;
  for (std::size_t i = 0; i < n; ++i) {
    out[i].assign(rows.begin() + i * stride, rows.begin() + (i + 1) * stride);
  }
  return out;
}

// keys[i] -> its row in `rows` (packed in the order of keys).
testing::RowMap rows_by_key_of(const std::vector<uint64_t>& keys, const std::vector<float>& rows,
                               int32_t stride) {
  testing::RowMap out;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    out[keys[i]].assign(rows.begin() + i * stride, rows.begin() + (i + 1) * stride);
  }
  return out;
}

std::vector<uint64_t> key_range(uint64_t begin, uint64_t end) {
  std::vector<uint64_t> keys;
  for (uint64_t k = begin; k < end; ++k) keys.push_back(k);
  return keys;
}

TEST(DiskTier, ARowReadBackUnchangedIsEvictedWithoutAWriteOrADelete) {
  ScratchDir dir;
  const AccessorConfig opt = testing::test_optimizer();
  auto table = testing::open_table(opt, one_shard_of_100_rows(dir));
  const int32_t stride = table->layout().stride();
  std::mt19937_64 rng(31);
  constexpr std::size_t n = 400;
  const std::vector<float> rows = push_keys(*table, n, rng);
  testing::RowMap expected = rows_by_key(rows, n, stride);
  ASSERT_EQ(table->stats()->rows_on_disk, n - table->stats()->rows_in_memory);
  ASSERT_GE(table->stats()->rows_on_disk, 300u);

  // Read back a budget of cold rows (keys 300..399, on disk; pinned, so the pushed rows leave
  // memory first), then 80 others (keys 200..279): the second pull evicts read-back rows only,
  // which nobody changed.
  const SparseTable::DiskTraffic before = table->disk_traffic();
  std::vector<float> got(100 * stride);
  const std::vector<uint64_t> first = key_range(300, 400), second = key_range(200, 280);
  ASSERT_TRUE(table->pull(first.data(), nullptr, first.size(), got.data(), nullptr).ok());
  const SparseTable::DiskTraffic read = table->disk_traffic();
  EXPECT_EQ(read.rows_read_back - before.rows_read_back, first.size());
  EXPECT_EQ(read.disk.deletes, before.disk.deletes) << "a read-back deleted its disk copy";
  ASSERT_TRUE(table->pull(second.data(), nullptr, second.size(), got.data(), nullptr).ok());
  const SparseTable::DiskTraffic after = table->disk_traffic();
  const uint64_t evicted = after.rows_evicted - read.rows_evicted;
  const uint64_t clean = after.rows_evicted_clean - read.rows_evicted_clean;
  EXPECT_GE(evicted, 60u);  // memory held about 90 rows before the 80 came
  EXPECT_EQ(clean, evicted);
  EXPECT_EQ(after.disk.puts, read.disk.puts);
  EXPECT_EQ(after.disk.deletes, before.disk.deletes);
  // Pulls reset unseen days, which were 0: the table still holds exactly what was pushed, each
  // key once.
  EXPECT_TRUE(testing::same_rows(testing::snapshot(*table), expected));
  EXPECT_EQ(table->size().value(), n);
}

TEST(DiskTier, ARowChangedAfterItsReadBackIsWrittenOnEvictionAndNeverServedStale) {
  ScratchDir dir;
  const AccessorConfig opt = testing::test_optimizer();
  auto table = testing::open_table(opt, one_shard_of_100_rows(dir));
  const RowLayout layout = table->layout();
  const int32_t stride = layout.stride();
  std::mt19937_64 rng(32);
  constexpr std::size_t n = 400;
  const std::vector<float> rows = push_keys(*table, n, rng);
  testing::RowMap oracle = rows_by_key(rows, n, stride);
  auto check = [&](const char* when) {
    SCOPED_TRACE(when);
    const testing::RowMap got = testing::snapshot(*table);  // fails on a key seen twice
    ASSERT_EQ(got.size(), oracle.size());
    for (const auto& [key, row] : oracle) {
      ASSERT_TRUE(got.count(key)) << key;
      EXPECT_TRUE(testing::same_bits(got.at(key), row)) << "key " << key;
    }
  };
  // Read back a budget of cold rows (keys 300..399), change half of 300..359 (a push), then pull
  // 80 others, which evicts them.
  const std::vector<uint64_t> back = key_range(300, 400);
  std::vector<float> got(back.size() * stride);
  ASSERT_TRUE(table->pull(back.data(), nullptr, back.size(), got.data(), nullptr).ok());
  std::vector<uint64_t> changed;
  std::vector<float> pushed;
  for (uint64_t key = 300; key < 360; key += 2) {
    auto row = testing::random_row(rng, layout);
    row[RowLayout::kShow] = 0.5f;  // cold: evicted first
    row[RowLayout::kClick] = 0.0f;
    changed.push_back(key);
    pushed.insert(pushed.end(), row.begin(), row.end());
    oracle[key] = row;
  }
  ASSERT_TRUE(table->push(changed.data(), changed.size(), pushed.data()).ok());
  check("changed in memory");
  const SparseTable::DiskTraffic before = table->disk_traffic();
  const std::vector<uint64_t> other = key_range(200, 280);
  ASSERT_TRUE(table->pull(other.data(), nullptr, other.size(), got.data(), nullptr).ok());
  const SparseTable::DiskTraffic after = table->disk_traffic();
  // The 30 changed rows (unpinned by their push: evicted first) were written over their stale
  // copies; the read-back rows evicted after them cost nothing.
  EXPECT_EQ(after.disk.puts - before.disk.puts, changed.size());
  EXPECT_EQ(after.rows_evicted - before.rows_evicted -
                (after.rows_evicted_clean - before.rows_evicted_clean),
            changed.size());
  EXPECT_EQ(after.disk.deletes, before.disk.deletes);
  check("evicted");
  // Read back again: the pushed values, not the copies read the first time.
  std::vector<float> again(changed.size() * stride);
  ASSERT_TRUE(table->pull(changed.data(), nullptr, changed.size(), again.data(), nullptr).ok());
  EXPECT_TRUE(testing::same_bits(again, pushed));

  // A day passes with copies on disk: each row ages once (memory wins, its copy is skipped).
  for (auto& [key, row] : oracle) {
    row[RowLayout::kShow] *= opt.show_click_decay_rate;
    row[RowLayout::kClick] *= opt.show_click_decay_rate;
    row[RowLayout::kUnseenDays] += 1.0f;
  }
  for (auto it = oracle.begin(); it != oracle.end();) {
    it = row_score(it->second.data(), opt) < opt.delete_threshold ? oracle.erase(it) : ++it;
  }
  table->shrink().value();
  check("after a shrink");
  // Erasing a row that has a disk copy (read back above, aged since) deletes the copy too: it
  // does not come back.
  const uint64_t gone = 301;  // read back by the first pull, unchanged by the push
  ASSERT_TRUE(oracle.count(gone));
  ASSERT_TRUE(table->pull(&gone, nullptr, 1, got.data(), nullptr).ok());
  ASSERT_TRUE(table->erase(&gone, 1).ok());
  oracle.erase(gone);
  ASSERT_TRUE(table->pull(other.data(), nullptr, other.size(), got.data(), nullptr).ok());
  for (uint64_t key : other) {
    if (oracle.count(key)) oracle[key][RowLayout::kUnseenDays] = 0.0f;  // pull resets it
  }
  check("after an erase");
  std::size_t unknown = 0;
  ASSERT_TRUE(table->peek(&gone, nullptr, 1, got.data(), &unknown).ok());
  EXPECT_EQ(unknown, 1u);
}

// A checkpoint saved while read-back rows keep their disk copies (clean and stale) holds each
// key once, at its newest value (SparseShard::snapshot); a delta loaded over rows that the base
// load sent to disk reads them back and overwrites them, and evicting them writes the delta's
// values.
TEST(DiskTier, SavesAndLoadsSeeEachKeyOnceAtItsNewestValueWhileDiskCopiesExist) {
  ScratchDir dir;
  const AccessorConfig opt = testing::test_optimizer();
  auto table = testing::open_table(opt, one_shard_of_100_rows(dir));
  const RowLayout layout = table->layout();
  const int32_t stride = layout.stride();
  std::mt19937_64 rng(33);
  constexpr std::size_t n = 400;
  const std::vector<float> rows = push_keys(*table, n, rng);
  testing::RowMap expected = rows_by_key(rows, n, stride);
  ASSERT_TRUE(table->save(dir.sub("base"), SaveKind::kBase).ok());
  // Keys 300..399 read back (copies clean), the even ones of 300..358 changed (copies stale).
  const std::vector<uint64_t> back = key_range(300, 400);
  std::vector<float> got(back.size() * stride);
  ASSERT_TRUE(table->pull(back.data(), nullptr, back.size(), got.data(), nullptr).ok());
  std::vector<uint64_t> changed;
  std::vector<float> pushed;
  for (uint64_t key = 300; key < 360; key += 2) {
    const auto row = testing::random_row(rng, layout);
    changed.push_back(key);
    pushed.insert(pushed.end(), row.begin(), row.end());
    expected[key] = row;
  }
  ASSERT_TRUE(table->push(changed.data(), changed.size(), pushed.data()).ok());
  ASSERT_GE(table->disk_traffic().rows_read_back, back.size());
  ASSERT_TRUE(table->save(dir.sub("delta"), SaveKind::kDelta).ok());
  ASSERT_TRUE(table->save(dir.sub("checkpoint"), SaveKind::kCheckpoint).ok());
  auto manifest = io::read_manifest(io::FileEnv::posix(), dir.sub("checkpoint"), "sparse");
  ASSERT_TRUE(manifest.ok()) << manifest.status().to_string();
  uint64_t records = 0;
  for (const auto& file : manifest->files) records += file.records;
  EXPECT_EQ(records, n);  // a key with a disk copy is saved once

  ScratchDir other;
  auto restored = testing::open_table(opt, one_shard_of_100_rows(other));
  ASSERT_TRUE(restored->load(dir.sub("checkpoint")).ok());
  EXPECT_TRUE(testing::same_rows(testing::snapshot(*restored), expected));

  auto delta = io::read_manifest(io::FileEnv::posix(), dir.sub("delta"), "sparse");
  ASSERT_TRUE(delta.ok()) << delta.status().to_string();
  records = 0;
  for (const auto& file : delta->files) records += file.records;
  ASSERT_EQ(records, changed.size());  // the delta holds the changed rows, nothing else

  ScratchDir third;
  auto resumed = testing::open_table(opt, one_shard_of_100_rows(third));
  ASSERT_TRUE(resumed->load(dir.sub("base")).ok());
  // Pulling 100 other keys pins them (pinned rows are evicted last), so every changed row is on
  // disk when the delta loads: each of them must be read back, exactly once.
  const std::vector<uint64_t> others = key_range(0, 100);
  got.resize(others.size() * stride);
  ASSERT_TRUE(resumed->pull(others.data(), nullptr, others.size(), got.data(), nullptr).ok());
  const uint64_t read_back = resumed->disk_traffic().rows_read_back;
  ASSERT_TRUE(resumed->load(dir.sub("delta")).ok());
  EXPECT_EQ(resumed->disk_traffic().rows_read_back - read_back, changed.size());
  // Every changed row holds the delta's model values (a row the load missed keeps the base's).
  std::vector<float> loaded(changed.size() * stride);
  std::size_t unknown = 0;
  ASSERT_TRUE(resumed->peek(changed.data(), nullptr, changed.size(), loaded.data(), &unknown).ok());
  EXPECT_EQ(unknown, 0u);
  const testing::RowMap changed_rows =
      testing::model_of(rows_by_key_of(changed, loaded, stride), layout);
  const testing::RowMap model = testing::model_of(expected, layout);
  for (const uint64_t key : changed) {
    EXPECT_EQ(changed_rows.at(key), model.at(key)) << "key " << key << " lost its delta value";
  }
  // Every row the delta loaded goes back to disk.
  ASSERT_TRUE(resumed->pull(others.data(), nullptr, others.size(), got.data(), nullptr).ok());
  EXPECT_TRUE(testing::same_rows(testing::model_of(testing::snapshot(*resumed), layout), model));
}

}  // namespace
}  // namespace gpubox::table
