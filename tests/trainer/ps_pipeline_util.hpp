// The PS pipeline tests' shared parts (ps_pipeline_test, ps_pipeline_trainer_test): a client of
// in-process shards, and the servers' rows of a set of batches.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "dataset/batch.hpp"
#include "table/server/remote_host_tier.hpp"
#include "tests/trainer/ps_test_servers.hpp"

namespace gpubox::trainer::ps_modes {

using table::server::RemoteHostTier;

inline std::unique_ptr<RemoteHostTier> connect(const std::string& endpoints,
                                               const TrainerConfig& cfg, double deadline_s = 30.0) {
  table::server::RemoteHostTierOptions options;
  options.endpoints = endpoints;
  options.config = cfg.sparse;
  options.deadline_s = deadline_s;
  options.connect_timeout_s = 0.5;
  auto servers = RemoteHostTier::connect(std::move(options));
  throw_if_error(servers.status());
  return std::move(servers).value();
}

inline std::unique_ptr<RemoteHostTier> connect(const Servers& shards, const TrainerConfig& cfg,
                                               double deadline_s = 30.0) {
  return connect(shards.endpoints(), cfg, deadline_s);
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

}  // namespace gpubox::trainer::ps_modes
