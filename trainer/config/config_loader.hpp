// gpubox_train's config loader: config::ConfigDocument (the file, `-o key=value` overrides, the
// key table's checks and defaults; common/config/config_document.hpp), then each part fills
// its own piece of the TrainerConfig: the trainer's keys here, the dataset part with
// dataset::dataset_config_from, the table part with table::sparse_config_from. gpubox_data and
// gpubox_server use the same document and the same part functions, so the three binaries
// accept the same keys with the same defaults and errors.
#pragma once

#include <string>
#include <vector>

#include "common/status.hpp"
#include "trainer/config/trainer_config.hpp"

namespace gpubox {
namespace config {
class ConfigDocument;
}
namespace trainer {

// Every part of a TrainerConfig from `doc`; errors (the dataset part's checks) name the key.
StatusOr<TrainerConfig> trainer_config_from(const config::ConfigDocument& doc);

// gpubox_train's start line when PaddleRec's dlrm folder's default (not the config) turned
// hyper_parameters.dnn_batch_norm on; "" otherwise.
std::string dnn_batch_norm_note(const config::ConfigDocument& doc);

// gpubox_train's start line when PaddleRec's dlrm folder's top_layer_sizes (its last entry 2), not
// the config, chose hyper_parameters.dlrm_output softmax2, saying whether its output is
// batch-normalised (hyper_parameters.dnn_batch_norm as trained); "" otherwise.
std::string dlrm_output_note(const config::ConfigDocument& doc);

// gpubox_train's start warning when dlrm trains the two-class output (dlrm_output softmax2)
// without dnn_batch_norm: both ReLU'd outputs can die for good; "" otherwise. Warned, not
// refused: it trains while they live (how long depends on the rate and the data), and comparing
// the output layer with and without the norm is a fair experiment.
std::string dlrm_output_warning(const TrainerConfig& c);

// Reads `path`, applies `overrides` ("runner.epochs=3", "hyper_parameters.fc_sizes=[64, 32]")
// in order and fills every part. Thread-safe.
StatusOr<TrainerConfig> load_trainer_config(const std::string& path,
                                            const std::vector<std::string>& overrides = {});

// The same from YAML text; relative paths in it resolve against `base_dir`.
StatusOr<TrainerConfig> parse_trainer_config(const std::string& yaml_text,
                                             const std::string& base_dir,
                                             const std::vector<std::string>& overrides = {},
                                             const std::string& source_name = "<config>");

}  // namespace trainer
}  // namespace gpubox
