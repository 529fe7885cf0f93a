// PaddleRec's `table_parameters:` section (its parameter-server table and accessor: slot_dnn's
// configs) read as GPUBox's sparse-rule keys (paddlerec_tables.cpp). Private to common/config:
// ConfigDocument applies the settings as it applies a PaddleRec spelling of a key.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "common/status.hpp"

namespace gpubox::config::detail {

// A GPUBox key one leaf of table_parameters sets.
struct TableSetting {
  std::string from;  // the leaf: "table_parameters.embedding.accessor.embedx_threshold"
  std::string key;   // "hyper_parameters.sparse_optimizer.embedx_threshold"
  YAML::Node value;  // as the key reads it
  int line = 0;      // of the leaf, 1-based
};

// A leaf accepted with no effect in GPUBox, and why.
struct TableNote {
  std::string from;
  std::string reason;
};

// Every leaf of `section` (the value of `table_parameters:`): its settings and notes, in file
// order. InvalidArgument "<leaf>: ..." (with *error_line its line) for a leaf GPUBox does not
// know, a second table (GPUBox has one sparse table), or a sparse rule GPUBox does not build.
// Two leaves setting one key (embed_sgd_param and embedx_sgd_param naming the rule) are both
// returned: the caller refuses them when they disagree.
Status translate_table_parameters(const YAML::Node& section, std::vector<TableSetting>* settings,
                                  std::vector<TableNote>* notes, int* error_line);

// For docs/config-reference.md: each leaf under `table_parameters.<table>.` ('*': the rule
// block's name) and what it sets ("" for none), or why it has no effect.
struct TableLeafDoc {
  std::string path;
  std::string sets;
  std::string note;
};
std::vector<TableLeafDoc> table_parameter_docs();

}  // namespace gpubox::config::detail
