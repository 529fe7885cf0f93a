// The PS pipeline tests' shared parts (ps_pipeline_test, ps_pipeline_trainer_test): a client of
// in-process shards, the servers' rows of a set of batches, a host tier whose pulls can be held.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "common/thread_annotations.hpp"
#include "dataset/batch.hpp"
#include "table/host_tier.hpp"
#include "table/server/remote_host_tier.hpp"
#include "tests/table/forwarding_host_tier.hpp"
#include "tests/trainer/ps_test_servers.hpp"

namespace gpubox::trainer::ps_modes {

using table::server::RemoteHostTier;

// unreachable_s >= 0: a call gives up on a server none of its attempts reached for that long
// (RemoteHostTierOptions::unreachable_s), long before deadline_s.
inline std::unique_ptr<RemoteHostTier> connect(const std::string& endpoints,
                                               const TrainerConfig& cfg, double deadline_s = 30.0,
                                               double unreachable_s = -1.0) {
  table::server::RemoteHostTierOptions options;
  options.endpoints = endpoints;
  options.config = cfg.sparse;
  options.deadline_s = deadline_s;
  options.unreachable_s = unreachable_s;
  options.connect_timeout_s = 0.5;
  auto servers = RemoteHostTier::connect(std::move(options));
  throw_if_error(servers.status());
  return std::move(servers).value();
}

inline std::unique_ptr<RemoteHostTier> connect(const Servers& shards, const TrainerConfig& cfg,
                                               double deadline_s = 30.0,
                                               double unreachable_s = -1.0) {
  return connect(shards.endpoints(), cfg, deadline_s, unreachable_s);
}

// The servers' full rows (PEEK) of every key of `batches`, each of which must be there.
inline std::map<uint64_t, std::vector<float>> peek_rows(
    RemoteHostTier& servers, const std::vector<dataset::Batch>& batches) {
  std::map<uint64_t, std::vector<float>> out;
  std::vector<uint64_t> keys;
  std::vector<int32_t> slots;
  for (const dataset::Batch& batch : batches) {
    for (uint64_t key : batch.keys) {
      if (out.emplace(key, std::vector<float>()).second) {
        keys.push_back(key);
        slots.push_back(1);
      }
    }
  }
  const auto stride = static_cast<std::size_t>(servers.layout().stride());
  std::vector<float> rows(keys.size() * stride);
  std::size_t unknown = 0;
  throw_if_error(servers.peek(keys.data(), slots.data(), keys.size(), rows.data(), &unknown));
  EXPECT_EQ(unknown, 0u) << "a pulled key is missing on the servers";
  for (std::size_t i = 0; i < keys.size(); ++i) {
    out[keys[i]].assign(rows.begin() + static_cast<std::ptrdiff_t>(i * stride),
                        rows.begin() + static_cast<std::ptrdiff_t>((i + 1) * stride));
  }
  return out;
}

// A HostTier that forwards to `table` and notes the keys of every pull that finished (a pull
// still under way shows as keys not noted yet); hold(from, ms) makes each pull of a key >= `from`
// wait `ms` first.
class SlowPulls final : public table::testing::ForwardingHostTier {
 public:
  explicit SlowPulls(table::HostTier& table) : ForwardingHostTier(table) {}
  Status pull(const uint64_t* keys, const int32_t* slots, std::size_t n, float* rows,
              std::size_t* created) override {
    const uint64_t from = held_from_.load();
    if (from > 0 && std::any_of(keys, keys + n, [&](uint64_t k) { return k >= from; })) {
      std::this_thread::sleep_for(std::chrono::milliseconds(held_ms_.load()));
    }
    const Status pulled = ForwardingHostTier::pull(keys, slots, n, rows, created);
    MutexLock lock(mu_);
    pulled_.insert(keys, keys + n);
    return pulled;
  }
  // From now on, pulls of a key >= `from` (0: none) wait `ms` before they are served.
  void hold(uint64_t from, int ms) {
    held_ms_ = ms;
    held_from_ = from;
  }
  // The keys of `batch` no finished pull had.
  std::size_t never_pulled(const dataset::Batch& batch) const {
    MutexLock lock(mu_);
    std::size_t never = 0;  // a loop, not count_if: the analysis cannot see the lock in a lambda
    for (const uint64_t k : batch.keys) never += pulled_.count(k) == 0 ? 1 : 0;
    return never;
  }

 private:
  std::atomic<uint64_t> held_from_{0};
  std::atomic<int> held_ms_{0};
  mutable Mutex mu_;
  std::set<uint64_t> pulled_ GPUBOX_GUARDED_BY(mu_);
};

}  // namespace gpubox::trainer::ps_modes
