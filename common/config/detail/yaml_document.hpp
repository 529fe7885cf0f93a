// A config file's YAML as the one document it must be (yaml_document.cpp). Private to
// common/config.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

#include "common/status.hpp"

namespace gpubox::config::detail {

// The single document of `yaml_text` (a null node when the text holds none). Refused, naming
// `source` and a line: a YAML syntax error; a second document (after `---`), whose keys would
// otherwise silently not apply; text the YAML parser cannot read past. The last is a guard:
// yaml-cpp 0.7's LoadAll never returns on some malformed text (",a" at a document's start gives
// an empty document again and again without consuming it), and its Load reads such text as an
// empty config.
StatusOr<YAML::Node> read_one_document(const std::string& yaml_text, const std::string& source);

}  // namespace gpubox::config::detail
