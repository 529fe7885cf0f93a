// The host table with several width classes (hyper_parameters.slot_dims):
//  - write-through puts each row at its own width, as eviction does (no record padding on disk),
//    and the rows read back are the ones pushed (an unordered_map oracle);
//  - a key first seen in a push is created in its row's width class, not slot 0's and then
//    moved: the table holds what a pull-then-push of the same keys leaves (same rows, same memory).
#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

#include "table/host_memory_plan.hpp"
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

TEST(HostWidthClasses, WriteThroughPutsEachRowAtItsOwnWidth) {
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
  std::unordered_map<uint64_t, std::vector<float>> oracle;
  for (std::size_t i = 0; i < n; ++i) {
    const std::vector<float> rec = record_of_slot(rng, cfg, record, kNarrowSlot);
    pushed.insert(pushed.end(), rec.begin(), rec.end());
    oracle[keys[i]] = rec;
  }
  const SparseTable::DiskTraffic before = table->disk_traffic();
  ASSERT_TRUE(table->push(keys.data(), n, pushed.data()).ok());
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

}  // namespace
}  // namespace gpubox::table
