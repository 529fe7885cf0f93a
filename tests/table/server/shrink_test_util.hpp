// SHRINK tests' helpers (shrink_progress_test.cpp, shrink_dedupe_test.cpp): a tier whose
// shrink steps are slowed or held, the tables, servers and clients they run on.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "table/sparse_table.hpp"
#include "tests/table/forwarding_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"

namespace gpubox::table::server::shrink_test {

using namespace testing;  // NOLINT: the loopback helpers
using std::chrono::milliseconds;

// The client's bound without progress: well over a loaded machine's stalls (a shrink that
// moves is not given up on).
constexpr double kBoundS = 3.0;

// A tier whose SHRINK steps (the table's progress calls: a shard done, a chunk of rows aged) each
// wait `delay` first (one at a time, so a shrink of n steps takes at least n times it), and from
// step `hold_at` on are held until release(): kStopped reports nothing meanwhile (a server stuck
// in its own code), kMoving reports the step every 50 ms (a shrink that moves for as long as the
// test wants). A held step lets go by itself after a minute, so that a test that went wrong
// fails instead of hanging.
class SlowShrinkTier final : public table::testing::ForwardingHostTier {
 public:
  enum class Hold { kStopped, kMoving };

  SlowShrinkTier(HostTier& inner, milliseconds delay) : ForwardingHostTier(inner), delay_(delay) {}
  ~SlowShrinkTier() override { release(); }

  void hold_at(int64_t step, Hold how) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_at_ = step;
    hold_ = how;
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    released_cv_.notify_all();
  }
  int64_t steps() const {
    std::lock_guard<std::mutex> lock(mu_);
    return steps_;
  }
  bool holding() const {
    std::lock_guard<std::mutex> lock(mu_);
    return holding_;
  }

  using HostTier::shrink;
  StatusOr<uint64_t> shrink(const std::function<void()>& on_progress) override {
    return inner().shrink([&] { step(on_progress); });
  }

 private:
  void step(const std::function<void()>& on_progress) {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t at = steps_++;
    std::this_thread::sleep_for(delay_);  // under the lock: the steps take turns
    if (hold_at_ >= 0 && at >= hold_at_ && !released_) hold(lock, on_progress);
    lock.unlock();
    if (on_progress) on_progress();
  }
  void hold(std::unique_lock<std::mutex>& lock, const std::function<void()>& on_progress) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    holding_ = true;
    while (!released_ && std::chrono::steady_clock::now() < until) {
      if (hold_ == Hold::kStopped) {
        released_cv_.wait_until(lock, until);
        continue;
      }
      lock.unlock();
      if (on_progress) on_progress();  // still moving: the server sees the shrink step on
      std::this_thread::sleep_for(milliseconds(50));
      lock.lock();
    }
    holding_ = false;
  }

  const milliseconds delay_;
  mutable std::mutex mu_;
  std::condition_variable released_cv_;
  int64_t steps_ = 0;
  int64_t hold_at_ = -1;
  Hold hold_ = Hold::kStopped;
  bool released_ = false;
  bool holding_ = false;
};

// A table of `shards` shards; with a disk tier at `rocksdb_path` when set, rows unseen for a day
// moved to it by a shrink.
inline std::unique_ptr<SparseTable> sparse_table(uint32_t shards, const AccessorConfig& cfg,
                                                 const std::string& rocksdb_path = "") {
  HostTableConfig table_cfg;
  table_cfg.shards = shards;
  if (!rocksdb_path.empty()) {
    table_cfg.rocksdb_path = rocksdb_path;
    table_cfg.cold_after_days = 1;
  }
  auto table = SparseTable::open(cfg, table_cfg);
  EXPECT_TRUE(table.ok()) << table.status().to_string();
  return std::move(table).value();
}

inline ServerOptions progress_options() {
  ServerOptions so;
  so.progress_interval_s = 0.1;
  return so;
}

// What every SHRINK test holds its shrink in: a table of `shards` shards behind a SlowShrinkTier
// (no delay, nothing held until the test says), served with `options` (PROGRESS frames every
// 0.1 s by default). `server` is null when it did not start. The tier is let go when this ends,
// before the server waits for its worker (also when an assertion left the test early).
struct HeldShrinkServer {
  HeldShrinkServer(uint32_t shards, const AccessorConfig& cfg,
                   ServerOptions options = progress_options())
      : table(sparse_table(shards, cfg)),
        tier(*table, milliseconds(0)),
        server(start_server(&tier, std::move(options))) {}
  ~HeldShrinkServer() { tier.release(); }
  HeldShrinkServer(const HeldShrinkServer&) = delete;
  HeldShrinkServer& operator=(const HeldShrinkServer&) = delete;

  std::unique_ptr<SparseTable> table;
  SlowShrinkTier tier;
  std::unique_ptr<Server> server;
};

inline RemoteHostTierOptions bounded_client(const std::string& endpoints,
                                            const AccessorConfig& cfg) {
  RemoteHostTierOptions o = client_options(endpoints);
  o.config = cfg;
  o.deadline_s = kBoundS;
  o.chunk_rows = 4096;
  return o;
}

inline std::vector<uint64_t> spread_keys(std::size_t n, uint64_t first) {
  std::vector<uint64_t> keys(n);
  for (std::size_t i = 0; i < n; ++i) keys[i] = (first + i) * 0x9e3779b97f4a7c15ULL;
  return keys;
}

}  // namespace gpubox::table::server::shrink_test
