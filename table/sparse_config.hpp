// The table part of a config: the sparse row layout and its accessor/optimizer rules, derived
// in ONE place for every tier that holds rows (the card tier and the in-process table of
// gpubox_train, and gpubox_server), so that they all create and update the same rows:
//   mf_dim = hyper_parameters.sparse_feature_dim - 1
//   seed   = runner.seed ^ hyper_parameters.sparse_optimizer.seed
//   the rest: hyper_parameters.sparse_optimizer.* by name.
#pragma once

#include <string>
#include <vector>

#include "common/status.hpp"
#include "table/accessor/sparse_row.hpp"

namespace gpubox {
namespace config {
class ConfigDocument;
}
namespace table {

// Reads the keys the key table marks as read by the table part (config::kTable).
AccessorConfig sparse_config_from(const config::ConfigDocument& doc);

// gpubox_server's loader: config::ConfigDocument::load(path, overrides), then
// sparse_config_from. Errors are the document's (they name the file, line and key).
StatusOr<AccessorConfig> load_sparse_config(const std::string& path,
                                            const std::vector<std::string>& overrides = {});

}  // namespace table
}  // namespace gpubox
