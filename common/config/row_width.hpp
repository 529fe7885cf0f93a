// How wide a key's embedding (embedx) is, by the network that reads it: one rule for the table
// part (table::sparse_config_from), the trainer (which resolves a network its PaddleRec model
// folder names) and the checks that refuse what does not fit.
#pragma once

#include <cstdint>

#include "common/config/config_enums.hpp"

namespace gpubox::config {

// hyper_parameters.sparse_feature_dim counts the wide weight embed_w and one factor of
// `factor_dim` = sparse_feature_dim - 1 values. Every network reads one factor per key but ffm,
// whose row holds one factor per field it meets (PaddleRec's ffm: an embedding of
// sparse_feature_dim x num_field per key, the dense features counted as fields): fields x
// factor_dim, fields = the sparse slots plus the dense features; fat_deepffm's rows are ffm's
// (PaddleRec's fat_deepffm: an embedding of sparse_feature_dim x num_fields per key).
inline int64_t row_embedx_width(ModelKind model, int64_t factor_dim, int64_t sparse_slots,
                                int64_t dense_dim) {
  if (model != ModelKind::kFfm && model != ModelKind::kFatDeepffm) return factor_dim;
  return (sparse_slots + dense_dim) * factor_dim;
}

}  // namespace gpubox::config
