// Helpers shared by the table tests: a scratch folder, table construction, whole-table
// snapshots and seeded random rows.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "table/row_codec.hpp"
#include "table/sparse_table.hpp"

namespace gpubox::table::testing {

// A fresh folder under the test temp dir, removed with everything in it on destruction.
class ScratchDir {
 public:
  ScratchDir() {
    static std::atomic<int> counter{0};
    path_ = ::testing::TempDir() + "gpubox_table_" + std::to_string(::getpid()) + "_" +
            std::to_string(counter++);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline AccessorConfig test_optimizer(SparseOptimizerKind kind = SparseOptimizerKind::kAdagrad,
                                     int32_t mf_dim = 4,
                                     SparseStorage storage = SparseStorage::kFp32) {
  AccessorConfig cfg;
  cfg.optimizer.kind = kind;
  cfg.mf_dim = mf_dim;
  cfg.storage = storage;
  cfg.optimizer.initial_range = 0.01f;  // non-zero embed_w at creation, so init_row is visible
  cfg.show_click_decay_rate = 0.9f;
  cfg.delete_threshold = 0.2f;
  cfg.delete_after_unseen_days = 3.0f;
  cfg.seed = 7;
  return cfg;
}

inline std::unique_ptr<SparseTable> open_table(const AccessorConfig& opt,
                                               const HostTableConfig& cfg) {
  auto table = SparseTable::open(opt, cfg);
  EXPECT_TRUE(table.ok()) << table.status().to_string();
  return std::move(table).value();
}

using RowMap = std::map<uint64_t, std::vector<float>>;

// Every row of the table, memory and disk, as records (the row's own floats, then zeros).
inline RowMap snapshot(SparseTable& table) {
  RowMap rows;
  const RowLayout record = table.layout();
  Status st = table.for_each_row([&](uint64_t key, const float* row) {
    EXPECT_EQ(rows.count(key), 0u) << "key " << key << " seen twice (memory and disk?)";
    rows[key].resize(record.stride());
    row_into_record(row, record, rows[key].data());
  });
  EXPECT_TRUE(st.ok()) << st.to_string();
  return rows;
}

// The model record (base/delta fields) of every row.
inline RowMap model_of(const RowMap& rows, const RowLayout& layout) {
  RowMap out;
  std::vector<float> rec(record_floats(RecordKind::kModel, layout));
  for (const auto& [key, row] : rows) {
    row_to_record(RecordKind::kModel, layout, row.data(), rec.data());
    out[key] = rec;
  }
  return out;
}

// Bit-exact comparison (NaN-safe, -0.0 distinct from 0.0).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
inline ::testing::AssertionResult same_rows(const RowMap& a, const RowMap& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "row counts differ: " << a.size() << " vs " << b.size();
  }
  for (const auto& [key, row] : a) {
    auto it = b.find(key);
    if (it == b.end()) return ::testing::AssertionFailure() << "key " << key << " missing";
    if (!same_bits(row, it->second)) {
      return ::testing::AssertionFailure() << "key " << key << " differs";
    }
  }
  return ::testing::AssertionSuccess();
}

// A plausible trained row: counters, weights and optimizer state all random (16-bit weights
// rounded as the storage keeps them).
inline std::vector<float> random_row(std::mt19937_64& rng, const RowLayout& layout) {
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::uniform_real_distribution<float> count(0.0f, 20.0f);
  std::vector<float> row(layout.stride());
  for (auto& v : row) v = value(rng);
  row[RowLayout::kShow] = count(rng);
  row[RowLayout::kClick] = row[RowLayout::kShow] * 0.3f;
  row[RowLayout::kUnseenDays] = 0.0f;
  row[layout.slot()] = static_cast<float>(rng() % 26);
  row[layout.mf_dim_offset()] = static_cast<float>(layout.mf_dim);
  row[layout.mf_size()] = (rng() % 2) ? static_cast<float>(layout.mf_dim) : 0.0f;
  if (layout.packed()) {
    row[RowLayout::kEmbedW] = 0.0f;
    for (int32_t i = 0; i < layout.embedx_w_slots(); ++i) row[layout.embedx_w() + i] = 0.0f;
    write_embed_w(row.data(), layout, value(rng));
    for (int32_t i = 0; i < layout.mf_dim; ++i) write_embedx_w(row.data(), layout, i, value(rng));
  }
  return row;
}

}  // namespace gpubox::table::testing
