// The RocksDB disk tier under SparseTable: rows moved memory -> disk -> memory stay bit-exact
// (NaN payloads, -0.0, denormals, infinities included), a memory budget holds, and the table
// grows past it. A disk write that fails (DiskTier::fail_writes_after) in the middle of a
// deletion loses no row: what stays in memory is written on its eviction. Rows read back that
// keep their disk copies: disk_tier_read_back_test.cpp (the same binary).
#include "table/disk_tier.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <unordered_map>

#include "table/host_memory_plan.hpp"
#include "table/io/save_dir.hpp"
#include "table/sparse_shard.hpp"
#include "tests/table/shrink_oracle.hpp"
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

// A folder holding anything a disk tier does not write (a user's notes, a data folder, files
// named as RocksDB's but not its) is refused untouched: the open's wipe removed RocksDB-named
// files of any folder and replaced LOG and CURRENT, exit 0. New, empty and earlier tiers open,
// and so does a folder of a sharded server run's shard tiers.
TEST(DiskTier, OpenRefusesAFolderThatIsNoDiskTiersUntouched) {
  ScratchDir dir;
  const auto write = [](const std::string& file, const std::string& text) {
    std::ofstream(file) << text;
  };
  const std::string user = dir.sub("user");
  std::filesystem::create_directories(user);
  write(user + "/notes.txt", "mine\n");
  write(user + "/000123.log", "mine too\n");
  auto refused = DiskTier::open(user, 2);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("holds 'notes.txt', which no disk tier writes"),
            std::string::npos)
      << refused.status().message();
  EXPECT_TRUE(std::filesystem::exists(user + "/000123.log"));
  const std::string named = dir.sub("named");  // RocksDB's names, not its contents
  std::filesystem::create_directories(named);
  write(named + "/CURRENT", "keep\n");
  EXPECT_FALSE(DiskTier::open(named, 2).ok());
  std::ifstream current(named + "/CURRENT");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(current), {}), "keep\n");
  const std::string empty = dir.sub("empty");
  std::filesystem::create_directories(empty);
  EXPECT_TRUE(DiskTier::open(empty, 2).ok());
  EXPECT_TRUE(DiskTier::open(empty, 2).ok());  // now an earlier tier's
  // Its parents are made too (a server's <rocksdb_path>/shard-i of a path not made yet).
  EXPECT_TRUE(DiskTier::open(dir.sub("not_yet") + "/shard-1", 2).ok());
  // That path, once a sharded server run made its shards' tiers in it, opens for a run of one
  // tier (the config's rocksdb_path), shards kept; as does a mount point's lost+found. A folder
  // named like a shard's but not one is no tier's.
  EXPECT_TRUE(DiskTier::open(dir.sub("not_yet") + "/shard-0", 2).ok());
  std::filesystem::create_directories(dir.sub("not_yet") + "/lost+found");
  EXPECT_TRUE(DiskTier::open(dir.sub("not_yet"), 2).ok());
  EXPECT_TRUE(std::filesystem::exists(dir.sub("not_yet") + "/shard-1/CURRENT"));
  std::filesystem::create_directories(dir.sub("not_yet") + "/shard-x");
  EXPECT_FALSE(DiskTier::open(dir.sub("not_yet"), 2).ok());
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

// Without decay a shrink leaves a row's model record as it was (only unseen_days grows), so
// the row keeps its epoch; a row read back with a clean disk copy still has that copy made stale,
// and its eviction writes the aged row: every row, memory or disk, holds the shrink's day.
TEST(DiskTier, AShrinkWithoutDecayLeavesNoDiskCopyClean) {
  ScratchDir dir;
  AccessorConfig opt = testing::test_optimizer();
  opt.show_click_decay_rate = 1.0f;
  opt.delete_threshold = 0.0f;  // the shrink deletes no row
  ShardOnDisk s(opt, one_shard_of(dir, 100));
  std::mt19937_64 rng(43);
  std::unordered_map<uint64_t, std::vector<float>> oracle;
  s.push(0, 100, 0.0f, rng, &oracle);
  s.push(100, 100, 100.0f, rng, &oracle);
  ASSERT_GE(s.shard.stats().rows_on_disk, 100u);  // keys 0..99, and a few hot ones
  ASSERT_TRUE(s.pull(0, 50).ok());                // read back, clean
  ASSERT_EQ(s.shard.stats().disk_copies, 50u);
  ASSERT_TRUE(s.shard.shrink(0).ok());
  ASSERT_EQ(testing::shrink_rows(&oracle, opt), 0u);
  // New rows (pinned, as the read-back ones, and unseen 0) push every aged row to disk.
  ASSERT_TRUE(s.pull(1000, 150).ok());
  ASSERT_EQ(s.shard.stats().disk_copies, 0u);
  s.expect_holds(oracle);
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
