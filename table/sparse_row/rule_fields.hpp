// The fields of a sparse rule (AccessorConfig) that change how rows train, each by its config key,
// so that two processes meant to apply one rule can compare it field by field and name what
// differs (gpubox_server's INFO reply carries the server's; the trainer refuses a server whose
// rule is not its own). Host only.
#pragma once

#include <cstddef>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "table/sparse_row/accessor.hpp"

namespace gpubox::table {

struct SparseRuleField {
  std::string key;  // the config key that sets it, e.g. hyper_parameters.sparse_optimizer.l1_decay
  double value = 0.0;
};

inline constexpr const char* kSparseRuleKeyPrefix = "hyper_parameters.sparse_optimizer.";
inline constexpr std::size_t kSparseRuleFieldCount = 24;  // sparse_rule_fields' (asserted there)

// The rule's fields in a fixed order. Not included: the optimizer class, the widths and the
// storage (the INFO reply carries and the trainer checks those on their own), and the seed (it
// sets the initial values, not how a row steps: INFO carries and the trainer checks it on its own
// too, as a u64, which an f64 field could not hold).
inline std::vector<SparseRuleField> sparse_rule_fields(const AccessorConfig& c) {
  const SparseOptimizerConfig& o = c.optimizer;
  const std::pair<const char*, double> fields[] = {
      {"learning_rate", o.learning_rate},
      {"initial_g2sum", o.initial_g2sum},
      {"initial_range", o.initial_range},
      {"min_bound", o.min_bound},
      {"max_bound", o.max_bound},
      {"weight_decay", o.weight_decay},
      {"l1_decay", o.l1_decay},
      {"mf_learning_rate", o.mf_learning_rate},
      {"mf_initial_g2sum", o.mf_initial_g2sum},
      {"mf_initial_range", o.mf_initial_range},
      {"mf_min_bound", o.mf_min_bound},
      {"mf_max_bound", o.mf_max_bound},
      {"mf_weight_decay", o.mf_weight_decay},
      {"beta1_decay_rate", o.beta1_decay_rate},
      {"beta2_decay_rate", o.beta2_decay_rate},
      {"ada_epsilon", o.ada_epsilon},
      {"nonclk_coeff", c.nonclk_coeff},
      {"clk_coeff", c.clk_coeff},
      {"show_scale", c.show_scale ? 1.0 : 0.0},
      {"embed_threshold", c.embed_threshold},
      {"embedx_threshold", c.embedx_threshold},
      {"show_click_decay_rate", c.show_click_decay_rate},
      {"delete_threshold", c.delete_threshold},
      {"delete_after_unseen_days", c.delete_after_unseen_days}};
  static_assert(sizeof(fields) / sizeof(fields[0]) == kSparseRuleFieldCount,
                "kSparseRuleFieldCount bounds what an INFO reply carries (protocol.hpp)");
  std::vector<SparseRuleField> out;
  out.reserve(std::size(fields));
  for (const auto& [name, value] : fields)
    out.push_back({std::string(kSparseRuleKeyPrefix) + name, value});
  return out;
}

// The hyper_parameters.sparse_optimizer keys that are a rule's own (its class, rates,
// accumulators, moments, thresholds): a PaddleRec config that sets one steps its rows under
// hyper_parameters.sparse_optimizer.*, not under its optimizer (sparse_config_from). Start
// values, bounds, the decays (added to the gradient before any rule: Paddle's regularizers, as
// PaddleRec logistic_regression's `reg`, its L1Decay beside its Adam) and the show/click
// bookkeeping are every rule's: `reg` had switched that folder's rows from its Adam to adagrad.
inline constexpr const char* kSparseRuleOwnKeys[] = {
    "class",         "learning_rate",    "mf_learning_rate", "embedx_threshold", "embed_threshold",
    "initial_g2sum", "mf_initial_g2sum", "beta1_decay_rate", "beta2_decay_rate", "ada_epsilon"};

// The config key that sets rule field `field_key` (a sparse_rule_fields key) of rows whose rule is
// a PaddleRec config's optimizer (AccessorConfig::rule_from_paddlerec_optimizer):
// hyper_parameters.optimizer.learning_rate (both learning rates), beta1, beta2 or epsilon for the
// fields taken from it; "" for the other fields of a rule's own (no key sets them under that rule:
// setting one leaves it, embedx_threshold is 0); else `field_key`.
inline std::string paddlerec_rule_key(const std::string& field_key) {
  const std::pair<const char*, const char*> taken[] = {{"learning_rate", "learning_rate"},
                                                       {"mf_learning_rate", "learning_rate"},
                                                       {"beta1_decay_rate", "beta1"},
                                                       {"beta2_decay_rate", "beta2"},
                                                       {"ada_epsilon", "epsilon"}};
  for (const auto& [field, key] : taken) {
    if (field_key == kSparseRuleKeyPrefix + std::string(field)) {
      return std::string("hyper_parameters.optimizer.") + key;
    }
  }
  for (const char* own : kSparseRuleOwnKeys) {
    if (field_key == kSparseRuleKeyPrefix + std::string(own)) return "";
  }
  return field_key;
}

}  // namespace gpubox::table
