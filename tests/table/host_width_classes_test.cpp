// The host table with several width classes (hyper_parameters.slot_dims):
//  - write-through puts each row at its own width, as eviction does (no record padding on disk),
//    and the rows read back are the ones pushed (an unordered_map oracle);
//  - a key first seen in a push is created in its row's width class, not slot 0's and then
//    moved: the table holds what a pull-then-push of the same keys leaves (same rows, same memory);
//  - the memory plan assumes one share of the rows a key slot, counts each class at its own
//    stride, and the byte budget holds whatever the real mix (the rows' bytes are limited too).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "table/host_memory_plan.hpp"
#include "table/sparse_shard.hpp"
#include "tests/table/forwarding_host_tier.hpp"
#include "tests/table/slot_dims_config.hpp"
#include "tests/table/table_test_util.hpp"

namespace gpubox::table {
namespace {

using testing::ScratchDir;

constexpr int32_t kNarrowSlot = 1;  // width 4; every other slot has the config's mf_dim, 16

AccessorConfig two_widths() {
  return with_slot_dims(testing::test_optimizer(SparseOptimizerKind::kAdagrad, 16),
                        {{kNarrowSlot, 4}});
}

// A random row of `slot`'s width in a record of `record`'s stride (zeros after the row).
std::vector<float> record_of_slot(std::mt19937_64& rng, const AccessorConfig& cfg,
                                  const RowLayout& record, int32_t slot) {
  const RowLayout own = RowLayout::for_slot(cfg, slot);
  std::vector<float> row = testing::random_row(rng, own);
  row[own.slot()] = static_cast<float>(slot);
  row.resize(record.stride(), 0.0f);
  return row;
}

// Pushed packed (push) or by address (push_at, each row alone at its own stride: the cpu pass
// write-back's), so that the write-through copy and the memory limit's look at each pushed row's
// width (SparseShard::incoming) read it where it lies: a read past its own stride or at a wrong
// address shows in the rows read back or in the disk's put bytes.
class WriteThroughPushes : public ::testing::TestWithParam<bool> {};

TEST_P(WriteThroughPushes, WriteThroughPutsEachRowAtItsOwnWidth) {
  const bool by_address = GetParam();
  ScratchDir dir;
  const AccessorConfig cfg = two_widths();
  HostTableConfig config;
  config.shards = 2;
  config.rocksdb_path = dir.sub("rocksdb");
  config.memory_row_budget = 64;
  auto table = testing::open_table(cfg, config);
  const RowLayout record = table->layout();
  const int32_t narrow_stride = RowLayout::for_slot(cfg, kNarrowSlot).stride();
  ASSERT_LT(narrow_stride, record.stride());
  // A pass of 300 narrow keys pulled at once: pinned rows go to disk and are remembered.
  constexpr std::size_t n = 300;
  std::vector<uint64_t> keys(n);
  std::vector<int32_t> slots(n, kNarrowSlot);
  for (std::size_t i = 0; i < n; ++i) keys[i] = 1000 + 7 * i;
  std::vector<float> pulled(n * record.stride());
  ASSERT_TRUE(table->pull(keys.data(), slots.data(), n, pulled.data(), nullptr).ok());
  // The pass writes them back changed.
  std::mt19937_64 rng(41);
  std::vector<float> pushed;
  std::vector<std::vector<float>> own_rows(n);  // by address: each row alone, at its own stride
  std::vector<const float*> addresses(n);
  std::unordered_map<uint64_t, std::vector<float>> oracle;
  for (std::size_t i = 0; i < n; ++i) {
    const std::vector<float> rec = record_of_slot(rng, cfg, record, kNarrowSlot);
    pushed.insert(pushed.end(), rec.begin(), rec.end());
    oracle[keys[i]] = rec;
    own_rows[i].assign(rec.begin(), rec.begin() + narrow_stride);
    addresses[i] = own_rows[i].data();
  }
  const SparseTable::DiskTraffic before = table->disk_traffic();
  ASSERT_TRUE((by_address ? table->push_at(keys.data(), n, addresses.data())
                          : table->push(keys.data(), n, pushed.data()))
                  .ok());
  const SparseTable::DiskTraffic after = table->disk_traffic();
  const uint64_t through = after.rows_written_through - before.rows_written_through;
  EXPECT_GT(through, 0u);
  // Every row in the table is narrow: every put, written through or evicted, is 12 key bytes, 4
  // epoch bytes and the narrow row's floats.
  const uint64_t puts = after.disk.puts - before.disk.puts;
  EXPECT_GE(puts, through);
  EXPECT_EQ(after.disk.put_bytes - before.disk.put_bytes,
            puts * (12 + 4 + sizeof(float) * narrow_stride));
  // Read back as pushed.
  std::vector<float> got(n * record.stride());
  ASSERT_TRUE(table->pull(keys.data(), slots.data(), n, got.data(), nullptr).ok());
  EXPECT_TRUE(testing::same_bits(got, pushed));
  const testing::RowMap rows = testing::snapshot(*table);
  ASSERT_EQ(rows.size(), n);
  for (const auto& [key, row] : rows) EXPECT_TRUE(testing::same_bits(row, oracle.at(key))) << key;
}

INSTANTIATE_TEST_SUITE_P(HostWidthClasses, WriteThroughPushes, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "PushAt" : "Push");
                         });

TEST(HostWidthClasses, AKeyFirstSeenInAPushIsCreatedAtItsRowsWidth) {
  const AccessorConfig cfg = two_widths();
  HostTableConfig config;
  config.shards = 1;
  auto pushed_only = testing::open_table(cfg, config);
  auto pulled_first = testing::open_table(cfg, config);
  const RowLayout record = pushed_only->layout();
  std::mt19937_64 rng(43);
  // Sizes 0, 1, a chunk and past it.
  for (const std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{1024}, std::size_t{1500}}) {
    SCOPED_TRACE(n);
    std::vector<uint64_t> keys(n);
    std::vector<int32_t> slots(n, kNarrowSlot);
    std::vector<float> rows;
    for (std::size_t i = 0; i < n; ++i) {
      keys[i] = (uint64_t{n} << 32) + i;
      const std::vector<float> rec = record_of_slot(rng, cfg, record, kNarrowSlot);
      rows.insert(rows.end(), rec.begin(), rec.end());
    }
    std::vector<float> scratch(n * record.stride());
    ASSERT_TRUE(pulled_first->pull(keys.data(), slots.data(), n, scratch.data(), nullptr).ok());
    ASSERT_TRUE(pulled_first->push(keys.data(), n, rows.data()).ok());
    ASSERT_TRUE(pushed_only->push(keys.data(), n, rows.data()).ok());
    EXPECT_TRUE(
        testing::same_rows(testing::snapshot(*pushed_only), testing::snapshot(*pulled_first)));
    // No wide row was made for them: the memory is the same, byte for byte.
    EXPECT_EQ(pushed_only->stats()->memory_bytes, pulled_first->stats()->memory_bytes);
  }
}

TEST(HostWidthClasses, ThePlanAssumesOneShareASlot) {
  const AccessorConfig cfg =
      with_slot_dims(testing::test_optimizer(SparseOptimizerKind::kAdagrad, 16),
                     {{1, 4}, {2, 4}, {3, 8}, {40, 4}});
  const auto stride = [&](int32_t dim) {
    return RowLayout::make(cfg.optimizer.kind, dim).stride();
  };
  // 26 key slots: 1 and 2 at width 4 (40 is no key slot), 3 at 8, the other 23 at 16.
  std::vector<PlannedClass> classes = planned_classes(cfg, 26);
  ASSERT_EQ(classes.size(), 3u);
  EXPECT_EQ(classes[0].mf_dim, 4);
  EXPECT_EQ(classes[0].stride, stride(4));
  EXPECT_DOUBLE_EQ(classes[0].share, 2.0 / 26);
  EXPECT_DOUBLE_EQ(classes[1].share, 1.0 / 26);
  EXPECT_EQ(classes[2].mf_dim, 16);
  EXPECT_DOUBLE_EQ(classes[2].share, 23.0 / 26);
  // Unknown: all at the widest.
  classes = planned_classes(cfg, 0);
  EXPECT_EQ(classes[0].share, 0.0);
  EXPECT_EQ(classes[1].share, 0.0);
  EXPECT_EQ(classes[2].share, 1.0);
  // One slot, listed: all at its width.
  classes = planned_classes(cfg, 1);
  EXPECT_EQ(classes[0].share, 1.0);
  EXPECT_EQ(classes[2].share, 0.0);
}

// A push that fails on a row of no width class leaves the write-through set as it was: keys
// checked before the bad row are still written through by the next push.
TEST(HostWidthClasses, APushWithABadWidthLeavesTheWriteThroughSetAsItWas) {
  ScratchDir dir;
  const AccessorConfig cfg = two_widths();
  HostTableConfig config;
  config.shards = 1;
  config.rocksdb_path = dir.sub("rocksdb");
  config.memory_row_budget = 16;  // pieces of 2 keys
  const RowLayout record = record_layout(cfg);
  const HostMemoryPlan plan = plan_host_memory(config, planned_classes(cfg, 0));
  ASSERT_GE(plan.write_through_keys_per_shard, 2u);
  auto disk = DiskTier::open(config.rocksdb_path, record.stride(), plan.disk_memory_bytes);
  ASSERT_TRUE(disk.ok()) << disk.status().to_string();
  TableEpochs epochs;
  SparseShard shard(0, record, cfg, disk->get(), plan, &epochs);
  std::mt19937_64 rng(44);
  const auto records = [&](std::size_t n, float first_show) {
    std::vector<float> rows;
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<float> rec = record_of_slot(rng, cfg, record, kNarrowSlot);
      rec[RowLayout::kShow] = first_show + static_cast<float>(i);
      rec[RowLayout::kClick] = 0.0f;
      rows.insert(rows.end(), rec.begin(), rec.end());
    }
    return rows;
  };
  const std::vector<uint32_t> pos = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  std::vector<uint64_t> keys(16);
  for (uint64_t k = 0; k < 16; ++k) keys[k] = k;
  std::vector<int32_t> slots(16, kNarrowSlot);
  std::vector<float> scratch(16 * record.stride());
  // Keys 0..15 (show 1..16) pushed, then pulled (pinned): the budget, full.
  ASSERT_TRUE(shard.push(keys.data(), pos.data(), 16, records(16, 1.0f).data()).ok());
  ASSERT_TRUE(shard.pull(keys.data(), slots.data(), pos.data(), 16, scratch.data(), nullptr).ok());
  // Two new keys: eviction sends the two coldest, keys 0 and 1, to disk and the set.
  const uint64_t fresh[2] = {100, 101};
  ASSERT_TRUE(shard.pull(fresh, slots.data(), pos.data(), 2, scratch.data(), nullptr).ok());
  ASSERT_EQ(shard.stats().rows_evicted, 2u);
  // Keys 0 and 1 pushed, 1's row of width 7 (no class): an error, nothing changed.
  std::vector<float> pushed = records(2, 1.0f);
  pushed[record.stride() + record.mf_dim_offset()] = 7.0f;
  EXPECT_FALSE(shard.push(keys.data(), pos.data(), 2, pushed.data()).ok());
  EXPECT_EQ(shard.stats().rows_written_through, 0u);
  // Pushed right: both written through.
  pushed = records(2, 1.0f);
  ASSERT_TRUE(shard.push(keys.data(), pos.data(), 2, pushed.data()).ok());
  EXPECT_EQ(shard.stats().rows_written_through, 2u);
  EXPECT_EQ(shard.stats().rows_read_back, 0u);
}

// Slot ids listed twice, or outside 1..key_slots, count once or not at all: the shares stay
// within 0..1 and add up to 1.
TEST(HostWidthClasses, ThePlanCountsEachKeySlotOnce) {
  const AccessorConfig cfg =
      with_slot_dims(testing::test_optimizer(SparseOptimizerKind::kAdagrad, 16),
                     {{1, 4}, {1, 8}, {2, 4}, {0, 8}, {9, 8}});
  for (const uint32_t key_slots : {1u, 2u, 4u}) {
    SCOPED_TRACE(key_slots);
    const std::vector<PlannedClass> classes = planned_classes(cfg, key_slots);
    ASSERT_EQ(classes.size(), 3u);
    double total = 0;
    for (const PlannedClass& c : classes) {
      EXPECT_GE(c.share, 0.0);
      EXPECT_LE(c.share, 1.0);
      total += c.share;
    }
    EXPECT_DOUBLE_EQ(total, 1.0);
    // Slot 1 at its first width (4), as rows are made; slot 2 at 4 when it is a key slot.
    EXPECT_DOUBLE_EQ(classes[0].share, std::min(2.0, double(key_slots)) / key_slots);
    EXPECT_EQ(classes[1].share, 0.0);
    EXPECT_DOUBLE_EQ(classes[2].share, key_slots > 2 ? (key_slots - 2.0) / key_slots : 0.0);
  }
}

TEST(HostWidthClasses, ThePlanCountsEachClassAtItsStrideWithinTheBudget) {
  const AccessorConfig cfg = with_slot_dims(
      testing::test_optimizer(SparseOptimizerKind::kAdagrad, 16), {{1, 4}, {2, 4}, {3, 4}});
  const int32_t widest = record_layout(cfg).stride();
  for (const uint64_t kib : {64, 1024, 65536}) {
    for (const uint32_t shards : {1u, 7u}) {
      SCOPED_TRACE(::testing::Message() << kib << " KiB, " << shards << " shards");
      HostTableConfig config;
      config.shards = shards;
      config.memory_budget_bytes = kib << 10;
      const HostMemoryPlan at_widest = plan_host_memory(config, widest);
      const HostMemoryPlan mixed = plan_host_memory(config, planned_classes(cfg, 4));
      // Three slots of four are narrow: more rows fit than at the widest stride.
      EXPECT_GT(mixed.rows_per_shard, at_widest.rows_per_shard);
      EXPECT_LT(mixed.row_bytes, at_widest.row_bytes);
      EXPECT_LT(mixed.memory_bytes_per_key(), at_widest.memory_bytes_per_key());
      // What a shard may hold, rows at their limit in bytes and the index reserved, stays within
      // its part of the budget (less RocksDB's and the write-through set's).
      const uint64_t shard_bytes =
          (config.memory_budget_bytes - mixed.disk_memory_bytes - mixed.write_through_bytes()) /
          shards;
      EXPECT_LE(mixed.row_bytes_per_shard + mixed.index_slots * KeyIndexMap::kSlotBytes,
                shard_bytes);
      // The index holds the planned rows and a piece more below its growth fill.
      EXPECT_LE(static_cast<double>(mixed.rows_per_shard) * 9 / 8,
                static_cast<double>(mixed.index_slots) * KeyIndexMap::kMaxLoad);
      EXPECT_NE(mixed.to_string().find("75.0% of width 4, 25.0% of width 16"), std::string::npos)
          << mixed.to_string();
    }
  }
}

// Rows of one width only, pushed through a table planned for a 3:1 mix of narrow and wide: all
// wide, the byte limit binds and memory stays within the budget; all narrow, the row count binds
// at more rows than a plan at the widest stride keeps. Both agree with an unordered_map oracle.
// A push that moves rows to a wider class counts the rows it makes against the byte limit, as
// new rows are: a piece of narrow rows in a full memory, pushed back wide, makes room first
// (before, a push of rows all in memory evicted nothing and went over by up to a piece).
TEST(HostWidthClasses, APushWideningRowsMakesRoomForThem) {
  ScratchDir dir;
  const AccessorConfig cfg = two_widths();
  HostTableConfig config;
  config.shards = 1;
  config.key_slots = 1;  // planned all narrow: the row bytes bind before the row count
  config.rocksdb_path = dir.sub("rocksdb");
  config.memory_budget_bytes = 1 << 20;
  const RowLayout record = record_layout(cfg);
  const HostMemoryPlan plan = plan_host_memory(config, planned_classes(cfg, config.key_slots));
  auto disk = DiskTier::open(config.rocksdb_path, record.stride(), plan.disk_memory_bytes);
  ASSERT_TRUE(disk.ok()) << disk.status().to_string();
  TableEpochs epochs;
  SparseShard shard(0, record, cfg, disk->get(), plan, &epochs);
  // Rows, epochs, the maps as reserved; storage grows by whole chunks, one a class at most
  // beyond what the limit counts.
  const uint64_t bound = plan.row_bytes_per_shard +
                         (plan.index_slots + plan.write_through_slots) * KeyIndexMap::kSlotBytes +
                         plan.classes.size() * plan.rows_per_chunk * plan.widest_row_bytes;
  // A bulk call's piece (SparseShard::piece_keys).
  const std::size_t piece = std::min<std::size_t>(
      plan.rows_per_shard / 8, plan.row_bytes_per_shard / 8 / plan.widest_row_bytes);
  ASSERT_GT(piece, 1u);
  // Wide keys, twice what the row bytes hold, pushed (the memory is full of them), then one
  // piece of narrow keys pulled: memory stays within the limit counting them at the widest.
  const std::size_t n = 2 * plan.row_bytes_per_shard / plan.widest_row_bytes;
  std::vector<uint64_t> keys(n + piece);
  std::vector<uint32_t> pos(n + piece);
  for (std::size_t i = 0; i < n + piece; ++i) {
    keys[i] = 7 * i + 1;
    pos[i] = static_cast<uint32_t>(i);
  }
  std::mt19937_64 rng(45);
  const auto wide_records = [&](std::size_t count) {
    std::vector<float> rows;
    for (std::size_t i = 0; i < count; ++i) {
      const std::vector<float> rec = record_of_slot(rng, cfg, record, 2);
      rows.insert(rows.end(), rec.begin(), rec.end());
    }
    return rows;
  };
  ASSERT_TRUE(shard.push(keys.data(), pos.data(), n, wide_records(n).data()).ok());
  const std::vector<int32_t> slots(piece, kNarrowSlot);
  std::vector<float> scratch(piece * record.stride());
  ASSERT_TRUE(
      shard.pull(keys.data() + n, slots.data(), pos.data(), piece, scratch.data(), nullptr).ok());
  EXPECT_LE(shard.stats().memory_bytes, bound);
  // The narrow piece (pinned) pushed back at the default width: a piece of wide rows more, for
  // which the wide rows (unpinned) make room.
  const std::vector<float> rows = wide_records(piece);
  const ShardStats before = shard.stats();
  ASSERT_TRUE(shard.push(keys.data() + n, pos.data(), piece, rows.data()).ok());
  const ShardStats after = shard.stats();
  EXPECT_EQ(after.rows_written_through, 0u);
  EXPECT_EQ(after.rows_read_back, 0u);
  EXPECT_GT(after.rows_evicted, before.rows_evicted);
  EXPECT_LE(after.memory_bytes, bound);
}

TEST(HostWidthClasses, TheByteBudgetHoldsWhateverTheMix) {
  const AccessorConfig cfg = with_slot_dims(
      testing::test_optimizer(SparseOptimizerKind::kAdagrad, 16), {{1, 4}, {2, 4}, {3, 4}});
  // Rows of the wide slot 0, of the narrow slot 1, or of one then the other (each phase fills
  // the memory: the first phase's storage must go back as its rows leave).
  for (const std::pair<int32_t, int32_t>& phases :
       {std::pair{0, 0}, std::pair{1, 1}, std::pair{1, 0}, std::pair{0, 1}}) {
    SCOPED_TRACE(::testing::Message()
                 << "rows of slot " << phases.first << ", then of slot " << phases.second);
    ScratchDir dir;
    HostTableConfig config;
    config.shards = 2;
    config.threads = 1;
    config.key_slots = 4;
    config.rocksdb_path = dir.sub("rocksdb");
    config.memory_budget_bytes = 1 << 20;
    auto table = testing::open_table(cfg, config);
    const RowLayout record = table->layout();
    const HostMemoryPlan plan = plan_host_memory(config, planned_classes(cfg, config.key_slots));
    const HostMemoryPlan at_widest = plan_host_memory(config, record.stride());
    std::mt19937_64 rng(59 + phases.first + 2 * phases.second);
    std::unordered_map<uint64_t, std::vector<float>> oracle;
    constexpr std::size_t kBatch = 1000;
    std::vector<uint64_t> keys(kBatch);
    std::vector<float> rows;
    uint64_t peak_memory = 0;
    for (int batch = 0; batch < 30; ++batch) {
      rows.clear();
      const int32_t slot = batch < 15 ? phases.first : phases.second;
      for (std::size_t i = 0; i < kBatch; ++i) {
        keys[i] = rng();
        const std::vector<float> rec = record_of_slot(rng, cfg, record, slot);
        rows.insert(rows.end(), rec.begin(), rec.end());
        oracle[keys[i]] = rec;
      }
      ASSERT_TRUE(table->push(keys.data(), kBatch, rows.data()).ok());
      const HostTierStats stats = table->stats().value();
      EXPECT_LE(stats.rows_in_memory, plan.rows());
      peak_memory = std::max(peak_memory, stats.memory_bytes);
    }
    // Rows, epochs, the index and the write-through set as allocated; storage grows by whole
    // chunks of a class, one a class and shard at most unused.
    const uint64_t chunk_slack =
        config.shards * plan.classes.size() * plan.rows_per_chunk * plan.widest_row_bytes;
    EXPECT_LE(peak_memory, config.memory_budget_bytes - plan.disk_memory_bytes + chunk_slack);
    const HostTierStats stats = table->stats().value();
    if (phases.second == 1) {
      EXPECT_GT(stats.rows_in_memory, at_widest.rows());
    }
    EXPECT_EQ(stats.rows_in_memory + stats.rows_on_disk, oracle.size());
    const testing::RowMap got = testing::snapshot(*table);
    ASSERT_EQ(got.size(), oracle.size());
    for (const auto& [key, row] : got) {
      ASSERT_TRUE(testing::same_bits(row, oracle.at(key))) << key;
    }
  }
}

// HostTier::push_at (issue 32: the cpu pass write-back pushes the cards' rows where they lie, each
// in its own width's pool, by address): the in-process table's push_at leaves the table as a
// push of the same rows packed into records does, bit for bit, against an unordered_map oracle.
// Rows of both widths, each in an allocation of exactly its own stride (a read past it would read
// the next row's floats, not the record's zeros), at 0, 1, n = kParallelKeys' 4096 (the shards in
// parallel) and n + 1 rows, each size over new keys and then over the same keys again (existing
// rows overwritten, some changing width). A tier that takes no rows by address (HostTier's
// default: a remote one, a wrapper) says so and refuses push_at, its table untouched.
TEST(HostWidthClasses, PushAtLeavesWhatAPackedPushLeaves) {
  const AccessorConfig cfg = two_widths();
  HostTableConfig config;
  config.shards = 3;
  auto packed = testing::open_table(cfg, config);
  auto in_place = testing::open_table(cfg, config);
  auto wrapped_table = testing::open_table(cfg, config);
  testing::ForwardingHostTier wrapper(*wrapped_table);  // push_at: HostTier's, refusing
  EXPECT_TRUE(in_place->pushes_by_address());
  EXPECT_FALSE(wrapper.pushes_by_address());
  const RowLayout record = packed->layout();
  std::unordered_map<uint64_t, std::vector<float>> oracle;
  std::mt19937_64 rng(47);
  for (const std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{4096}, std::size_t{4097}}) {
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE(std::to_string(n) + " rows, round " + std::to_string(round));
      std::vector<uint64_t> keys(n);
      std::vector<float> records;
      std::vector<std::vector<float>> own_rows(n);  // each row alone, at its own stride
      std::vector<const float*> addresses(n);
      for (std::size_t i = 0; i < n; ++i) {
        keys[i] = (uint64_t{n} << 32) + i;
        const int32_t slot = (i + static_cast<std::size_t>(round)) % 3 == 0 ? kNarrowSlot : 2;
        const std::vector<float> rec = record_of_slot(rng, cfg, record, slot);
        records.insert(records.end(), rec.begin(), rec.end());
        oracle[keys[i]] = rec;
        own_rows[i].assign(rec.begin(), rec.begin() + RowLayout::for_slot(cfg, slot).stride());
        addresses[i] = own_rows[i].data();
      }
      ASSERT_TRUE(packed->push(keys.data(), n, records.data()).ok());
      ASSERT_TRUE(in_place->push_at(keys.data(), n, addresses.data()).ok());
      for (SparseTable* table : {packed.get(), in_place.get()}) {
        const testing::RowMap rows = testing::snapshot(*table);
        ASSERT_EQ(rows.size(), oracle.size());
        for (const auto& [key, row] : rows) {
          ASSERT_TRUE(oracle.count(key)) << key;
          ASSERT_TRUE(testing::same_bits(row, oracle.at(key))) << key;
        }
      }
      EXPECT_EQ(in_place->stats()->memory_bytes, packed->stats()->memory_bytes);
      if (n > 0) {
        const Status refused = wrapper.push_at(keys.data(), n, addresses.data());
        EXPECT_EQ(refused.code(), Status::Code::kInvalidArgument) << refused.to_string();
        EXPECT_EQ(wrapped_table->stats()->rows_in_memory, 0u);
      }
    }
  }
}

}  // namespace
}  // namespace gpubox::table
