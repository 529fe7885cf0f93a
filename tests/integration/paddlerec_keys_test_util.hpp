// Shared helpers of the PaddleRec key tests (paddlerec_keys_test.cpp, paddlerec_networks_test.cpp,
// paddlerec_dcn_test.cpp: one binary, paddlerec_keys_test): a YAML text parsed as gpubox_train
// parses its config file, and the message it is refused with.
#pragma once

#include <string>
#include <vector>

#include "common/status.hpp"
#include "trainer/config/config_loader.hpp"

namespace gpubox::trainer::paddlerec_test {

// `yaml` as the file /base/p.yaml, with `o`'s overrides.
inline StatusOr<TrainerConfig> parse(const std::string& yaml,
                                     const std::vector<std::string>& o = {}) {
  return parse_trainer_config(yaml, "/base", o, "p.yaml");
}

// The message `yaml` is refused with, or "(loaded)".
inline std::string error_of(const std::string& yaml, const std::vector<std::string>& o = {}) {
  const StatusOr<TrainerConfig> c = parse(yaml, o);
  return c.ok() ? "(loaded)" : c.status().message();
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace gpubox::trainer::paddlerec_test
