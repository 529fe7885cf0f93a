#include "table/server/host_tier_factory.hpp"

#include "table/server/remote_host_tier.hpp"
#include "table/sparse_table.hpp"

namespace gpubox::table {

StatusOr<std::unique_ptr<HostTier>> make_host_tier(const AccessorConfig& accessor,
                                                   const HostTierConfig& config) {
  if (config.remote.endpoints.empty()) {
    auto table = SparseTable::open(accessor, config.table);
    if (!table.ok()) {
      const std::string& disk = config.table.rocksdb_path;
      if (disk.empty()) return table.status().with_context("opening the host table");
      // RocksDB's lock of the folder: another process (a second server given the same
      // --rocksdb_dir, another run) has it open.
      const bool locked = table.status().message().find("/LOCK") != std::string::npos;
      const Status opened = table.status().with_context(
          "opening the host table's disk tier (runner.rocksdb_path or gpubox_server "
          "--rocksdb_dir '" +
          disk + "')");
      if (!locked) return opened;
      return Status::IOError(opened.message() +
                             " (another process has this folder open: each server and run needs "
                             "its own)");
    }
    return std::unique_ptr<HostTier>(std::move(table).value());
  }
  server::RemoteHostTierOptions options;
  options.endpoints = config.remote.endpoints;
  options.config = accessor;
  options.auth_token = config.remote.auth_token;
  options.deadline_s = config.remote.deadline_s;
  options.connect_timeout_s = config.remote.connect_timeout_s;
  options.connections_per_endpoint = config.remote.connections_per_endpoint;
  auto remote = server::RemoteHostTier::connect(options);
  if (!remote.ok()) {
    // Servers that answered and refuse this trainer (another table, rule or shard order) are
    // reached: said so, not "cannot reach".
    const bool refused = remote.status().code() == Status::Code::kInvalidArgument;
    return remote.status().with_context(
        (refused ? "the host-tier servers " : "cannot reach the host-tier servers ") +
        config.remote.endpoints + (refused ? " do not match this trainer" : ""));
  }
  return std::unique_ptr<HostTier>(std::move(remote).value());
}

}  // namespace gpubox::table
