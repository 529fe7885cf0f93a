// SparseTable::push as a pass's write-back calls it (PassBoundary::push_rows: every row the pass
// pulled, each key once, in the cards' order, in batches) against a std::unordered_map oracle:
// after the write-back the table holds, bit for bit, the rows pushed (every field: show, click,
// embed_w, embedx, optimizer state, slot and widths; unseen days 0) and the rows the pass did
// not touch as they were; and exactly the pushed rows are marked changed (a delta save taken
// after the write-back holds them and nothing else). Seeded key sets of 0, 1, n and n + 1 keys
// (n = the table's parallel threshold, 4096) and a larger one in batches of n + 1, spread evenly
// over the shards or skewed (the shards drawn by a Zipf law, one shard taking most keys), with
// no disk tier, with a memory budget that evicts to the disk tier during the pass (pulls pin,
// pushes write through), and with two width classes (pushed rows that change class).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "common/hash.hpp"
#include "table/io/save_dir.hpp"
#include "tests/table/slot_dims_config.hpp"
#include "tests/table/table_test_util.hpp"

namespace gpubox::table {
namespace {

using testing::RowMap;
using testing::ScratchDir;

constexpr uint32_t kShards = 16;
constexpr std::size_t kParallelKeys = 4096;  // SparseTable's threshold for running shards at once
constexpr int32_t kNarrowSlot = 3;           // the mixed-width config's narrow slot (width 4)

enum class KeySpread { kEven, kZipfShards };
enum class Tier { kMemory, kDiskBudget, kMixedWidths };

// `n` distinct keys. kZipfShards: each key's shard is drawn first, shard s with weight
// 1 / (s + 1)^1.5 (shard 0 takes about 40% of the keys), then a key of that shard.
std::vector<uint64_t> distinct_keys(std::size_t n, KeySpread spread, std::mt19937_64& rng) {
  std::vector<double> weights(kShards);
  for (uint32_t s = 0; s < kShards; ++s) weights[s] = 1.0 / std::pow(s + 1.0, 1.5);
  std::discrete_distribution<uint32_t> zipf(weights.begin(), weights.end());
  std::unordered_set<uint64_t> seen;
  std::vector<uint64_t> keys;
  while (keys.size() < n) {
    uint64_t key = rng();
    if (spread == KeySpread::kZipfShards) {
      const uint32_t shard = zipf(rng);
      while (host_shard(key, kShards) != shard) key = rng();
    }
    if (seen.insert(key).second) keys.push_back(key);
  }
  return keys;
}

// A trained row of `slot` as a card writes it back: the row in its own layout, then zeros up to
// the record's stride.
std::vector<float> trained_record(const AccessorConfig& cfg, int32_t slot, std::mt19937_64& rng) {
  const RowLayout own = RowLayout::for_slot(cfg, slot);
  std::vector<float> row = testing::random_row(rng, own);
  row[own.slot()] = static_cast<float>(slot);
  row.resize(record_layout(cfg).stride(), 0.0f);
  return row;
}

uint64_t delta_records(SparseTable& table, const std::string& path) {
  EXPECT_TRUE(table.save(path, SaveKind::kDelta).ok());
  auto manifest = io::read_manifest(io::FileEnv::posix(), path, "sparse");
  EXPECT_TRUE(manifest.ok()) << manifest.status().to_string();
  uint64_t records = 0;
  for (const auto& file : manifest->files) {
    if (file.name.rfind("part-", 0) == 0) records += file.records;
  }
  return records;
}

class WriteBackTest : public ::testing::TestWithParam<std::tuple<KeySpread, Tier>> {};

TEST_P(WriteBackTest, TableHoldsExactlyThePushedRows) {
  const auto [spread, tier] = GetParam();
  const AccessorConfig opt =
      tier == Tier::kMixedWidths
          ? with_slot_dims(testing::test_optimizer(SparseOptimizerKind::kAdam, 8),
                           {{kNarrowSlot, 4}})
          : testing::test_optimizer(SparseOptimizerKind::kAdam, 8);
  ScratchDir dir;
  HostTableConfig cfg;
  cfg.shards = kShards;
  cfg.threads = 2;
  if (tier == Tier::kDiskBudget) {
    cfg.rocksdb_path = dir.sub("rocksdb");
    cfg.memory_row_budget = 2000;  // under one pass of n keys: pulls evict, pushes write through
  }
  auto table = testing::open_table(opt, cfg);
  const std::size_t stride = table->layout().stride();
  std::mt19937_64 rng(static_cast<uint64_t>(spread) * 31 + static_cast<uint64_t>(tier) + 5);
  std::unordered_map<uint64_t, std::vector<float>> oracle;

  // Rows from before the passes (some of them reused by the passes), then a base save, so that
  // deltas count what each write-back changed.
  const std::vector<uint64_t> earlier = distinct_keys(3000, spread, rng);
  {
    std::vector<float> rows;
    for (uint64_t key : earlier) {
      oracle[key] = trained_record(opt, static_cast<int32_t>(key % 26), rng);
      oracle[key][RowLayout::kUnseenDays] = 0.0f;
      rows.insert(rows.end(), oracle[key].begin(), oracle[key].end());
    }
    ASSERT_TRUE(table->push(earlier.data(), earlier.size(), rows.data()).ok());
  }
  ASSERT_TRUE(table->save(dir.sub("base"), SaveKind::kBase).ok());

  struct Pass {
    std::size_t keys, batch;
  };
  const Pass passes[] = {{0, kParallelKeys},
                         {1, kParallelKeys},
                         {kParallelKeys, kParallelKeys},
                         {kParallelKeys + 1, kParallelKeys + 1},
                         {3 * kParallelKeys + 100, kParallelKeys + 1}};
  int p = 0;
  for (const Pass& pass : passes) {
    SCOPED_TRACE("pass " + std::to_string(p) + " of " + std::to_string(pass.keys) + " keys");
    // A third of the pass's keys from the earlier rows (read back from disk when evicted), the
    // rest new (created by the pull).
    std::vector<uint64_t> keys = distinct_keys(pass.keys, spread, rng);
    for (std::size_t i = 0; i < keys.size(); i += 3) keys[i] = earlier[rng() % earlier.size()];
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    std::vector<int32_t> slots(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) slots[i] = static_cast<int32_t>(keys[i] % 26);
    std::vector<float> pulled(keys.size() * stride);
    ASSERT_TRUE(table->pull(keys.data(), slots.data(), keys.size(), pulled.data(), nullptr).ok());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const std::vector<float> row(pulled.begin() + i * stride, pulled.begin() + (i + 1) * stride);
      if (oracle.count(keys[i]) > 0) {
        ASSERT_TRUE(testing::same_bits(row, oracle[keys[i]])) << "pulled key " << keys[i];
      }
    }
    // Everything the pull changed is saved: the next delta holds the write-back's rows only.
    delta_records(*table, dir.sub("before" + std::to_string(p)));

    // The write-back: every pulled key once, in another order (the card's), in batches. With
    // two width classes every third row comes back at the other class's width.
    std::shuffle(keys.begin(), keys.end(), rng);
    std::vector<float> rows;
    for (uint64_t key : keys) {
      int32_t slot = static_cast<int32_t>(key % 26);
      if (tier == Tier::kMixedWidths && key % 3 == 0) slot = slot == kNarrowSlot ? 0 : kNarrowSlot;
      std::vector<float> row = trained_record(opt, slot, rng);
      rows.insert(rows.end(), row.begin(), row.end());
      row[RowLayout::kUnseenDays] = 0.0f;
      oracle[key] = row;
    }
    if (keys.empty()) {
      ASSERT_TRUE(table->push(keys.data(), 0, rows.data()).ok());
    }
    for (std::size_t b = 0; b < keys.size(); b += pass.batch) {
      const std::size_t n = std::min(pass.batch, keys.size() - b);
      ASSERT_TRUE(table->push(keys.data() + b, n, rows.data() + b * stride).ok());
    }
    EXPECT_EQ(delta_records(*table, dir.sub("after" + std::to_string(p))), keys.size());
    const RowMap want(oracle.begin(), oracle.end());
    ASSERT_TRUE(testing::same_rows(testing::snapshot(*table), want));
    auto stats = table->stats();
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->rows_in_memory + stats->rows_on_disk, oracle.size());
    if (tier == Tier::kDiskBudget && pass.keys > cfg.memory_row_budget) {
      EXPECT_GT(stats->rows_on_disk, 0u);
    }
    ++p;
  }
  if (tier == Tier::kDiskBudget) {
    const SparseTable::DiskTraffic traffic = table->disk_traffic();
    EXPECT_GT(traffic.rows_evicted, 0u);
    EXPECT_GT(traffic.rows_written_through, 0u);
  }
}

std::string case_name(const ::testing::TestParamInfo<WriteBackTest::ParamType>& info) {
  static const char* const kSpreads[] = {"Even", "ZipfShards"};
  static const char* const kTiers[] = {"Memory", "DiskBudget", "MixedWidths"};
  return std::string(kSpreads[static_cast<int>(std::get<0>(info.param))]) +
         kTiers[static_cast<int>(std::get<1>(info.param))];
}

INSTANTIATE_TEST_SUITE_P(
    Spreads, WriteBackTest,
    ::testing::Combine(::testing::Values(KeySpread::kEven, KeySpread::kZipfShards),
                       ::testing::Values(Tier::kMemory, Tier::kDiskBudget, Tier::kMixedWidths)),
    case_name);

}  // namespace
}  // namespace gpubox::table
