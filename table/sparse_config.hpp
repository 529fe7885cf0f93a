// The table part of a config, derived in ONE place for every tier that holds rows (the card tier
// and the in-process table of gpubox_train, and gpubox_server), so that they all create and
// update the same rows and set up the host tier the same way:
//   the sparse row layout and its accessor/optimizer rules (sparse_config_from):
//     mf_dim = hyper_parameters.sparse_feature_dim - 1 (ffm: times the fields, sparse slots plus
//              dense features: config::resolve_embedx_width, which resolves the network and the
//              dense features of a PaddleRec model folder as the trainer does)
//     seed   = runner.seed ^ hyper_parameters.sparse_optimizer.seed
//     the rest: hyper_parameters.sparse_optimizer.* by name;
//   the host tier (host_tier_config_from): the in-process table's shards, save form and disk
//   tier (runner.host_table_shards, save_form, rocksdb_path, host_memory_row_budget,
//   host_memory_mb, cold_after_days) and the remote tier's client (runner.server_timeout_s,
//   server_connect_timeout_s, server_connections).
#pragma once

#include <string>
#include <vector>

#include "common/status.hpp"
#include "table/host_table_types.hpp"
#include "table/sparse_row/accessor.hpp"

namespace gpubox {
namespace config {
class ConfigDocument;
}
namespace table {

// Reads the keys the key table marks as read by the table part (config::kTable). Errors: a
// PaddleRec model folder naming a network GPUBox does not build (config::resolve_network), as
// the trainer refuses it.
StatusOr<AccessorConfig> sparse_config_from(const config::ConfigDocument& doc);

// Reads the host-tier keys (above). The remote tier's endpoints and token are not config keys:
// they come from the launcher (PADDLE_PSERVERS_IP_PORT_LIST, the token file).
HostTierConfig host_tier_config_from(const config::ConfigDocument& doc);

// gpubox_server's loader: config::ConfigDocument::load(path, overrides), then
// sparse_config_from. Errors are the document's (they name the file, line and key).
StatusOr<AccessorConfig> load_sparse_config(const std::string& path,
                                            const std::vector<std::string>& overrides = {});

}  // namespace table
}  // namespace gpubox
