// The network a config means. PaddleRec picks the network by the model's folder
// (models/rank/<name>/, its `workspace`) and no PaddleRec config sets hyper_parameters.model, so
// such a config names its network by where it sits (config::resolve_network, which every binary
// shares), and what GPUBox's build of it computes differently. Host-only, no state.
#pragma once

#include <string>

#include "common/config/config_enums.hpp"
#include "common/config/network_shape.hpp"

namespace gpubox::trainer {

// The network's resolution is config::'s (common/config/network_shape.hpp), shared with
// gpubox_server's row width; these names stay the trainer's too.
using config::network_from_paddlerec_folder;
using config::NetworkChoice;
using config::paddlerec_model_name;

// Where GPUBox's build of `model` differs from PaddleRec's net of the same name, for the start
// line; "" where it computes what PaddleRec's does. Its dropout clause says what `dnn_dropout`
// (hyper_parameters.dnn_dropout as trained) draws, or at 0 that none is drawn.
std::string differences_from_paddlerec(config::ModelKind model, double dnn_dropout);

}  // namespace gpubox::trainer
