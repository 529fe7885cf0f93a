// The loopback server tests' oracle: what a client's pulls must return (the rows it pushed last,
// or init_row for a key never pushed), and a seeded random pull/push/erase run checked against it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

#include "table/server/remote_host_tier.hpp"
#include "table/sparse_row/accessor.hpp"

namespace gpubox::table::server::testing {

// Expected rows of one client's keys: what was pushed last, or init_row for a new key.
class Oracle {
 public:
  explicit Oracle(const AccessorConfig& cfg)
      : cfg_(cfg), layout_(RowLayout::make(cfg.optimizer.kind, cfg.mf_dim, cfg.storage)) {}
  const RowLayout& layout() const { return layout_; }
  std::size_t stride() const { return layout_.stride(); }

  // The rows a pull returns; records created rows. Returns how many are new.
  std::size_t pull(const std::vector<uint64_t>& keys, const std::vector<int32_t>& slots,
                   std::vector<float>* rows) {
    rows->assign(keys.size() * stride(), 0.0f);
    std::size_t created = 0;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      auto it = rows_.find(keys[i]);
      if (it == rows_.end()) {
        std::vector<float> row(stride());
        init_row(row.data(), layout_, cfg_, keys[i], slots.empty() ? 0 : slots[i]);
        it = rows_.emplace(keys[i], std::move(row)).first;
        ++created;
      }
      std::copy(it->second.begin(), it->second.end(), rows->begin() + i * stride());
    }
    return created;
  }
  void push(const std::vector<uint64_t>& keys, const std::vector<float>& rows) {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      rows_[keys[i]].assign(rows.begin() + i * stride(), rows.begin() + (i + 1) * stride());
    }
  }
  void erase(const std::vector<uint64_t>& keys) {
    for (uint64_t k : keys) rows_.erase(k);
  }
  const std::unordered_map<uint64_t, std::vector<float>>& rows() const { return rows_; }

 private:
  AccessorConfig cfg_;
  RowLayout layout_;
  std::unordered_map<uint64_t, std::vector<float>> rows_;
};

// Seeded random pull/push/erase through `client` on keys [base, base + range), checked against
// the oracle. Batch sizes hit 0, 1, the chunk size, one past it and several chunks.
inline void random_ops(RemoteHostTier* client, uint64_t seed, uint64_t base, uint64_t range,
                       int ops, Oracle* oracle) {
  std::mt19937_64 rng(seed);
  const std::size_t sizes[] = {0, 1, 63, 64, 65, 200, 517};
  const std::size_t stride = oracle->stride();
  for (int op = 0; op < ops; ++op) {
    const std::size_t n = sizes[rng() % (sizeof(sizes) / sizeof(sizes[0]))];
    std::vector<uint64_t> keys(n);
    for (auto& k : keys) k = base + rng() % range;
    const int kind = static_cast<int>(rng() % 10);
    if (kind < 5) {
      std::vector<int32_t> slots;
      if (rng() % 2) {
        slots.resize(n);
        for (auto& s : slots) s = static_cast<int32_t>(rng() % 26);
      }
      std::vector<float> got(n * stride, -1.0f), want;
      // Duplicates in one batch: the first occurrence creates, the oracle matches that.
      const std::size_t want_created = oracle->pull(keys, slots, &want);
      std::size_t created = 12345;
      Status st = client->pull(keys.data(), slots.empty() ? nullptr : slots.data(), n,
                               n ? got.data() : nullptr, &created);
      ASSERT_TRUE(st.ok()) << st.to_string();
      ASSERT_EQ(created, want_created) << "op " << op;
      ASSERT_EQ(got, want) << "op " << op << " n " << n;
    } else if (kind < 9) {
      // Unique keys per push so the last write per key is well defined.
      std::sort(keys.begin(), keys.end());
      keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
      std::vector<float> rows(keys.size() * stride);
      std::uniform_real_distribution<float> value(-2.0f, 2.0f);
      for (auto& v : rows) v = value(rng);
      // A row a card pushes back was seen this pass (tables reset unseen_days on pull and push).
      for (std::size_t i = 0; i < keys.size(); ++i) rows[i * stride + RowLayout::kUnseenDays] = 0;
      Status st = client->push(keys.data(), keys.size(), rows.data());
      ASSERT_TRUE(st.ok()) << st.to_string();
      oracle->push(keys, rows);
    } else {
      Status st = client->erase(keys.data(), keys.size());
      ASSERT_TRUE(st.ok()) << st.to_string();
      oracle->erase(keys);
    }
  }
}

}  // namespace gpubox::table::server::testing
