// A small in-memory HostTier for the server tests: an unordered_map of rows plus the accessor's
// init_row, with call counters (to prove a retried PUSH is applied once) and a one-file save.
// Thread-safe (one mutex). Also the oracle's rules: what a correct server must reproduce.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/thread_annotations.hpp"
#include "table/host_tier.hpp"
#include "table/io/file_env.hpp"

namespace gpubox::table::server::testing {

class FakeHostTier final : public HostTier {
 public:
  explicit FakeHostTier(AccessorConfig cfg)
      : cfg_(cfg), layout_(RowLayout::make(cfg.optimizer.kind, cfg.mf_dim, cfg.storage)) {}

  const RowLayout& layout() const override { return layout_; }
  const AccessorConfig& config() const override { return cfg_; }

  Status pull(const uint64_t* keys, const int32_t* slots, std::size_t n, float* rows,
              std::size_t* created) override {
    MutexLock lock(mu_);
    std::size_t made = 0;
    const std::size_t stride = layout_.stride();
    for (std::size_t i = 0; i < n; ++i) {
      auto [it, inserted] = rows_.try_emplace(keys[i]);
      if (inserted) {
        it->second.resize(stride);
        init_row(it->second.data(), layout_, cfg_, keys[i], slots ? slots[i] : 0);
        ++made;
      }
      std::memcpy(rows + i * stride, it->second.data(), stride * sizeof(float));
    }
    if (created) *created = made;
    pull_calls.fetch_add(1);
    return Status::OK();
  }

  Status peek(const uint64_t* keys, const int32_t* slots, std::size_t n, float* rows,
              std::size_t* unknown) override {
    MutexLock lock(mu_);
    std::size_t absent = 0;
    const std::size_t stride = layout_.stride();
    for (std::size_t i = 0; i < n; ++i) {
      const auto it = rows_.find(keys[i]);
      if (it != rows_.end()) {
        std::memcpy(rows + i * stride, it->second.data(), stride * sizeof(float));
      } else {
        init_row(rows + i * stride, layout_, cfg_, keys[i], slots ? slots[i] : 0);
        ++absent;
      }
    }
    if (unknown) *unknown = absent;
    return Status::OK();
  }

  Status push(const uint64_t* keys, std::size_t n, const float* rows) override {
    MutexLock lock(mu_);
    const std::size_t stride = layout_.stride();
    for (std::size_t i = 0; i < n; ++i) {
      rows_[keys[i]].assign(rows + i * stride, rows + (i + 1) * stride);
    }
    push_calls.fetch_add(1);
    pushed_rows.fetch_add(n);
    return Status::OK();
  }

  Status erase(const uint64_t* keys, std::size_t n) override {
    MutexLock lock(mu_);
    for (std::size_t i = 0; i < n; ++i) rows_.erase(keys[i]);
    return Status::OK();
  }

  StatusOr<HostTierStats> stats() override {
    MutexLock lock(mu_);
    HostTierStats s;
    s.rows_in_memory = rows_.size();
    s.memory_bytes = rows_.size() * layout_.stride() * sizeof(float);
    return s;
  }

  // Decays show/click and deletes rows whose score falls under delete_threshold.
  using HostTier::shrink;
  StatusOr<uint64_t> shrink(const std::function<void()>& on_progress) override {
    (void)on_progress;  // one step: it holds few rows
    MutexLock lock(mu_);
    uint64_t deleted = 0;
    for (auto it = rows_.begin(); it != rows_.end();) {
      float* row = it->second.data();
      row[RowLayout::kShow] *= cfg_.show_click_decay_rate;
      row[RowLayout::kClick] *= cfg_.show_click_decay_rate;
      if (row_score(row, cfg_) < cfg_.delete_threshold) {
        it = rows_.erase(it);
        ++deleted;
      } else {
        ++it;
      }
    }
    shrink_calls.fetch_add(1);
    return deleted;
  }

  using HostTier::load;
  using HostTier::save;
  // One file, fake-rows.bin: u64 count, then (u64 key, f32 row[stride]) per row; through `env`
  // (the server's data_dir env) or the POSIX one.
  Status save(const std::string& path, SaveKind, io::FileEnv* env) override {
    if (env == nullptr) env = io::FileEnv::posix();
    MutexLock lock(mu_);
    std::string bytes;
    const uint64_t count = rows_.size();
    bytes.append(reinterpret_cast<const char*>(&count), sizeof(count));
    for (const auto& [key, row] : rows_) {
      bytes.append(reinterpret_cast<const char*>(&key), sizeof(key));
      bytes.append(reinterpret_cast<const char*>(row.data()), row.size() * sizeof(float));
    }
    GPUBOX_RETURN_IF_ERROR(env->create_dir(path));
    return io::write_file(env, path + "/fake-rows.bin", bytes);
  }

  Status load(const std::string& path, io::FileEnv* env) override {
    if (env == nullptr) env = io::FileEnv::posix();
    MutexLock lock(mu_);
    const std::string file = path + "/fake-rows.bin";
    if (!env->exists(file)) return Status::NotFound("no saved rows at " + file);
    auto bytes = env->read_file(file, uint64_t{1} << 30);
    if (!bytes.ok()) return bytes.status();
    const std::size_t row_bytes = layout_.stride() * sizeof(float);
    uint64_t count = 0;
    if (bytes->size() < sizeof(count)) return Status::Corruption("truncated " + file);
    std::memcpy(&count, bytes->data(), sizeof(count));
    if ((bytes->size() - sizeof(count)) / (sizeof(uint64_t) + row_bytes) < count) {
      return Status::Corruption("truncated " + file);
    }
    std::unordered_map<uint64_t, std::vector<float>> loaded;
    const char* at = bytes->data() + sizeof(count);
    for (uint64_t i = 0; i < count; ++i) {
      uint64_t key = 0;
      std::vector<float> row(layout_.stride());
      std::memcpy(&key, at, sizeof(key));
      std::memcpy(row.data(), at + sizeof(key), row_bytes);
      at += sizeof(key) + row_bytes;
      loaded[key] = std::move(row);
    }
    rows_ = std::move(loaded);
    return Status::OK();
  }

  // Test access.
  std::size_t size() {
    MutexLock lock(mu_);
    return rows_.size();
  }
  bool row(uint64_t key, std::vector<float>* out) {
    MutexLock lock(mu_);
    auto it = rows_.find(key);
    if (it == rows_.end()) return false;
    *out = it->second;
    return true;
  }

  std::atomic<uint64_t> pull_calls{0}, push_calls{0}, pushed_rows{0}, shrink_calls{0};

 private:
  AccessorConfig cfg_;
  RowLayout layout_;
  Mutex mu_;
  std::unordered_map<uint64_t, std::vector<float>> rows_ GPUBOX_GUARDED_BY(mu_);
};

}  // namespace gpubox::table::server::testing
