// The typed reading of one YAML value for one key (parse_value.cpp: used by config_document.cpp,
// parse_value_text and the table's own defaults in config_keys.cpp). Private to common/config.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

#include "common/config/config_keys.hpp"
#include "common/status.hpp"

namespace gpubox::config::detail {

// Reads `node` as `key` says (type, range, choices). Relative paths resolve against `base_dir`
// (left as they are when it is empty). Errors are InvalidArgument "<key>: expected ..., got ...".
Status parse_value(const KeySpec& key, const YAML::Node& node, const std::string& base_dir,
                   ConfigValue* out);

// A switch as YAML users write it: true/false (YAML's spellings), or 1/0 as PaddleRec's configs
// write some (`use_gpu: 0`; its Python reads them as truth values). False when it is neither.
bool decode_bool(const YAML::Node& node, bool* out);

// A node as errors show it: "null", "'text'", "a list", "a map".
std::string describe(const YAML::Node& node);

}  // namespace gpubox::config::detail
