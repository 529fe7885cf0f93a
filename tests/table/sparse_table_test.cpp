// SparseTable against a std::unordered_map oracle: seeded random pull/push/erase/shrink, with
// and without the disk tier, several shard and thread counts, batch sizes 0, 1, n.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "tests/table/shrink_oracle.hpp"
#include "tests/table/table_test_util.hpp"

namespace gpubox::table {
namespace {

using testing::RowMap;
using testing::ScratchDir;

// The reference: the accessor rules applied one key at a time, in batch order.
class OracleTable {
 public:
  OracleTable(const AccessorConfig& cfg)
      : cfg_(cfg), layout_(RowLayout::make(cfg.optimizer.kind, cfg.mf_dim, cfg.storage)) {}

  std::vector<float> pull(const std::vector<uint64_t>& keys, const std::vector<int32_t>& slots,
                          std::size_t* created) {
    std::vector<float> out;
    *created = 0;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      auto it = rows_.find(keys[i]);
      if (it == rows_.end()) {
        std::vector<float> row(layout_.stride());
        init_row(row.data(), layout_, cfg_, keys[i], slots[i]);
        it = rows_.emplace(keys[i], row).first;
        ++*created;
      }
      it->second[RowLayout::kUnseenDays] = 0.0f;
      out.insert(out.end(), it->second.begin(), it->second.end());
    }
    return out;
  }
  void push(const std::vector<uint64_t>& keys, const std::vector<float>& rows) {
    const std::size_t stride = layout_.stride();
    for (std::size_t i = 0; i < keys.size(); ++i) {
      std::vector<float> row(rows.begin() + i * stride, rows.begin() + (i + 1) * stride);
      row[RowLayout::kUnseenDays] = 0.0f;
      rows_[keys[i]] = row;
    }
  }
  void erase(const std::vector<uint64_t>& keys) {
    for (uint64_t k : keys) rows_.erase(k);
  }
  uint64_t shrink() { return gpubox::table::testing::shrink_rows(&rows_, cfg_); }
  RowMap rows() const { return RowMap(rows_.begin(), rows_.end()); }
  std::size_t size() const { return rows_.size(); }

 private:
  AccessorConfig cfg_;
  RowLayout layout_;
  std::unordered_map<uint64_t, std::vector<float>> rows_;
};

// (shards, threads, disk tier: 0 none, 1 with cold_after_days, 2 with a small memory budget,
// sparse_storage)
class SparseTableOracleTest
    : public ::testing::TestWithParam<std::tuple<int, int, int, SparseStorage>> {};

TEST_P(SparseTableOracleTest, RandomOpsMatchOracle) {
  const auto [shards, threads, disk, storage] = GetParam();
  ScratchDir dir;
  const AccessorConfig opt = testing::test_optimizer(
      SparseOptimizerKind::kAdagrad, storage == SparseStorage::kFp32 ? 4 : 5, storage);
  HostTableConfig cfg;
  cfg.shards = shards;
  cfg.threads = threads;
  if (disk > 0) cfg.rocksdb_path = dir.sub("rocksdb");
  if (disk == 1) cfg.cold_after_days = 1;
  if (disk == 2) cfg.memory_row_budget = 300;
  auto table = testing::open_table(opt, cfg);
  OracleTable oracle(opt);
  const RowLayout layout = table->layout();
  const std::size_t stride = layout.stride();

  std::mt19937_64 rng(1234 + shards * 7 + threads * 3 + disk);
  const uint64_t key_space = 3000;
  auto random_keys = [&](std::size_t n) {
    std::vector<uint64_t> keys(n);
    for (auto& k : keys) k = (rng() % key_space) * 0x9e3779b97f4a7c15ULL;  // spread, with repeats
    return keys;
  };
  const std::size_t sizes[] = {0, 1, 2, 17, 700, 5000};  // 5000 crosses the parallel threshold
  for (int step = 0; step < 60; ++step) {
    const std::size_t n = sizes[rng() % std::size(sizes)];
    const int op = static_cast<int>(rng() % 10);
    if (op < 4) {
      const auto keys = random_keys(n);
      std::vector<int32_t> slots(n);
      for (auto& s : slots) s = static_cast<int32_t>(rng() % 26);
      std::vector<float> got(n * stride, -1.0f);
      std::size_t created = 0, expected_created = 0;
      ASSERT_TRUE(table->pull(keys.data(), slots.data(), n, got.data(), &created).ok());
      const std::vector<float> want = oracle.pull(keys, slots, &expected_created);
      ASSERT_EQ(created, expected_created) << "step " << step;
      ASSERT_TRUE(testing::same_bits(got, want)) << "pull differs at step " << step;
    } else if (op < 7) {
      const auto keys = random_keys(n);
      std::vector<float> rows;
      for (std::size_t i = 0; i < n; ++i) {
        const auto row = testing::random_row(rng, layout);
        rows.insert(rows.end(), row.begin(), row.end());
      }
      ASSERT_TRUE(table->push(keys.data(), n, rows.data()).ok());
      oracle.push(keys, rows);
    } else if (op < 9) {
      const auto keys = random_keys(n / 4);
      ASSERT_TRUE(table->erase(keys.data(), keys.size()).ok());
      oracle.erase(keys);
    } else {
      auto deleted = table->shrink();
      ASSERT_TRUE(deleted.ok()) << deleted.status().to_string();
      EXPECT_EQ(*deleted, oracle.shrink()) << "step " << step;
    }
    auto stats = table->stats();
    ASSERT_TRUE(stats.ok());
    ASSERT_EQ(stats->rows_in_memory + stats->rows_on_disk, oracle.size()) << "step " << step;
    if (disk == 2) {
      EXPECT_LE(stats->rows_in_memory, cfg.memory_row_budget + shards) << "step " << step;
    }
    if (disk == 0) {
      EXPECT_EQ(stats->rows_on_disk, 0u);
    }
  }
  EXPECT_TRUE(testing::same_rows(testing::snapshot(*table), oracle.rows()));
  EXPECT_GT(oracle.size(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Configs, SparseTableOracleTest,
                         ::testing::Values(std::make_tuple(1, 1, 0, SparseStorage::kFp32),
                                           std::make_tuple(3, 2, 0, SparseStorage::kFp32),
                                           std::make_tuple(64, 2, 0, SparseStorage::kFp32),
                                           std::make_tuple(8, 2, 1, SparseStorage::kFp32),
                                           std::make_tuple(5, 1, 2, SparseStorage::kFp32),
                                           std::make_tuple(16, 2, 2, SparseStorage::kFp32),
                                           // odd mf_dim: a value shares embed_w's slot
                                           std::make_tuple(3, 2, 0, SparseStorage::kFp16),
                                           std::make_tuple(5, 1, 2, SparseStorage::kFp16),
                                           std::make_tuple(8, 2, 1, SparseStorage::kBf16)));

TEST(SparseTable, PullCreatesRowsByAccessorRules) {
  const AccessorConfig opt = testing::test_optimizer(SparseOptimizerKind::kAdam, 3);
  auto table = testing::open_table(opt, HostTableConfig{});
  const RowLayout layout = table->layout();
  const uint64_t keys[] = {42, 42, 7};
  const int32_t slots[] = {5, 9, 11};
  std::vector<float> rows(3 * layout.stride());
  std::size_t created = 0;
  ASSERT_TRUE(table->pull(keys, slots, 3, rows.data(), &created).ok());
  EXPECT_EQ(created, 2u);  // the repeated key is created once, with its first slot
  std::vector<float> want(layout.stride());
  init_row(want.data(), layout, opt, 42, 5);
  EXPECT_TRUE(testing::same_bits({rows.begin(), rows.begin() + layout.stride()}, want));
  EXPECT_TRUE(testing::same_bits(
      {rows.begin() + layout.stride(), rows.begin() + 2 * layout.stride()}, want));
  EXPECT_EQ(rows[2 * layout.stride() + layout.slot()], 11.0f);
  // null slots: slot 0
  const uint64_t other = 99;
  ASSERT_TRUE(table->pull(&other, nullptr, 1, rows.data(), nullptr).ok());
  EXPECT_EQ(rows[layout.slot()], 0.0f);
  EXPECT_EQ(table->size().value(), 3u);
}

TEST(SparseTable, ShrinkAgesDecaysAndPullResetsUnseenDays) {
  AccessorConfig opt = testing::test_optimizer();
  opt.delete_threshold = 0.0f;
  auto table = testing::open_table(opt, HostTableConfig{});
  const RowLayout layout = table->layout();
  std::mt19937_64 rng(3);
  auto row = testing::random_row(rng, layout);
  row[RowLayout::kShow] = 10.0f;
  row[RowLayout::kClick] = 2.0f;
  row[RowLayout::kUnseenDays] = 9.0f;  // a push resets it
  const uint64_t key = 5;
  ASSERT_TRUE(table->push(&key, 1, row.data()).ok());
  for (int day = 1; day <= 3; ++day) {
    EXPECT_EQ(table->shrink().value(), 0u);
    EXPECT_EQ(table->day(), day);
  }
  std::vector<float> got(layout.stride());
  ASSERT_TRUE(
      table->for_each_row([&](uint64_t, const float* r) { got.assign(r, r + layout.stride()); })
          .ok());
  EXPECT_EQ(got[RowLayout::kUnseenDays], 3.0f);
  EXPECT_FLOAT_EQ(got[RowLayout::kShow], 10.0f * 0.9f * 0.9f * 0.9f);
  EXPECT_FLOAT_EQ(got[RowLayout::kClick], 2.0f * 0.9f * 0.9f * 0.9f);
  ASSERT_TRUE(table->pull(&key, nullptr, 1, got.data(), nullptr).ok());
  EXPECT_EQ(got[RowLayout::kUnseenDays], 0.0f);
  // Unseen for more than delete_after_unseen_days (3): deleted on the 4th shrink.
  for (int day = 0; day < 3; ++day) EXPECT_EQ(table->shrink().value(), 0u);
  EXPECT_EQ(table->shrink().value(), 1u);
  EXPECT_EQ(table->size().value(), 0u);
}

// peek (evaluation's read-only pull): rows held in memory and on disk read exactly as they are,
// a key held nowhere reads as its init_row (with its slot) and is not stored, and nothing in the
// table changes: no row created, no unseen-days counter reset, no row moved off the disk.
TEST(SparseTable, PeekReadsMemoryDiskAndUnknownKeysWithoutChangingTheTable) {
  AccessorConfig opt = testing::test_optimizer();
  opt.delete_threshold = 0.0f;
  ScratchDir dir;
  HostTableConfig cfg;
  cfg.shards = 3;
  cfg.rocksdb_path = dir.sub("rocksdb");
  cfg.cold_after_days = 2;
  auto table = testing::open_table(opt, cfg);
  const RowLayout layout = table->layout();
  const std::size_t stride = layout.stride();
  std::mt19937_64 rng(11);
  const auto push_keys = [&](uint64_t first, std::size_t n) {
    std::vector<uint64_t> keys(n);
    std::vector<float> rows;
    for (std::size_t i = 0; i < n; ++i) {
      keys[i] = first + i;
      const auto row = testing::random_row(rng, layout);
      rows.insert(rows.end(), row.begin(), row.end());
    }
    ASSERT_TRUE(table->push(keys.data(), n, rows.data()).ok());
  };
  push_keys(100, 40);  // unseen for two days, then cold: on disk
  ASSERT_TRUE(table->shrink().ok());
  ASSERT_TRUE(table->shrink().ok());
  push_keys(200, 40);  // unseen for a day, in memory
  ASSERT_TRUE(table->shrink().ok());
  const HostTierStats stats = table->stats().value();
  ASSERT_GT(stats.rows_on_disk, 0u);
  ASSERT_GT(stats.rows_in_memory, 0u);
  const RowMap held = testing::snapshot(*table);

  // Held keys from both tiers, unknown ones, a repeated unknown key, in a mixed order.
  std::vector<uint64_t> keys;
  std::vector<int32_t> slots;
  for (uint64_t k = 95; k < 245; k += 3) keys.push_back(k);
  keys.push_back(97);
  std::shuffle(keys.begin(), keys.end(), rng);
  for (std::size_t i = 0; i < keys.size(); ++i) slots.push_back(static_cast<int32_t>(i % 7));
  std::vector<float> rows(keys.size() * stride);
  std::size_t unknown = 0;
  ASSERT_TRUE(table->peek(keys.data(), slots.data(), keys.size(), rows.data(), &unknown).ok());
  std::size_t want_unknown = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const std::vector<float> got(rows.begin() + i * stride, rows.begin() + (i + 1) * stride);
    const auto it = held.find(keys[i]);
    std::vector<float> want(stride);
    if (it != held.end()) {
      want = it->second;
    } else {
      init_row(want.data(), layout, opt, keys[i], slots[i]);
      ++want_unknown;
    }
    EXPECT_TRUE(testing::same_bits(got, want)) << "key " << keys[i];
  }
  EXPECT_EQ(unknown, want_unknown);
  EXPECT_GT(unknown, 1u);
  EXPECT_TRUE(testing::same_rows(testing::snapshot(*table), held));
  const HostTierStats after = table->stats().value();
  EXPECT_EQ(after.rows_on_disk, stats.rows_on_disk);
  EXPECT_EQ(after.rows_in_memory, stats.rows_in_memory);
  // n = 0 reads nothing; null arguments are refused.
  unknown = 5;
  EXPECT_TRUE(table->peek(nullptr, nullptr, 0, nullptr, &unknown).ok());
  EXPECT_EQ(unknown, 0u);
  EXPECT_FALSE(table->peek(nullptr, nullptr, 1, rows.data(), nullptr).ok());
  // pull, by contrast, changes what peek left alone (the test can tell).
  ASSERT_TRUE(table->pull(keys.data(), slots.data(), keys.size(), rows.data(), nullptr).ok());
  EXPECT_FALSE(testing::same_rows(testing::snapshot(*table), held));
}

TEST(SparseTable, RejectsBadOptionsAndArguments) {
  const AccessorConfig opt = testing::test_optimizer();
  HostTableConfig cfg;
  cfg.memory_row_budget = 10;  // no disk tier
  EXPECT_FALSE(SparseTable::open(opt, cfg).ok());
  cfg = HostTableConfig{};
  cfg.cold_after_days = 2;
  EXPECT_FALSE(SparseTable::open(opt, cfg).ok());
  cfg = HostTableConfig{};
  cfg.shards = 0;
  EXPECT_FALSE(SparseTable::open(opt, cfg).ok());
  auto table = testing::open_table(opt, HostTableConfig{});
  EXPECT_EQ(table->pull(nullptr, nullptr, 3, nullptr, nullptr).code(),
            Status::Code::kInvalidArgument);
  EXPECT_TRUE(table->pull(nullptr, nullptr, 0, nullptr, nullptr).ok());
  EXPECT_TRUE(table->push(nullptr, 0, nullptr).ok());
  EXPECT_TRUE(table->erase(nullptr, 0).ok());
  EXPECT_EQ(table->erase(nullptr, 2).code(), Status::Code::kInvalidArgument);
}

TEST(SparseTable, ConcurrentCallersOnDisjointKeys) {
  HostTableConfig cfg;
  cfg.shards = 8;
  cfg.threads = 1;
  const AccessorConfig opt = testing::test_optimizer();
  auto table = testing::open_table(opt, cfg);
  const RowLayout layout = table->layout();
  constexpr int kThreads = 4;
  constexpr int kKeys = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::vector<uint64_t> keys(kKeys);
      std::vector<float> rows;
      for (int i = 0; i < kKeys; ++i) {
        keys[i] = static_cast<uint64_t>(t) * 1000000 + i;
        const auto row = testing::random_row(rng, layout);
        rows.insert(rows.end(), row.begin(), row.end());
      }
      ASSERT_TRUE(table->push(keys.data(), kKeys, rows.data()).ok());
      std::vector<float> back(rows.size());
      ASSERT_TRUE(table->pull(keys.data(), nullptr, kKeys, back.data(), nullptr).ok());
      EXPECT_TRUE(testing::same_bits(back, rows));
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(table->size().value(), static_cast<uint64_t>(kThreads * kKeys));
}

}  // namespace
}  // namespace gpubox::table
