// The network a config trains and the dense features it reads, resolved once for every binary
// that reads the config: gpubox_train (trainer::trainer_config_from), gpubox_server and
// gpubox_data (table::sparse_config_from, dataset::dataset_config_from). A PaddleRec config names
// neither: its model folder (models/rank/<name>/, its `workspace`) picks the network, and
// slot_dnn's readers write no dense features. ffm's rows are as wide as its fields
// (row_width.hpp), so a server that resolved these apart from its trainers would keep rows of
// another width. Host-only, no state.
#pragma once

#include <optional>
#include <string>

#include "common/config/config_enums.hpp"
#include "common/status.hpp"

namespace gpubox::config {

class ConfigDocument;

// Whether `model` builds a dnn (an MLP, fc_sizes) with `fc_sizes_empty` as its fc_sizes: wide, fm
// and ffm never do; autoint only with fc_sizes (PaddleRec's fc_sizes: [] has none).
inline constexpr bool has_dnn(ModelKind model, bool fc_sizes_empty) {
  return model != ModelKind::kWide && model != ModelKind::kFm && model != ModelKind::kFfm &&
         !(model == ModelKind::kAutoint && fc_sizes_empty);
}

struct NetworkChoice {
  ModelKind model = ModelKind::kDnn;
  std::string source;  // where the choice came from, for the start line
};

// The PaddleRec model name of `workspace` (e.g. "models/rank/wide_deep" -> "wide_deep"), else of
// the folder holding `config_path` (".../models/rank/<name>/config.yaml", its links resolved),
// else of that folder's net.py (a model folder copied out of PaddleRec's checkout: named by its
// first class, "net.py's <Class>" for a network of no folder GPUBox builds); nullopt when none
// is.
std::optional<std::string> paddlerec_model_name(const std::string& workspace,
                                                const std::string& config_path,
                                                std::string* source);

// paddlerec_model_name of `doc` (its workspace key, else the file it was read from); "" when
// it sits in no models/rank/<name> folder.
std::string paddlerec_model_name(const ConfigDocument& doc);

// The network for a config without hyper_parameters.model: the one its PaddleRec model folder
// names when GPUBox builds it (dnn, slot_dnn -> dnn, wide_deep, deepfm, dcn_v2,
// logistic_regression -> wide, fm, dcn, dlrm, xdeepfm, ffm, deepfefm, autoint, flen,
// fat_deepffm), the default dnn when it names none; InvalidArgument naming the network, what
// GPUBox builds and the -o hyper_parameters.model=... that trains another network knowingly, when
// it names one GPUBox does not build (din, difm, ...).
StatusOr<NetworkChoice> network_from_paddlerec_folder(const std::string& workspace,
                                                      const std::string& config_path);

// How a PaddleRec network's net.py starts its embedding rows, whether GPUBox's rows start with
// that spread in its folder (table::sparse_config_from, only where they take the folder's Adam),
// and whether the folder's Adam is lazy: data, one entry a folder GPUBox builds.
struct PaddleRecEmbeddingInit {
  const char* folder;
  const char* initialiser;   // net.py's embedding initialiser, in words
  double std_over_sqrt_dim;  // its std is this / sqrt(sparse_feature_dim); 0: another form
  bool applied;              // the folder's rows start uniform with that std (std_over_sqrt_dim)
  const char* why;           // why applied or not (the measurement)
  bool lazy_adam;            // its static_model.py steps with Adam(lazy_mode=True); dcn_v2,
                             // flen, fat_deepffm have only dygraph_model.py's Adam, not lazy
};

// The entry of PaddleRec's models/rank/<folder> (paddlerec_model_name); nullptr for a folder
// GPUBox does not build.
const PaddleRecEmbeddingInit* paddlerec_embedding_init(const std::string& folder);

// Whether PaddleRec's models/rank/<folder> steps its tables with a lazy Adam (lazy_adam; true for
// a folder not in the table, as PaddleRec's static_model.py files do).
bool paddlerec_folder_has_lazy_adam(const std::string& folder);

// hyper_parameters.model when set, else network_from_paddlerec_folder of `doc`. Reads the keys
// hyper_parameters.model and workspace.
StatusOr<NetworkChoice> resolve_network(const ConfigDocument& doc);

// hyper_parameters.dlrm_output as `doc` trains it: the key when set, else softmax2 (PaddleRec's
// two-class output layer) for dlrm (resolve_network) in PaddleRec's dlrm folder
// (paddlerec_model_name) where its top_layer_sizes ends in 2 (ConfigDocument::output_layer_width),
// else logit (elsewhere a last 2 means one logit, as before the key). Reads the key whether or
// not it decides.
DlrmOutput resolve_dlrm_output(const ConfigDocument& doc);

// True when `doc` trains PaddleRec's dlrm network as its folder builds it: a config in PaddleRec's
// dlrm folder whose network is dlrm with PaddleRec's output layer (resolve_dlrm_output softmax2).
bool paddlerec_dlrm_network(const ConfigDocument& doc);

// hyper_parameters.optimizer.class as `doc` trains it: Adam for paddlerec_dlrm_network, as its
// static_model.py and dygraph_model.py step every parameter (the embedding tables too: table::
// sparse_config_from) with paddle.optimizer.Adam at optimizer.learning_rate whatever class says;
// else the key.
DenseOptimizerKind resolve_dense_optimizer(const ConfigDocument& doc);

// gpubox_train's start line for PaddleRec's dlrm folder when hyper_parameters.optimizer.class is
// not Adam (its config.yaml says SGD): its network steps every parameter with Adam at
// optimizer.learning_rate whatever class says. With PaddleRec's output layer the line says class
// has no effect (GPUBox trains that Adam, resolve_dense_optimizer); with dlrm_output logit that
// GPUBox follows the class, why (its one linear logit diverges under Adam at 0.1 on the folder's
// batches of 2) and how to train the net's Adam. "" otherwise.
std::string dense_optimizer_note(const ConfigDocument& doc);

// The dense features an instance holds: hyper_parameters.dense_input_dim, but 0 in slot_dnn's
// folder when the key is not set (its readers write the label, the show and slots only).
int resolve_dense_dim(const ConfigDocument& doc);

// The embedx values of a key's row (row_embedx_width) for the network resolve_network gives:
// sparse_feature_dim - 1, times the fields (sparse slots plus resolve_dense_dim) for ffm.
StatusOr<int64_t> resolve_embedx_width(const ConfigDocument& doc);

}  // namespace gpubox::config
