// Loads a TrainerConfig from PaddleRec-style YAML (config_gpubox.yaml) plus `-o key=value`
// overrides. Every key is known: an unknown key, a wrong type or a value out of range is an
// error naming the file, the key and (for unknown keys) the closest valid key.
#pragma once

#include <string>
#include <vector>

#include "common/status.hpp"
#include "trainer/config/trainer_config.hpp"

namespace gpubox::trainer {

// Reads `path`, applies `overrides` ("runner.epochs=3", "hyper_parameters.fc_sizes=[64, 32]") in
// order, resolves relative paths (see RunnerConfig) and validates. Thread-safe.
StatusOr<TrainerConfig> load_trainer_config(const std::string& path,
                                            const std::vector<std::string>& overrides = {});

// The same from YAML text; relative paths in it resolve against `base_dir`.
StatusOr<TrainerConfig> parse_trainer_config(const std::string& yaml_text,
                                             const std::string& base_dir,
                                             const std::vector<std::string>& overrides = {},
                                             const std::string& source_name = "<config>");

// Every valid dotted key, sorted (for help texts and suggestions).
std::vector<std::string> trainer_config_keys();

// Levenshtein distance (the suggestion metric).
std::size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace gpubox::trainer
