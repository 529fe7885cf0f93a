// The host table under a memory budget (runner.host_memory_mb / host_memory_row_budget):
//  - plan_host_memory: the planned rows and their index fit the byte budget, the smaller of two
//    budgets wins, and tiny budgets keep one row a shard;
//  - eviction to the disk tier and reload agree with a std::map oracle, bit for bit, over seeded
//    random pulls, pushes and erases, for tables of 0, 1, budget, budget + 1 and many rows;
//  - the memory the table measures (stats().memory_bytes) stays within a byte budget;
//  - rows pulled for a pass in flight are evicted last (pinned until pushed), so a pass's write
//    back reads nothing from disk while two passes' working sets fit the budget, and the table
//    still agrees with the oracle when they do not (working sets of 0, 1, budget, budget + 1);
//  - write-through: a push of a pinned row that eviction sent to disk writes over its disk copy
//    without reading it; passes in flight over the budget give the same rows with and without it
//    (an unordered_map oracle), read fewer rows back with it, and the memory the table measures
//    (its remembered keys included) stays within the plan;
//  - under a byte budget, a shard's key index and write-through set are reserved at the plan's
//    sizes when it opens and again when a load clears it, and never grow; a row budget alone
//    reserves neither.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <unordered_map>

#include "common/memory_limit.hpp"
#include "table/host_memory_plan.hpp"
#include "table/key_index_map.hpp"
#include "table/sparse_shard.hpp"
#include "tests/table/table_test_util.hpp"

namespace gpubox::table {
namespace {

using testing::ScratchDir;

TEST(HostMemoryPlan, PlannedRowsAndIndexFitTheByteBudget) {
  for (const int32_t stride : {5, 17, 43}) {
    for (const uint64_t mib : {1, 3, 64, 1024}) {
      for (const uint32_t shards : {1u, 7u, 64u}) {
        HostTableConfig config;
        config.shards = shards;
        config.memory_budget_bytes = mib << 20;
        const HostMemoryPlan plan = plan_host_memory(config, stride);
        SCOPED_TRACE(::testing::Message()
                     << "stride " << stride << ", " << mib << " MiB, " << shards << " shards");
        ASSERT_GT(plan.rows_per_shard, 0u);
        const double shard_bytes =
            static_cast<double>(plan.rows_per_shard) * plan.memory_bytes_per_key();
        EXPECT_LE(shard_bytes, static_cast<double>(config.memory_budget_bytes / shards));
        // Not wastefully small: at least 2/3 of the budget goes to rows and index.
        EXPECT_GE(shard_bytes * 1.5, static_cast<double>(config.memory_budget_bytes / shards));
        // The index is planned below its growth fill with 1/8 headroom.
        const double slots = plan.index_bytes_per_key * static_cast<double>(plan.rows_per_shard) /
                             KeyIndexMap::kSlotBytes;
        EXPECT_LE(static_cast<double>(plan.rows_per_shard) * 9 / 8,
                  slots * KeyIndexMap::kMaxLoad + 1e-9);
        // Storage chunks: a power of two, about an eighth of a shard's rows or fewer.
        EXPECT_EQ(plan.rows_per_chunk & (plan.rows_per_chunk - 1), 0u);
        EXPECT_GE(plan.rows_per_chunk, 16u);
        EXPECT_LE(plan.rows_per_chunk, std::max<uint64_t>(16, plan.rows_per_shard / 8));
        EXPECT_EQ(plan.row_bytes, sizeof(float) * stride);
        EXPECT_EQ(plan.disk_bytes_per_key, 16 + sizeof(float) * stride);
      }
    }
  }
}

TEST(HostMemoryPlan, TheSmallerBudgetWinsAndTinyBudgetsKeepOneRowAShard) {
  HostTableConfig config;
  config.shards = 4;
  EXPECT_EQ(plan_host_memory(config, 10).rows_per_shard, 0u);  // no budget
  config.memory_row_budget = 100;
  EXPECT_EQ(plan_host_memory(config, 10).rows_per_shard, 25u);
  config.memory_budget_bytes = 1 << 20;  // far more than 25 rows a shard
  EXPECT_EQ(plan_host_memory(config, 10).rows_per_shard, 25u);
  config.memory_row_budget = 1u << 30;  // now the bytes are the smaller budget
  const uint64_t by_bytes = plan_host_memory(config, 10).rows_per_shard;
  EXPECT_GT(by_bytes, 25u);
  EXPECT_LT(by_bytes, (1u << 20) / 4 / 40);
  config.memory_row_budget = 0;
  EXPECT_EQ(plan_host_memory(config, 10).rows_per_shard, by_bytes);
  config.memory_budget_bytes = 1;  // below one row: still one a shard
  EXPECT_EQ(plan_host_memory(config, 10).rows_per_shard, 1u);
  config.memory_budget_bytes = 0;
  config.memory_row_budget = 3;  // fewer rows than shards
  EXPECT_EQ(plan_host_memory(config, 10).rows_per_shard, 1u);
}

// smallest_memory_budget: at it the plan's memory (RocksDB's share, the write-through sets, and
// each shard's index and row bytes, one widest row at least) stays within the budget, for one
// class or three, 1 to 1024 shards, with and without write-through; at half of it the plan keeps
// one row and a 16-slot index a shard past the budget (what the card tier's host budget check
// guards against).
TEST(HostMemoryPlan, TheSmallestBudgetIsOneThePlanKeepsWithin) {
  const std::vector<std::vector<PlannedClass>> class_sets = {
      {{4, 5, 1.0}}, {{4, 9, 0.5}, {8, 13, 0.25}, {64, 69, 0.25}}};
  for (const auto& classes : class_sets) {
    for (const uint32_t shards : {1u, 64u, 1024u}) {
      for (const bool write_through : {false, true}) {
        SCOPED_TRACE(::testing::Message() << classes.size() << " classes, " << shards
                                          << " shards, write-through " << write_through);
        HostTableConfig config;
        config.shards = shards;
        config.write_through = write_through;
        const uint64_t least = smallest_memory_budget(config, classes);
        const auto planned_bytes = [&](uint64_t budget) {
          config.memory_budget_bytes = budget;
          const HostMemoryPlan plan = plan_host_memory(config, classes);
          EXPECT_GE(plan.rows_per_shard, 1u);
          EXPECT_GE(plan.row_bytes_per_shard, plan.widest_row_bytes);
          return plan.disk_memory_bytes + plan.write_through_bytes() +
                 shards * (plan.index_slots * KeyIndexMap::kSlotBytes + plan.row_bytes_per_shard);
        };
        EXPECT_LE(planned_bytes(least), least);
        EXPECT_GT(planned_bytes(least / 2), least / 2);
      }
    }
  }
}

TEST(HostMemoryPlan, AByteBudgetNeedsTheDiskTier) {
  HostTableConfig config;
  config.memory_budget_bytes = 1 << 20;
  auto table = SparseTable::open(testing::test_optimizer(), config);
  ASSERT_FALSE(table.ok());
  EXPECT_NE(table.status().message().find("host_memory_mb"), std::string::npos)
      << table.status().to_string();
}

// One thread, `shards` shards, the disk tier under `dir`; no budget yet.
HostTableConfig disk_tier_config(const ScratchDir& dir, uint32_t shards) {
  HostTableConfig cfg;
  cfg.shards = shards;
  cfg.threads = 1;
  cfg.rocksdb_path = dir.sub("rocksdb");
  return cfg;
}

// A budget past the machine's memory (its index is reserved from it at open: 200000 MiB climbed
// toward the OOM killer with nothing said) is refused, naming the key and the machine's memory.
TEST(HostMemoryPlan, ABudgetPastTheMachinesMemoryIsRefused) {
  const UsableMemory usable = usable_memory();
  if (usable.bytes == 0) GTEST_SKIP() << "the machine's memory is unknown";
  ScratchDir dir;
  HostTableConfig config = disk_tier_config(dir, 2);
  config.memory_budget_bytes = usable.bytes + (uint64_t{1} << 20);
  auto table = SparseTable::open(testing::test_optimizer(), config);
  ASSERT_FALSE(table.ok());
  EXPECT_NE(table.status().message().find("runner.host_memory_mb"), std::string::npos)
      << table.status().to_string();
  EXPECT_NE(table.status().message().find("MiB of " + usable.source), std::string::npos)
      << table.status().to_string();
}

// A row budget under the shard count is raised to a row a shard: said at open, with the rows
// the table keeps (it was 1 asked, 64 kept, unsaid).
TEST(HostMemoryPlan, ARowBudgetUnderTheShardsIsRaisedAndSaid) {
  ScratchDir dir;
  HostTableConfig config = disk_tier_config(dir, 4);
  config.memory_row_budget = 1;
  ::testing::internal::CaptureStderr();
  auto table = SparseTable::open(testing::test_optimizer(), config);
  std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(table.ok()) << table.status().to_string();
  EXPECT_NE(err.find("a host row budget of 1 (runner.host_memory_row_budget, gpubox_server "
                     "--memory_row_budget) is under the table's 4 shards"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("4 rows in all"), std::string::npos) << err;
  table->reset();

  config.memory_row_budget = 4;  // a row a shard: nothing to say
  ::testing::internal::CaptureStderr();
  table = SparseTable::open(testing::test_optimizer(), config);
  err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(table.ok()) << table.status().to_string();
  EXPECT_EQ(err.find("host row budget"), std::string::npos) << err;
}

// (rows pushed before the random steps, shards, write-through)
class BudgetOracle : public ::testing::TestWithParam<std::tuple<std::size_t, uint32_t, bool>> {};

constexpr uint64_t kBudget = 64;  // rows in memory, the whole table

TEST_P(BudgetOracle, EvictionAndReloadAgreeWithAMapOracle) {
  const auto [initial, shards, write_through] = GetParam();
  ScratchDir dir;
  const AccessorConfig opt = testing::test_optimizer(SparseOptimizerKind::kAdam, 4);
  HostTableConfig cfg = disk_tier_config(dir, shards);
  cfg.memory_row_budget = kBudget;
  cfg.write_through = write_through;
  auto table = testing::open_table(opt, cfg);
  const RowLayout layout = table->layout();
  const std::size_t stride = layout.stride();
  const uint64_t limit = plan_host_memory(cfg, layout.stride()).rows();
  ASSERT_EQ(limit, kBudget / shards * shards);
  std::mt19937_64 rng(1000 + initial * 7 + shards);
  testing::RowMap oracle;
  // Keys from a small range, so that steps hit rows in memory, on disk and not yet created.
  const uint64_t key_range = std::max<uint64_t>(8, 3 * (initial + kBudget));
  const auto check = [&](const std::string& step) {
    auto stats = table->stats();
    ASSERT_TRUE(stats.ok());
    EXPECT_LE(stats->rows_in_memory, limit) << step;
    EXPECT_EQ(stats->rows_in_memory + stats->rows_on_disk, oracle.size()) << step;
  };

  std::vector<uint64_t> keys(initial);
  std::vector<float> rows;
  for (std::size_t i = 0; i < initial; ++i) {
    keys[i] = i * 3 + 1;  // distinct
    const auto row = testing::random_row(rng, layout);
    rows.insert(rows.end(), row.begin(), row.end());
    oracle[keys[i]] = row;
  }
  ASSERT_TRUE(table->push(keys.data(), initial, rows.data()).ok());
  check("initial push");
  if (initial > limit) {
    EXPECT_GT(table->stats()->rows_on_disk, 0u);
  }
  EXPECT_TRUE(testing::same_rows(testing::snapshot(*table), oracle));

  for (int step = 0; step < 60; ++step) {
    const std::size_t n = rng() % (2 * kBudget + 3);  // 0 .. over the budget, repeats allowed
    std::vector<uint64_t> batch(n);
    for (auto& k : batch) k = rng() % key_range;
    const int op = static_cast<int>(rng() % 3);
    const std::string what = "step " + std::to_string(step) + " op " + std::to_string(op);
    if (op == 0) {  // pull: existing rows come back as they were, missing ones are created
      std::vector<float> got(n * stride);
      std::size_t created = 0;
      ASSERT_TRUE(table->pull(batch.data(), nullptr, n, got.data(), &created).ok()) << what;
      std::set<uint64_t> fresh;
      for (std::size_t i = 0; i < n; ++i) {
        const std::vector<float> row(got.begin() + i * stride, got.begin() + (i + 1) * stride);
        auto it = oracle.find(batch[i]);
        if (it == oracle.end()) {
          fresh.insert(batch[i]);
          oracle[batch[i]] = row;
        } else {
          it->second[RowLayout::kUnseenDays] = 0.0f;  // a pull marks the row seen
          EXPECT_TRUE(testing::same_bits(row, it->second)) << what << " key " << batch[i];
        }
      }
      EXPECT_EQ(created, fresh.size()) << what;
    } else if (op == 1) {  // push: the last row of a repeated key wins
      std::vector<float> pushed;
      for (std::size_t i = 0; i < n; ++i) {
        auto row = testing::random_row(rng, layout);
        pushed.insert(pushed.end(), row.begin(), row.end());
        oracle[batch[i]] = row;
      }
      ASSERT_TRUE(table->push(batch.data(), n, pushed.data()).ok()) << what;
    } else {
      ASSERT_TRUE(table->erase(batch.data(), n).ok()) << what;
      for (uint64_t k : batch) oracle.erase(k);
    }
    check(what);
  }
  EXPECT_TRUE(testing::same_rows(testing::snapshot(*table), oracle));
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, BudgetOracle,
    ::testing::Combine(::testing::Values(std::size_t{0}, std::size_t{1}, std::size_t{kBudget},
                                         std::size_t{kBudget + 1}, std::size_t{5 * kBudget + 3}),
                       ::testing::Values(1u, 4u), ::testing::Bool()));

TEST(HostMemoryBudget, MeasuredMemoryStaysWithinAByteBudget) {
  ScratchDir dir;
  const AccessorConfig opt = testing::test_optimizer(SparseOptimizerKind::kAdagrad, 8);
  HostTableConfig cfg = disk_tier_config(dir, 2);
  cfg.memory_budget_bytes = 2 << 20;
  auto table = testing::open_table(opt, cfg);
  const RowLayout layout = table->layout();
  const HostMemoryPlan plan = plan_host_memory(cfg, layout.stride());
  std::mt19937_64 rng(31);
  constexpr std::size_t kBatch = 2048;
  constexpr std::size_t kRows = 30 * kBatch;  // several times what fits
  ASSERT_LT(plan.rows() * 2, kRows);
  std::vector<float> rows(kBatch * layout.stride());
  std::vector<uint64_t> keys(kBatch);
  for (std::size_t begin = 0; begin < kRows; begin += kBatch) {
    for (std::size_t i = 0; i < kBatch; ++i) {
      keys[i] = rng();
      const auto row = testing::random_row(rng, layout);
      std::copy(row.begin(), row.end(), rows.begin() + i * layout.stride());
    }
    const Status pushed = table->push(keys.data(), kBatch, rows.data());
    ASSERT_TRUE(pushed.ok()) << pushed.to_string();
    auto stats = table->stats();
    ASSERT_TRUE(stats.ok());
    EXPECT_LE(stats->rows_in_memory, plan.rows());
    // Rows, epochs, index and free list as allocated; storage grows by whole chunks.
    const uint64_t chunk_slack =
        cfg.shards * plan.rows_per_chunk * (plan.row_bytes + plan.metadata_bytes);
    EXPECT_LE(stats->memory_bytes, cfg.memory_budget_bytes + chunk_slack) << "after " << begin;
  }
  auto stats = table->stats();
  EXPECT_EQ(stats->rows_in_memory + stats->rows_on_disk, kRows);
  EXPECT_GE(stats->rows_in_memory, plan.rows() * 7 / 8 - cfg.shards);
}

// The key index and the write-through set are sized once, for the plan, when a shard opens: no
// growth (which briefly holds 1.5 times the new size) happens later, however many rows pass.
TEST(HostMemoryBudget, TheShardsMapsAreReservedAtOpenAndNeverGrow) {
  ScratchDir dir;
  const AccessorConfig opt = testing::test_optimizer(SparseOptimizerKind::kAdagrad, 8);
  HostTableConfig cfg = disk_tier_config(dir, 1);
  cfg.memory_budget_bytes = 256 << 10;
  const RowLayout layout = record_layout(opt);
  const HostMemoryPlan plan = plan_host_memory(cfg, layout.stride());
  ASSERT_GT(plan.index_slots, 16u);
  ASSERT_GT(plan.write_through_slots, 16u);
  auto disk = DiskTier::open(cfg.rocksdb_path, layout.stride(), plan.disk_memory_bytes);
  ASSERT_TRUE(disk.ok()) << disk.status().to_string();
  TableEpochs epochs;
  SparseShard shard(0, layout, opt, disk->get(), plan, &epochs);
  const auto expect_planned = [&](const char* when) {
    const ShardStats stats = shard.stats();
    EXPECT_EQ(stats.index_slots, plan.index_slots) << when;
    EXPECT_EQ(stats.write_through_slots, plan.write_through_slots) << when;
    EXPECT_LE(stats.rows_in_memory, plan.rows_per_shard) << when;
  };
  expect_planned("at open");
  // Passes of 3x the row budget: pulled (pinned; eviction fills the write-through set), pushed.
  std::mt19937_64 rng(57);
  const std::size_t n = plan.rows_per_shard * 3;
  std::vector<uint64_t> keys(n);
  std::vector<uint32_t> pos(n);
  std::vector<float> rows(n * layout.stride());
  for (int pass = 0; pass < 3; ++pass) {
    for (std::size_t i = 0; i < n; ++i) {
      keys[i] = rng() % (4 * n);
      pos[i] = static_cast<uint32_t>(i);
    }
    ASSERT_TRUE(shard.pull(keys.data(), nullptr, pos.data(), n, rows.data(), nullptr).ok());
    expect_planned("after a pull");
    ASSERT_TRUE(shard.push(keys.data(), pos.data(), n, rows.data()).ok());
    expect_planned("after a push");
  }
  EXPECT_GT(shard.stats().rows_written_through, 0u);
  // A load starts with clear(): the maps stay at their planned sizes, and the load (3x the
  // budget, so it evicts) does not grow them.
  ASSERT_TRUE(shard.clear().ok());
  expect_planned("after clear");
  ASSERT_EQ(record_floats(RecordKind::kFullRow, layout), layout.stride());
  ASSERT_TRUE(shard.load_records(RecordKind::kFullRow, keys.data(), rows.data(), nullptr, n).ok());
  expect_planned("after a load");
}

// A row budget alone is a cap, not memory to take: the shard reserves neither map at open (the
// index grows with its rows), however large the budget.
TEST(HostMemoryBudget, ARowBudgetAloneReservesNothing) {
  ScratchDir dir;
  const AccessorConfig opt = testing::test_optimizer(SparseOptimizerKind::kAdagrad, 8);
  HostTableConfig cfg = disk_tier_config(dir, 1);
  cfg.memory_row_budget = 1 << 20;
  const RowLayout layout = record_layout(opt);
  const HostMemoryPlan plan = plan_host_memory(cfg, layout.stride());
  ASSERT_GT(plan.index_slots, 1u << 20);
  ASSERT_GT(plan.write_through_keys_per_shard, 0u);
  EXPECT_EQ(plan.to_string().find("reserved"), std::string::npos) << plan.to_string();
  auto disk = DiskTier::open(cfg.rocksdb_path, layout.stride(), plan.disk_memory_bytes);
  ASSERT_TRUE(disk.ok()) << disk.status().to_string();
  TableEpochs epochs;
  SparseShard shard(0, layout, opt, disk->get(), plan, &epochs);
  const KeyIndexMap empty;
  EXPECT_EQ(shard.stats().index_slots, empty.capacity());
  EXPECT_EQ(shard.stats().write_through_slots, empty.capacity());
  EXPECT_LT(shard.stats().memory_bytes, std::size_t{1} << 20);
}

// Working-set keys per pass: two passes in flight (one trained, the next staged by the pipeline).
class PinnedWorkingSet : public ::testing::TestWithParam<std::size_t> {};

TEST_P(PinnedWorkingSet, RowsOfAPassInFlightAreEvictedLast) {
  const std::size_t w = GetParam();
  ScratchDir dir;
  const AccessorConfig opt = testing::test_optimizer(SparseOptimizerKind::kAdagrad, 4);
  HostTableConfig cfg = disk_tier_config(dir, 1);
  cfg.memory_row_budget = kBudget;
  auto table = testing::open_table(opt, cfg);
  const RowLayout layout = table->layout();
  const std::size_t stride = layout.stride();
  std::mt19937_64 rng(77 + w);
  testing::RowMap oracle;

  // A full memory of hot rows: by score alone they outrank every new row (score 0).
  std::vector<uint64_t> hot(kBudget);
  std::vector<float> rows;
  for (std::size_t i = 0; i < hot.size(); ++i) {
    hot[i] = 1000000 + i;
    auto row = testing::random_row(rng, layout);
    row[RowLayout::kShow] = 1000.0f;
    row[RowLayout::kClick] = 300.0f;
    rows.insert(rows.end(), row.begin(), row.end());
    oracle[hot[i]] = row;
  }
  ASSERT_TRUE(table->push(hot.data(), hot.size(), rows.data()).ok());
  ASSERT_EQ(table->stats()->rows_on_disk, 0u);

  const auto pull_new = [&](uint64_t first_key) {
    std::vector<uint64_t> keys(w);
    for (std::size_t i = 0; i < w; ++i) keys[i] = first_key + i;
    std::vector<float> got(w * stride);
    std::size_t created = 0;
    EXPECT_TRUE(table->pull(keys.data(), nullptr, w, got.data(), &created).ok());
    EXPECT_EQ(created, w);
    for (std::size_t i = 0; i < w; ++i) {
      oracle[keys[i]].assign(got.begin() + i * stride, got.begin() + (i + 1) * stride);
    }
    return keys;
  };
  const auto push_trained = [&](const std::vector<uint64_t>& keys) {
    std::vector<float> trained;
    for (uint64_t k : keys) {
      const auto row = testing::random_row(rng, layout);
      trained.insert(trained.end(), row.begin(), row.end());
      oracle[k] = row;
    }
    EXPECT_TRUE(table->push(keys.data(), keys.size(), trained.data()).ok());
  };

  const std::vector<uint64_t> pass_a = pull_new(1);       // pass k: on the cards
  const std::vector<uint64_t> pass_b = pull_new(100000);  // pass k + 1: staged ahead
  const SparseTable::DiskTraffic before = table->disk_traffic();
  push_trained(pass_a);  // end_pass of k
  const uint64_t read_back = table->disk_traffic().rows_read_back - before.rows_read_back;
  const uint64_t evicted = table->disk_traffic().rows_evicted - before.rows_evicted;
  push_trained(pass_b);  // end_pass of k + 1

  // Eviction frees 1/8 of the budget ahead of each 1/8-budget piece: pinned rows stay in memory
  // while both working sets and one piece fit in 7/8 of it.
  if (2 * w + kBudget / 8 <= kBudget * 7 / 8) {
    EXPECT_EQ(read_back, 0u) << "rows of the pass in flight went to disk";
    // Every pushed row was in memory: the push brought none in, so it made no room either.
    EXPECT_EQ(evicted, 0u);
  } else {
    EXPECT_LE(read_back, w);
  }
  auto stats = table->stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_LE(stats->rows_in_memory, kBudget);
  EXPECT_EQ(stats->rows_in_memory + stats->rows_on_disk, oracle.size());
  EXPECT_TRUE(testing::same_rows(testing::snapshot(*table), oracle));
}

// Passes in flight over a byte budget, as the trainer runs them with runner.prefetch_passes 1:
// pull pass p + 1 (staged), then push pass p's trained rows whole (end_pass). Each pass draws its
// keys from a range four times what memory holds, so it meets rows in memory, rows on disk and
// new keys. Returns the table's rows (memory and disk) and fills *traffic and *peak_bytes.
struct PassRun {
  std::unordered_map<uint64_t, std::vector<float>> rows;
  SparseTable::DiskTraffic traffic;
  uint64_t peak_bytes = 0;  // stats().memory_bytes after each call, the largest
  HostMemoryPlan plan;
};

// `memory_rows`: the rows memory holds with write-through (the plan without it holds a few more:
// the same draws either way).
PassRun run_passes(bool write_through, uint64_t memory_rows, std::size_t pass_keys_per_mille,
                   int passes, std::unordered_map<uint64_t, std::vector<float>>* oracle) {
  ScratchDir dir;
  const AccessorConfig opt = testing::test_optimizer(SparseOptimizerKind::kAdagrad, 8);
  HostTableConfig cfg = disk_tier_config(dir, 4);
  cfg.memory_budget_bytes = 1 << 20;
  cfg.write_through = write_through;
  auto table = testing::open_table(opt, cfg);
  const RowLayout layout = table->layout();
  const std::size_t stride = layout.stride();
  PassRun run;
  run.plan = plan_host_memory(cfg, layout.stride());
  const std::size_t w = memory_rows * pass_keys_per_mille / 1000;
  std::mt19937_64 rng(4242 + pass_keys_per_mille);  // the same draws with and without
  std::vector<std::vector<uint64_t>> keys(passes);
  for (auto& pass : keys) {
    pass.resize(w);
    for (auto& k : pass) k = rng() % (4 * memory_rows) + 1;
  }
  const auto note_memory = [&] {
    auto stats = table->stats();
    ASSERT_TRUE(stats.ok());
    run.peak_bytes = std::max<uint64_t>(run.peak_bytes, stats->memory_bytes);
  };
  std::vector<std::vector<float>> pulled(passes);
  const auto pull = [&](int p) {
    pulled[p].resize(keys[p].size() * stride);
    ASSERT_TRUE(
        table->pull(keys[p].data(), nullptr, keys[p].size(), pulled[p].data(), nullptr).ok());
    for (std::size_t i = 0; i < keys[p].size(); ++i) {
      const std::vector<float> row(pulled[p].begin() + i * stride,
                                   pulled[p].begin() + (i + 1) * stride);
      auto it = oracle->find(keys[p][i]);
      if (it == oracle->end()) {
        (*oracle)[keys[p][i]] = row;  // created by this pull
      } else {
        it->second[RowLayout::kUnseenDays] = 0.0f;
        EXPECT_TRUE(testing::same_bits(row, it->second)) << "pass " << p << " key " << keys[p][i];
      }
    }
    note_memory();
  };
  const auto push = [&](int p) {
    // Trained: a deterministic change of every row (the same with and without write-through),
    // the last of a repeated key winning as in the table.
    std::vector<float> trained = pulled[p];
    for (std::size_t i = 0; i < keys[p].size(); ++i) {
      trained[i * stride + RowLayout::kShow] += 1.0f;
      trained[i * stride + stride - 1] += static_cast<float>(p + 1);
      (*oracle)[keys[p][i]].assign(trained.begin() + i * stride,
                                   trained.begin() + (i + 1) * stride);
    }
    ASSERT_TRUE(table->push(keys[p].data(), keys[p].size(), trained.data()).ok());
    note_memory();
  };
  pull(0);
  for (int p = 0; p < passes; ++p) {
    if (p + 1 < passes) pull(p + 1);
    push(p);
  }
  run.traffic = table->disk_traffic();
  EXPECT_TRUE(table
                  ->for_each_row([&](uint64_t key, const float* row) {
                    run.rows[key].assign(row, row + stride);
                  })
                  .ok());
  return run;
}

// Keys a pass draws, in thousandths of the rows memory holds: one pass alone fits; at 500 two
// fit as well (with unpinned rows to evict first, so nothing is written through: the set only
// costs its memory), above that they do not.
class WriteThrough : public ::testing::TestWithParam<std::size_t> {};

TEST_P(WriteThrough, PassesInFlightGiveTheSameRowsWithFewerReads) {
  const std::size_t per_mille = GetParam();
  std::unordered_map<uint64_t, std::vector<float>> oracle_off, oracle_on;
  HostTableConfig cfg;
  cfg.shards = 4;
  cfg.memory_budget_bytes = 1 << 20;
  const uint64_t memory_rows =
      plan_host_memory(cfg, RowLayout::make(SparseOptimizerKind::kAdagrad, 8).stride()).rows();
  const PassRun off = run_passes(false, memory_rows, per_mille, 5, &oracle_off);
  const PassRun on = run_passes(true, memory_rows, per_mille, 5, &oracle_on);
  ASSERT_EQ(oracle_off.size(), oracle_on.size());
  for (const PassRun* run : {&off, &on}) {
    const auto& oracle = run == &off ? oracle_off : oracle_on;
    ASSERT_EQ(run->rows.size(), oracle.size());
    for (const auto& [key, row] : oracle) {
      auto it = run->rows.find(key);
      ASSERT_NE(it, run->rows.end()) << "key " << key;
      EXPECT_TRUE(testing::same_bits(it->second, row)) << "key " << key;
    }
  }
  EXPECT_EQ(off.traffic.rows_written_through, 0u);
  EXPECT_EQ(off.plan.write_through_keys_per_shard, 0u);
  ASSERT_GT(on.plan.write_through_keys_per_shard, 0u);
  if (per_mille >= 700) {
    // Two passes in flight exceed memory: pinned rows go to disk, and their push skips the read.
    EXPECT_GT(on.traffic.rows_written_through, 0u);
    EXPECT_LT(on.traffic.rows_read_back, off.traffic.rows_read_back);
  }
  // The rows, the index and the remembered keys within the budget less RocksDB's part, but for
  // the storage chunk a shard may have started.
  const HostMemoryPlan& plan = on.plan;
  const uint64_t chunk_slack =
      plan.shards * plan.rows_per_chunk * (plan.row_bytes + plan.metadata_bytes);
  EXPECT_LE(on.peak_bytes, (uint64_t{1} << 20) - plan.disk_memory_bytes + chunk_slack);
  EXPECT_LE(plan.write_through_bytes() + plan.disk_memory_bytes +
                plan.rows() * plan.memory_bytes_per_key(),
            static_cast<double>(uint64_t{1} << 20));
}

INSTANTIATE_TEST_SUITE_P(PassSizes, WriteThrough,
                         ::testing::Values(std::size_t{500}, std::size_t{700}, std::size_t{900}));

INSTANTIATE_TEST_SUITE_P(Sizes, PinnedWorkingSet,
                         ::testing::Values(std::size_t{0}, std::size_t{1}, std::size_t{24},
                                           std::size_t{kBudget}, std::size_t{kBudget + 1}));

}  // namespace
}  // namespace gpubox::table
