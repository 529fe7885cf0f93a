// The table part of a config, derived in ONE place for every tier that holds rows (the card tier
// and the in-process table of gpubox_train, and gpubox_server), so that they all create and
// update the same rows and set up the host tier the same way:
//   the sparse row layout and its accessor/optimizer rules (sparse_config_from):
//     mf_dim = hyper_parameters.sparse_feature_dim - 1 (ffm: times the fields, sparse slots plus
//              dense features: config::resolve_embedx_width, which resolves the network and the
//              dense features of a PaddleRec model folder as the trainer does)
//     seed   = runner.seed ^ hyper_parameters.sparse_optimizer.seed
//     the rest: hyper_parameters.sparse_optimizer.* by name, but for a PaddleRec model folder's
//              config that names no sparse rule (paddlerec_rows_rule_note): its rule, and where
//              the folder's network initialiser is applied (dcn_v2's) the start ranges
//              initial_range and mf_initial_range the config leaves unset
//              (paddlerec_start_range);
//   the host tier (host_tier_config_from): the in-process table's shards, save form and disk
//   tier (runner.host_table_shards, save_form, rocksdb_path, host_memory_row_budget,
//   host_memory_mb, cold_after_days) and the remote tier's client (runner.server_timeout_s,
//   server_connect_timeout_s, server_connections).
#pragma once

#include <optional>
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

// A PaddleRec model folder's config (models/rank/<name>/: config::paddlerec_model_name) that sets
// hyper_parameters.optimizer.class and none of hyper_parameters.sparse_optimizer.class,
// learning_rate, mf_learning_rate, embedx_threshold (by name, table_parameters or -o) means its
// optimizer for the embedding rows too: PaddleRec's trainers step its embedding tables with it, and
// Paddle's parameter server derives such a table's rule from it (the_one_ps.py: SparseAdamSGDRule
// at the optimizer's learning rate, embedx_threshold 0). With Adam, sparse_config_from gives the
// rows that rule (class adam, learning_rate = mf_learning_rate = the optimizer's, its beta1, beta2
// and epsilon, embedx from a key's first step); with SGD or Adagrad (dlrm, flen: gradients that
// scale with the batch, which GPUBox's per-key rule does not mirror) the rows keep
// hyper_parameters.sparse_optimizer.*. Where the rows take the folder's Adam and its network's
// embedding initialiser is applied (config::paddlerec_embedding_init: dcn_v2's), they start
// uniform with that initialiser's std (paddlerec_start_range), each of initial_range and
// mf_initial_range unless the config sets it; under any other rule (SGD, Adagrad, a sparse rule's
// key set) they start at GPUBox's ranges, and the line says so. PaddleRec's dlrm network
// (config::paddlerec_dlrm_network) steps them with Adam whatever class says, and so do its rows
// here unless the config sets a sparse rule's keys (then the line says the rows do not take that
// Adam). The start line saying which and where the rows start (`rows`, sparse_config_from's:
// embed_w U(+-initial_range), embedx U(+-mf_initial_range), each marked set, derived or GPUBox's),
// for such a config or a folder whose initialiser is applied; "" for any other config.
std::string paddlerec_rows_rule_note(const config::ConfigDocument& doc, const AccessorConfig& rows);

// The start range sparse_config_from derives for `doc`'s rows from its PaddleRec folder's
// network initialiser (above), before the config's own initial_range / mf_initial_range; nullopt
// where none is derived. A save records the range used (trainer's model_keys).
std::optional<float> paddlerec_start_range(const config::ConfigDocument& doc);

// Reads the host-tier keys (above). The remote tier's endpoints and token are not config keys:
// they come from the launcher (PADDLE_PSERVERS_IP_PORT_LIST, the token file).
HostTierConfig host_tier_config_from(const config::ConfigDocument& doc);

// gpubox_server's loader: config::ConfigDocument::load(path, overrides), then
// sparse_config_from. Errors are the document's (they name the file, line and key).
StatusOr<AccessorConfig> load_sparse_config(const std::string& path,
                                            const std::vector<std::string>& overrides = {});

}  // namespace table
}  // namespace gpubox
