// The network a config means. PaddleRec picks the network by the model's folder
// (models/rank/<name>/, its `workspace`) and no PaddleRec config sets hyper_parameters.model, so
// such a config names its network by where it sits. Host-only, no state.
#pragma once

#include <optional>
#include <string>

#include "common/config/config_enums.hpp"
#include "common/status.hpp"

namespace gpubox::trainer {

struct NetworkChoice {
  config::ModelKind model = config::ModelKind::kDnn;
  std::string source;  // where the choice came from, for the start line
};

// The PaddleRec model name of `workspace` (e.g. "models/rank/wide_deep" -> "wide_deep"), else of
// the folder holding `config_path` (".../models/rank/<name>/config.yaml"); nullopt when neither
// is a models/rank/<name> folder.
std::optional<std::string> paddlerec_model_name(const std::string& workspace,
                                                const std::string& config_path,
                                                std::string* source);

// The network for a config without hyper_parameters.model: the one its PaddleRec model folder
// names when GPUBox builds it (dnn, slot_dnn -> dnn, wide_deep, deepfm, dcn_v2,
// logistic_regression -> wide, fm, dcn, dlrm, xdeepfm, ffm, deepfefm, autoint,
// fat_deepffm), the default dnn
// when it names none; InvalidArgument naming the network, what GPUBox builds and the
// -o hyper_parameters.model=... that trains another network knowingly, when it names one GPUBox
// does not build (flen, din, ...).
StatusOr<NetworkChoice> network_from_paddlerec_folder(const std::string& workspace,
                                                      const std::string& config_path);

// Where GPUBox's build of `model` differs from PaddleRec's net of the same name, for the start
// line; "" where it computes what PaddleRec's does.
std::string differences_from_paddlerec(config::ModelKind model);

}  // namespace gpubox::trainer
