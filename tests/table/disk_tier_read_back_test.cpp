// The RocksDB disk tier under SparseTable, rows read back: a row read back keeps its disk copy,
// so evicting it unchanged writes and deletes nothing, a changed one is written on eviction and
// never served stale, and scans, saves, shrink and erase see each key once, at its newest value.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "table/disk_tier.hpp"
#include "table/io/save_dir.hpp"
#include "table/sparse_table.hpp"
#include "tests/table/table_test_util.hpp"

namespace gpubox::table {
namespace {

using testing::ScratchDir;

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
  records = 0;  // rows (the unseen-<shard> files hold one record per row too; delete-: none)
  for (const auto& file : delta->files) {
    if (file.name.rfind("unseen-", 0) != 0) records += file.records;
  }
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
