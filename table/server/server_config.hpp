// The sparse row layout a gpubox_server holds, read from the trainer's YAML config
// (PaddleRec config_gpubox.yaml), so servers and trainers agree on the row stride:
//   hyper_parameters.sparse_feature_dim   1 (embed_w) + mf_dim
//   hyper_parameters.sparse_optimizer.*   class (sgd | adagrad | adam | shared_adam) and the
//                                         SparseOptimizerConfig fields by name (learning_rate,
//                                         mf_initial_range, embedx_threshold, seed, ...)
// Other keys belong to the trainer and are ignored here (the trainer validates them).
#pragma once

#include <string>

#include "common/status.hpp"
#include "table/accessor/sparse_row.hpp"

namespace gpubox::table::server {

// "sgd", "adagrad", "adam", "shared_adam" (case-insensitive; PaddleRec's rule names
// SparseNaiveSGDRule, SparseAdaGradSGDRule, SparseAdamSGDRule, SparseSharedAdamSGDRule too).
StatusOr<SparseOptimizerKind> parse_optimizer_kind(const std::string& name);

// Updates *config from the YAML file's keys above; errors name the file and the key.
Status load_sparse_config_yaml(const std::string& path, SparseOptimizerConfig* config);
// The same from YAML text (`source` names it in errors).
Status parse_sparse_config_yaml(const std::string& yaml_text, const std::string& source,
                                SparseOptimizerConfig* config);

}  // namespace gpubox::table::server
