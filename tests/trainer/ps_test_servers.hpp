// The PS modes' tests' shared parts: config_gpubox.yaml sized to the planted data, in-process
// gpubox_server shards over in-process tables on loopback, and a client of them.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/server/server.hpp"
#include "table/sparse_table.hpp"
#include "tests/common/free_port.hpp"
#include "tests/common/test_data_config.hpp"
#include "trainer/config/config_loader.hpp"

namespace gpubox::trainer::ps_modes {

// config_gpubox.yaml sized to the test data (test_data_config.hpp) for the PS modes, plus `extra`.
inline TrainerConfig ps_test_config(const std::vector<std::string>& extra) {
  return testing::load_test_config(
      testing::test_data_overrides({"runner.print_interval=1000000", "runner.server_timeout_s=3",
                                    "runner.collective_timeout_s=3", "runner.split_file_list=true",
                                    "hyper_parameters.fc_sizes=[128, 64]"}),
      extra);
}

// In-process gpubox_server shards, each over its own in-process table; their saves stay inside
// `data_dir`; `base` holds their other options (a test-lowered frame limit), which `shape`
// (when set) changes for server i (a fault injected into one of them).
class Servers {
 public:
  using Shape = std::function<void(int, table::server::ServerOptions*)>;
  Servers(const TrainerConfig& config, int count,
          const std::string& data_dir = std::filesystem::temp_directory_path().string(),
          table::server::ServerOptions base = {}, const Shape& shape = nullptr) {
    for (int i = 0; i < count; ++i) {
      auto table = table::SparseTable::open(config.sparse, config.host_tier.table);
      throw_if_error(table.status());
      tables_.push_back(std::move(table).value());
      table::server::ServerOptions options = base;
      if (shape) shape(i, &options);
      options.shard_id = static_cast<uint32_t>(i);
      options.shard_num = static_cast<uint32_t>(count);
      options.data_dir = data_dir;
      // restart(i) starts server i again on its port: drawn below the ephemeral range, where
      // the other tests' connections and --port 0 servers cannot take it in between.
      if (options.port == 0) options.port = gpubox::testing::port_below_ephemeral_range();
      auto server = table::server::Server::start(tables_.back().get(), options);
      throw_if_error(server.status());
      endpoints_ += (i ? "," : "") + (*server)->endpoint();
      servers_.push_back(std::move(server).value());
      options_.push_back(options);
    }
    config_ = config;
  }
  const std::string& endpoints() const { return endpoints_; }
  // Stops server i and returns once it serves nothing more (Server::stop only asks its threads to
  // end: a test that went on at once could still have calls answered by it on a loaded machine).
  void stop(int i) {
    table::server::Server& server = *servers_.at(static_cast<std::size_t>(i));
    server.stop();
    server.wait();
  }
  // Server i killed and started again on its port, as a new instance over an empty table (what a
  // gpubox_server restarted after a crash holds). `stopping` (when set) runs once the old
  // instance stopped accepting, before its threads are waited for: a fault hook running on one of
  // them (ServerOptions::drop_reply) may let go then. `as` (when set): the table of that config
  // (a server restarted with another config).
  void restart(int i, const std::function<void()>& stopping = nullptr,
               const TrainerConfig* as = nullptr) {
    const auto at = static_cast<std::size_t>(i);
    table::server::ServerOptions options = options_.at(at);
    options.port = servers_.at(at)->port();
    servers_[at]->stop();
    if (stopping) stopping();
    servers_[at]->wait();
    servers_[at].reset();
    const TrainerConfig& config = as != nullptr ? *as : config_;
    auto table = table::SparseTable::open(config.sparse, config.host_tier.table);
    throw_if_error(table.status());
    tables_[at] = std::move(table).value();
    auto server = table::server::Server::start(tables_[at].get(), options);
    throw_if_error(server.status());
    servers_[at] = std::move(server).value();
  }
  table::SparseTable& table(int i) { return *tables_.at(static_cast<std::size_t>(i)); }
  // BARRIER waits open on server i now (its counters' gauge).
  uint64_t barrier_waiters(int i) const {
    return servers_.at(static_cast<std::size_t>(i))->counters().barrier_waiters;
  }
  // BARRIER waiters of server i (its instance now) whose client left before the barrier was
  // reached: a trainer that waited out its deadline there.
  uint64_t barrier_waiters_dropped(int i) const {
    return servers_.at(static_cast<std::size_t>(i))->counters().barrier_waiters_dropped;
  }

 private:
  std::vector<std::unique_ptr<table::SparseTable>> tables_;
  std::vector<std::unique_ptr<table::server::Server>> servers_;
  std::vector<table::server::ServerOptions> options_;
  TrainerConfig config_;
  std::string endpoints_;
};

// A client of `shards` for `config`'s table, each call bounded by `deadline_s` and each connect
// by `connect_timeout_s` (RemoteHostTierOptions' own unless a test lowers them). Throws
// gpubox::Error when it does not connect.
inline std::unique_ptr<table::server::RemoteHostTier> connect_client(
    const Servers& shards, const TrainerConfig& config,
    double deadline_s = table::server::RemoteHostTierOptions{}.deadline_s,
    double connect_timeout_s = table::server::RemoteHostTierOptions{}.connect_timeout_s) {
  table::server::RemoteHostTierOptions options;
  options.endpoints = shards.endpoints();
  options.config = config.sparse;
  options.deadline_s = deadline_s;
  options.connect_timeout_s = connect_timeout_s;
  auto client = table::server::RemoteHostTier::connect(std::move(options));
  throw_if_error(client.status());
  return std::move(client).value();
}

}  // namespace gpubox::trainer::ps_modes
