// SparseTable::push as a pass's write-back calls it (PassBoundary::push_rows: every row the pass
// pulled, each key once, in the cards' order, in batches) against a std::unordered_map oracle:
// after the write-back the table holds, bit for bit, the rows pushed (every field: show, click,
// embed_w, embedx, optimizer state, slot and widths; unseen days 0, though pushed as 2) and the
// rows the pass did not touch as they were; and exactly the pushed rows are marked changed (a
// delta save taken after the write-back, loaded into an empty table, holds the pushed keys with
// their pushed model fields and nothing else). Seeded passes of exactly 0, 1, n and n + 1
// distinct keys (n = the table's parallel threshold, 4096) and a larger one in batches of n + 1,
// a third of each pass's keys rows of earlier passes, spread evenly over the shards or skewed
// (the shards drawn by a Zipf law, one shard taking most keys), with no disk tier, with a row
// budget that evicts to the disk tier during the pass (pulls pin, pushes write through), with two
// width classes (pushed rows that change class), and with two width classes under a byte budget
// (rows written through, and rows read back from disk by the push, that change class).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "common/hash.hpp"
#include "table/host_memory_plan.hpp"
#include "tests/table/slot_dims_config.hpp"
#include "tests/table/table_test_util.hpp"

namespace gpubox::table {
namespace {

using testing::RowMap;
using testing::ScratchDir;
using Oracle = std::unordered_map<uint64_t, std::vector<float>>;

constexpr uint32_t kShards = 16;
constexpr std::size_t kParallelKeys = 4096;  // SparseTable's threshold for running shards at once
constexpr int32_t kNarrowSlot = 3;           // the mixed-width config's narrow slot (width 4)
constexpr float kPushedUnseenDays = 2.0f;    // what the rows carry; push makes it 0

enum class KeySpread { kEven, kZipfShards };
enum class Tier { kMemory, kDiskBudget, kMixedWidths, kMixedWidthsDiskBudget };

bool mixed_widths(Tier tier) {
  return tier == Tier::kMixedWidths || tier == Tier::kMixedWidthsDiskBudget;
}
bool disk_tier(Tier tier) {
  return tier == Tier::kDiskBudget || tier == Tier::kMixedWidthsDiskBudget;
}

AccessorConfig optimizer_for(Tier tier) {
  const AccessorConfig adam = testing::test_optimizer(SparseOptimizerKind::kAdam, 8);
  return mixed_widths(tier) ? with_slot_dims(adam, {{kNarrowSlot, 4}}) : adam;
}

HostTableConfig table_config(Tier tier, const ScratchDir& dir) {
  HostTableConfig cfg;
  cfg.shards = kShards;
  cfg.threads = 2;
  cfg.key_slots = 26;
  if (tier == Tier::kDiskBudget) {
    cfg.rocksdb_path = dir.sub("rocksdb");
    cfg.memory_row_budget = 2000;  // under one pass of n keys: pulls evict, pushes write through
  } else if (tier == Tier::kMixedWidthsDiskBudget) {
    cfg.rocksdb_path = dir.sub("rocksdb");
    cfg.memory_budget_bytes = 256 << 10;  // about 1200 rows: asserted under n below
  }
  return cfg;
}

// `n` keys not in `taken` (which gets them). kZipfShards: each key's shard is drawn first, shard
// s with weight 1 / (s + 1)^1.5 (shard 0 takes about 40% of the keys), then a key of that shard.
std::vector<uint64_t> new_keys(std::size_t n, KeySpread spread, std::mt19937_64& rng,
                               std::unordered_set<uint64_t>* taken) {
  std::vector<double> weights(kShards);
  for (uint32_t s = 0; s < kShards; ++s) weights[s] = 1.0 / std::pow(s + 1.0, 1.5);
  std::discrete_distribution<uint32_t> zipf(weights.begin(), weights.end());
  std::vector<uint64_t> keys;
  while (keys.size() < n) {
    uint64_t key = rng();
    if (spread == KeySpread::kZipfShards) {
      const uint32_t shard = zipf(rng);
      while (host_shard(key, kShards) != shard) key = rng();
    }
    if (taken->insert(key).second) keys.push_back(key);
  }
  return keys;
}

// A trained row of `slot` as a card writes it back: the row in its own layout (unseen days
// kPushedUnseenDays), then zeros up to the record's stride.
std::vector<float> trained_record(const AccessorConfig& cfg, int32_t slot, std::mt19937_64& rng) {
  const RowLayout own = RowLayout::for_slot(cfg, slot);
  std::vector<float> row = testing::random_row(rng, own);
  row[own.slot()] = static_cast<float>(slot);
  row[RowLayout::kUnseenDays] = kPushedUnseenDays;
  row.resize(record_layout(cfg).stride(), 0.0f);
  return row;
}

// Pushes `keys` (each once) in batches of `batch`, rows trained for their slot (key % 26); with
// two width classes a third of them (by key and `pass`) at the other class's width. The oracle
// takes each pushed row, unseen days 0.
void write_back(SparseTable& table, const AccessorConfig& opt, const std::vector<uint64_t>& keys,
                std::size_t batch, Tier tier, int pass, std::mt19937_64& rng, Oracle* oracle) {
  const std::size_t stride = table.layout().stride();
  std::vector<float> rows;
  for (uint64_t key : keys) {
    int32_t slot = static_cast<int32_t>(key % 26);
    if (mixed_widths(tier) && (key + pass) % 3 == 0) slot = slot == kNarrowSlot ? 0 : kNarrowSlot;
    std::vector<float> row = trained_record(opt, slot, rng);
    rows.insert(rows.end(), row.begin(), row.end());
    row[RowLayout::kUnseenDays] = 0.0f;
    (*oracle)[key] = row;
  }
  if (keys.empty()) {
    ASSERT_TRUE(table.push(keys.data(), 0, rows.data()).ok());
  }
  for (std::size_t b = 0; b < keys.size(); b += batch) {
    const std::size_t n = std::min(batch, keys.size() - b);
    ASSERT_TRUE(table.push(keys.data() + b, n, rows.data() + b * stride).ok());
  }
}

// Pulls `keys` (slots key % 26); the rows the oracle has come back as it holds them.
void pull_and_check(SparseTable& table, const std::vector<uint64_t>& keys, const Oracle& oracle) {
  const std::size_t stride = table.layout().stride();
  std::vector<int32_t> slots(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) slots[i] = static_cast<int32_t>(keys[i] % 26);
  std::vector<float> pulled(keys.size() * stride);
  ASSERT_TRUE(table.pull(keys.data(), slots.data(), keys.size(), pulled.data(), nullptr).ok());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto it = oracle.find(keys[i]);
    if (it == oracle.end()) continue;
    const std::vector<float> row(pulled.begin() + i * stride, pulled.begin() + (i + 1) * stride);
    ASSERT_TRUE(testing::same_bits(row, it->second)) << "pulled key " << keys[i];
  }
}

// A delta save at `path`, loaded into an empty table, holds exactly `keys` with the oracle's
// model fields.
void check_delta(SparseTable& table, const AccessorConfig& opt, const std::string& path,
                 const std::vector<uint64_t>& keys, const Oracle& oracle) {
  ASSERT_TRUE(table.save(path, SaveKind::kDelta).ok());
  HostTableConfig cfg;
  cfg.shards = kShards;
  auto loaded = testing::open_table(opt, cfg);
  const Status st = loaded->load(path);
  ASSERT_TRUE(st.ok()) << st.to_string();
  RowMap want;
  for (uint64_t key : keys) want[key] = oracle.at(key);
  const RowLayout layout = table.layout();
  EXPECT_TRUE(testing::same_rows(testing::model_of(testing::snapshot(*loaded), layout),
                                 testing::model_of(want, layout)));
}

// Pass keys: exactly `n` distinct keys, every third one a key the table already holds (drawn
// without replacement from `known`), the rest new; `known` gets the new ones.
std::vector<uint64_t> pass_keys(std::size_t n, KeySpread spread, std::mt19937_64& rng,
                                std::unordered_set<uint64_t>* taken, std::vector<uint64_t>* known) {
  std::vector<uint64_t> keys = new_keys(n, spread, rng, taken);
  std::vector<uint64_t> reused = *known;
  std::shuffle(reused.begin(), reused.end(), rng);
  EXPECT_GE(reused.size(), (n + 2) / 3);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i % 3 == 0 && i / 3 < reused.size()) {
      keys[i] = reused[i / 3];
    } else {
      known->push_back(keys[i]);
    }
  }
  return keys;
}

class WriteBackTest : public ::testing::TestWithParam<std::tuple<KeySpread, Tier>> {};

TEST_P(WriteBackTest, TableHoldsExactlyThePushedRows) {
  const auto [spread, tier] = GetParam();
  const AccessorConfig opt = optimizer_for(tier);
  ScratchDir dir;
  const HostTableConfig cfg = table_config(tier, dir);
  auto table = testing::open_table(opt, cfg);
  const uint64_t budget_rows =
      plan_host_memory(cfg, planned_classes(opt, cfg.key_slots)).rows_per_shard * kShards;
  if (disk_tier(tier)) {
    ASSERT_LT(budget_rows, kParallelKeys);
  }
  std::mt19937_64 rng(static_cast<uint64_t>(spread) * 31 + static_cast<uint64_t>(tier) + 5);
  Oracle oracle;
  std::unordered_set<uint64_t> taken;

  // Rows from before the passes (reused by the passes), then a base save, so that deltas hold
  // what each write-back changed.
  std::vector<uint64_t> known = new_keys(3000, spread, rng, &taken);
  ASSERT_NO_FATAL_FAILURE(
      write_back(*table, opt, known, known.size(), Tier::kMemory, 0, rng, &oracle));
  ASSERT_TRUE(table->save(dir.sub("base"), SaveKind::kBase).ok());

  struct Pass {
    std::size_t keys, batch;
  };
  const Pass passes[] = {{0, kParallelKeys},
                         {1, kParallelKeys},
                         {kParallelKeys, kParallelKeys},
                         {kParallelKeys + 1, kParallelKeys + 1},
                         {3 * kParallelKeys + 100, kParallelKeys + 1}};
  for (int p = 0; p < 5; ++p) {
    const Pass& pass = passes[p];
    SCOPED_TRACE("pass " + std::to_string(p) + " of " + std::to_string(pass.keys) + " keys");
    std::vector<uint64_t> keys = pass_keys(pass.keys, spread, rng, &taken, &known);
    std::vector<uint64_t> sorted = keys;
    std::sort(sorted.begin(), sorted.end());
    ASSERT_EQ(std::unique(sorted.begin(), sorted.end()) - sorted.begin(),
              static_cast<std::ptrdiff_t>(pass.keys));
    ASSERT_NO_FATAL_FAILURE(pull_and_check(*table, keys, oracle));
    // Everything the pull changed is saved: the next delta holds the write-back's rows only.
    ASSERT_TRUE(table->save(dir.sub("before" + std::to_string(p)), SaveKind::kDelta).ok());

    // The write-back: every pulled key once, in another order (the card's), in batches.
    std::shuffle(keys.begin(), keys.end(), rng);
    const SparseTable::DiskTraffic before = table->disk_traffic();
    ASSERT_NO_FATAL_FAILURE(write_back(*table, opt, keys, pass.batch, tier, p, rng, &oracle));
    const SparseTable::DiskTraffic after = table->disk_traffic();
    ASSERT_NO_FATAL_FAILURE(
        check_delta(*table, opt, dir.sub("after" + std::to_string(p)), keys, oracle));
    const RowMap want(oracle.begin(), oracle.end());
    ASSERT_TRUE(testing::same_rows(testing::snapshot(*table), want));
    auto stats = table->stats();
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->rows_in_memory + stats->rows_on_disk, oracle.size());
    if (disk_tier(tier) && pass.keys > budget_rows) {
      // Rows the pull evicted pinned: written through, or read back (and evicting others).
      EXPECT_GT(stats->rows_on_disk, 0u);
      EXPECT_GT(after.rows_written_through, before.rows_written_through);
      EXPECT_GT(after.rows_read_back, before.rows_read_back);
      EXPECT_GT(after.rows_evicted, before.rows_evicted);
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<WriteBackTest::ParamType>& info) {
  static const char* const kSpreads[] = {"Even", "ZipfShards"};
  static const char* const kTiers[] = {"Memory", "DiskBudget", "MixedWidths",
                                       "MixedWidthsDiskBudget"};
  return std::string(kSpreads[static_cast<int>(std::get<0>(info.param))]) +
         kTiers[static_cast<int>(std::get<1>(info.param))];
}

INSTANTIATE_TEST_SUITE_P(
    Spreads, WriteBackTest,
    ::testing::Combine(::testing::Values(KeySpread::kEven, KeySpread::kZipfShards),
                       ::testing::Values(Tier::kMemory, Tier::kDiskBudget, Tier::kMixedWidths,
                                         Tier::kMixedWidthsDiskBudget)),
    case_name);

}  // namespace
}  // namespace gpubox::table
