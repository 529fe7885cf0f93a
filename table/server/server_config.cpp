#include "table/server/server_config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <sstream>

#include "common/logging.hpp"

namespace gpubox::table::server {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

StatusOr<SparseOptimizerKind> parse_optimizer_kind(const std::string& name) {
  const std::string n = lower(name);
  if (n == "sgd" || n == "naive" || n == "sparsenaivesgdrule") return SparseOptimizerKind::kSgd;
  if (n == "adagrad" || n == "sparseadagradsgdrule") return SparseOptimizerKind::kAdagrad;
  if (n == "adam" || n == "sparseadamsgdrule") return SparseOptimizerKind::kAdam;
  if (n == "shared_adam" || n == "sharedadam" || n == "sparsesharedadamsgdrule") {
    return SparseOptimizerKind::kSharedAdam;
  }
  return Status::InvalidArgument("unknown sparse optimizer '" + name +
                                 "' (sgd, adagrad, adam or shared_adam)");
}

Status parse_sparse_config_yaml(const std::string& yaml_text, const std::string& source,
                                SparseOptimizerConfig* config) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(source + ": " + e.what());
  }
  if (!root.IsMap()) return Status::InvalidArgument(source + ": not a YAML mapping");
  const YAML::Node hyper = root["hyper_parameters"];
  if (!hyper || !hyper.IsMap()) return Status::OK();
  std::string key;
  try {
    key = "hyper_parameters.sparse_feature_dim";
    if (hyper["sparse_feature_dim"]) {
      const int dim = hyper["sparse_feature_dim"].as<int>();
      if (dim < 1) return Status::InvalidArgument(source + ": " + key + " must be at least 1");
      config->mf_dim = dim - 1;
    }
    const YAML::Node opt = hyper["sparse_optimizer"];
    if (!opt) return Status::OK();
    if (!opt.IsMap())
      return Status::InvalidArgument(source +
                                     ": hyper_parameters.sparse_optimizer is not a mapping");
    std::map<std::string, float*> floats = {
        {"learning_rate", &config->learning_rate},
        {"initial_g2sum", &config->initial_g2sum},
        {"initial_range", &config->initial_range},
        {"min_bound", &config->min_bound},
        {"max_bound", &config->max_bound},
        {"mf_learning_rate", &config->mf_learning_rate},
        {"mf_initial_g2sum", &config->mf_initial_g2sum},
        {"mf_initial_range", &config->mf_initial_range},
        {"mf_min_bound", &config->mf_min_bound},
        {"mf_max_bound", &config->mf_max_bound},
        {"beta1_decay_rate", &config->beta1_decay_rate},
        {"beta2_decay_rate", &config->beta2_decay_rate},
        {"ada_epsilon", &config->ada_epsilon},
        {"nonclk_coeff", &config->nonclk_coeff},
        {"clk_coeff", &config->clk_coeff},
        {"embedx_threshold", &config->embedx_threshold},
        {"show_click_decay_rate", &config->show_click_decay_rate},
        {"delete_threshold", &config->delete_threshold},
        {"delete_after_unseen_days", &config->delete_after_unseen_days},
    };
    for (const auto& item : opt) {
      const std::string name = item.first.as<std::string>();
      key = "hyper_parameters.sparse_optimizer." + name;
      if (name == "class" || name == "kind" || name == "name") {
        auto kind = parse_optimizer_kind(item.second.as<std::string>());
        if (!kind.ok()) return kind.status().with_context(source + ": " + key);
        config->kind = *kind;
      } else if (name == "mf_dim") {
        if (!hyper["sparse_feature_dim"]) config->mf_dim = item.second.as<int32_t>();
      } else if (name == "seed") {
        config->seed = item.second.as<uint64_t>();
      } else if (auto it = floats.find(name); it != floats.end()) {
        *it->second = item.second.as<float>();
      } else {
        GPUBOX_LOG(WARNING) << source << ": " << key << " is not a sparse-row setting; ignored";
      }
    }
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(source + ": " + key + ": " + e.what());
  }
  if (config->mf_dim < 0) return Status::InvalidArgument(source + ": mf_dim must not be negative");
  return Status::OK();
}

Status load_sparse_config_yaml(const std::string& path, SparseOptimizerConfig* config) {
  std::ifstream in(path);
  if (!in) return Status::NotFound("cannot read config '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  return parse_sparse_config_yaml(text.str(), path, config);
}

}  // namespace gpubox::table::server
