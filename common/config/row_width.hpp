// How wide a key's embedding (embedx) is, by the network that reads it: one rule for the table
// part (table::sparse_config_from), the trainer (which resolves a network its PaddleRec model
// folder names) and the checks that refuse what does not fit.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "common/config/config_document.hpp"
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

// The network whose rows the table part makes for `doc`: hyper_parameters.model when set, else
// the field-aware network a PaddleRec model folder names (its workspace, else the models/rank/
// <name>/ folder the config sits in: ffm, fat_deepffm), as the trainer chooses it
// (trainer/config/network_choice.cpp), so a gpubox_server started on PaddleRec's fat_deepffm or
// ffm config.yaml keeps rows as wide as its trainers'. Every other network reads one factor per
// key, whatever the folder names.
inline ModelKind row_model(const ConfigDocument& doc) {
  const ModelKind model = doc.get_enum("hyper_parameters.model", kModelKindNames);
  if (doc.is_set("hyper_parameters.model")) return model;
  const auto folder_model = [](const std::filesystem::path& path) -> std::string {
    std::vector<std::string> parts;
    for (const auto& part : path.lexically_normal()) parts.push_back(part.string());
    for (std::size_t i = 0; i + 2 < parts.size(); ++i) {
      if (parts[i] == "models" && parts[i + 1] == "rank") return parts[i + 2];
    }
    return "";
  };
  std::string name = folder_model(doc.get_string("workspace") + "/");
  const std::string config = doc.file_path().empty() ? doc.source() : doc.file_path();
  const std::filesystem::path folder = std::filesystem::path(config).parent_path();
  std::error_code ec;
  if (name.empty() && !folder.empty()) {
    name = folder_model(std::filesystem::absolute(folder, ec).string() + "/");
  }
  if (name == "ffm") return ModelKind::kFfm;
  if (name == "fat_deepffm") return ModelKind::kFatDeepffm;
  return model;
}

}  // namespace gpubox::config
