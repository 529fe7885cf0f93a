// The one place a host tier is built from its settings: the in-process SparseTable (with its
// shards, save form and disk tier) when no servers are given, else the client of the
// gpubox_server processes (endpoints, token, timeouts). Every schedule and tool that needs a
// host tier calls make_host_tier with the table part of its config (table/sparse_config.hpp),
// so every setting reaches whichever tier is built.
#pragma once

#include <memory>

#include "common/status.hpp"
#include "table/host_table_types.hpp"
#include "table/host_tier.hpp"
#include "table/sparse_row/accessor.hpp"

namespace gpubox::table {

// config.remote.endpoints empty: SparseTable::open(accessor, config.table); else
// RemoteHostTier::connect with the endpoints, token and timeouts of config.remote (each server
// must hold `accessor`'s layout: checked at connect). Errors name the servers or the disk tier.
StatusOr<std::unique_ptr<HostTier>> make_host_tier(const AccessorConfig& accessor,
                                                   const HostTierConfig& config);

}  // namespace gpubox::table
