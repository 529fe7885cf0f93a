#include "common/config/network_shape.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>
#include <vector>

#include "common/config/config_document.hpp"
#include "common/config/row_width.hpp"

namespace gpubox::config {
namespace {

// PaddleRec's models/rank folder names GPUBox builds the network of.
struct Known {
  const char* folder;
  ModelKind model;
};
constexpr Known kBuilt[] = {
    {"dnn", ModelKind::kDnn},
    {"slot_dnn", ModelKind::kDnn},  // the dnn over PaddleRec's slot data
    {"wide_deep", ModelKind::kWideDeep},
    {"deepfm", ModelKind::kDeepFm},
    {"dcn_v2", ModelKind::kDcnV2},
    {"logistic_regression", ModelKind::kWide},
    {"fm", ModelKind::kFm},
    {"dcn", ModelKind::kDcn},
    {"dlrm", ModelKind::kDlrm},
    {"xdeepfm", ModelKind::kXdeepfm},
    {"ffm", ModelKind::kFfm},
    {"deepfefm", ModelKind::kDeepFefm},
    {"autoint", ModelKind::kAutoint},
    {"flen", ModelKind::kFlen},
    {"fat_deepffm", ModelKind::kFatDeepffm},
};

// PaddleRec's net.py embedding initialisers (init_value_ 0.1 where the std is over sqrt(dim)).
// Applied only where a measurement against Paddle asked for it (docs/bench/h158.md).
constexpr const char* kTruncated = "TruncatedNormal(0, 0.1 / sqrt(sparse_feature_dim))";
constexpr const char* kAboveAtOwnRanges =
    "at GPUBox's ranges its held-out AUC is above Paddle's (BENCHMARKS.md, issue 32)";
constexpr const char* kNotMeasured =
    "not measured against Paddle at that start; GPUBox's ranges kept";
constexpr const char* kOtherForm = "another form than a std over sqrt(dim); GPUBox's ranges kept";
constexpr PaddleRecEmbeddingInit kEmbeddingInits[] = {
    {"dcn_v2", kTruncated, 0.1, true,
     "at GPUBox's ranges its held-out AUC after epoch 2 was 0.0065 under Paddle's, at this start "
     "0.0013 under (means of 3 seeds, docs/bench/h158.md)",
     false},
    {"dcn", kTruncated, 0.1, false, kAboveAtOwnRanges, true},
    {"deepfm", kTruncated, 0.1, false, kAboveAtOwnRanges, true},
    {"fm", kTruncated, 0.1, false, kAboveAtOwnRanges, true},
    {"xdeepfm", kTruncated, 0.1, false, kAboveAtOwnRanges, true},
    {"ffm", kTruncated, 0.1, false, kNotMeasured, true},
    {"deepfefm", kTruncated, 0.1, false,
     "at its std GPUBox's held-out AUC was 0.01-0.05 lower after epoch 1 and 0.0003-0.03 lower "
     "after epoch 2 (3 seeds, 10,000 and 20,000 lines, docs/bench/h164.md); at GPUBox's ranges "
     "it is above Paddle's at equal steps",
     true},
    {"fat_deepffm", "TruncatedNormal(0, 0.1 / sqrt(feature_dim))", 0.1, false, kNotMeasured, false},
    {"dnn", "Uniform(-1, 1)", 0.0, false, kOtherForm, true},
    {"slot_dnn", "Normal(0, per-slot scales)", 0.0, false, kOtherForm, true},
    {"wide_deep", "Uniform(-1, 1)", 0.0, false, kOtherForm, true},
    {"logistic_regression", "TruncatedNormal(0, init_value)", 0.0, false, kOtherForm, true},
    {"dlrm", "TruncatedNormal(0, 1)", 0.0, false, kOtherForm, true},
    {"autoint", "Normal(0, 0.01)", 0.0, false, kOtherForm, true},
    {"flen", "XavierUniform", 0.0, false, kOtherForm, false},
};

// "<name>" when `path`'s components hold models/rank/<name>.
std::optional<std::string> rank_folder(const std::string& path) {
  std::vector<std::string> parts;
  for (const auto& part : std::filesystem::path(path).lexically_normal()) {
    parts.push_back(part.string());
  }
  for (std::size_t i = 0; i + 2 < parts.size(); ++i) {
    if (parts[i] == "models" && parts[i + 1] == "rank" && !parts[i + 2].empty()) {
      return parts[i + 2];
    }
  }
  return std::nullopt;
}

// The models/rank folder whose net.py `folder/net.py` is, by its first class (each folder's
// network class, written first: DNNLayer is also a part of dcn_v2's), "" when `folder` has no
// net.py; "net.py's <Class>" for a class of no folder GPUBox builds (refused by its name). A model
// folder copied out of PaddleRec's checkout trained the default dnn, its keys and reader unread.
std::string net_py_folder(const std::filesystem::path& folder, std::string* first_class) {
  std::ifstream in(folder / "net.py");
  if (!in) return "";
  static const std::pair<const char*, const char*> kClasses[] = {
      {"DNNLayer", "dnn"},
      {"StaticDNNLayer", "dnn"},
      {"WideDeepLayer", "wide_deep"},
      {"DeepFMLayer", "deepfm"},
      {"DCN_V2Layer", "dcn_v2"},
      {"LRLayer", "logistic_regression"},
      {"FMLayer", "fm"},
      {"DeepCroLayer", "dcn"},
      {"DLRMLayer", "dlrm"},
      {"xDeepFMLayer", "xdeepfm"},
      {"FFMLayer", "ffm"},
      {"DeepFEFMLayer", "deepfefm"},
      {"InteractingLayer", "autoint"},
      {"FLENLayer", "flen"},
      {"FAT_DeepFFMLayer", "fat_deepffm"},
      {"BenchmarkDNNLayer", "slot_dnn"}};
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("class ", 0) != 0) continue;
    const std::size_t end = line.find_first_of("(: ", 6);
    *first_class = line.substr(6, end == std::string::npos ? std::string::npos : end - 6);
    for (const auto& [name, rank_folder] : kClasses) {
      if (*first_class == name) return rank_folder;
    }
    return "net.py's " + *first_class;
  }
  return "";
}

// "<family>/<name>" when `path`'s components hold models/<family>/<name> for a PaddleRec family
// other than rank (multitask, match, recall, ...): none of their networks is built here. With
// `in_checkout`, only where that models/ folder also holds rank/ (a PaddleRec checkout: a user's
// own models/demo/v1 is not PaddleRec's).
std::optional<std::string> other_family_folder(const std::string& path, bool in_checkout) {
  std::vector<std::string> parts;
  for (const auto& part : std::filesystem::path(path).lexically_normal()) {
    parts.push_back(part.string());
  }
  static const char* const kFamilies[] = {"multitask", "match",     "recall",
                                          "rerank",    "treebased", "contentunderstanding",
                                          "demo",      "multiview", "retrieval"};
  std::filesystem::path models;
  for (std::size_t i = 0; i + 2 < parts.size(); ++i) {
    models /= parts[i];
    if (parts[i] != "models" || parts[i + 2].empty()) continue;
    std::error_code ec;
    if (in_checkout && !std::filesystem::is_directory(models / "rank", ec)) continue;
    for (const char* family : kFamilies) {
      if (parts[i + 1] == family) return parts[i + 1] + "/" + parts[i + 2];
    }
  }
  return std::nullopt;
}

// PaddleRec 1.x's dotted workspace (paddlerec.models.rank.dnn) as the folder it names.
std::string workspace_path(const std::string& workspace) {
  const std::string dotted = "paddlerec.models.";
  if (workspace.rfind(dotted, 0) != 0 || workspace.find('/') != std::string::npos) {
    return workspace;
  }
  std::string path = workspace.substr(std::string("paddlerec.").size());
  std::replace(path.begin(), path.end(), '.', '/');
  return path;
}

// The path a document's folder is looked for in: its file, else its source name (a config parsed
// from text, "<config>", sits in no folder).
std::string config_path_of(const ConfigDocument& doc) {
  return doc.file_path().empty() ? doc.source() : doc.file_path();
}

}  // namespace

bool paddlerec_folder_has_lazy_adam(const std::string& folder) {
  const PaddleRecEmbeddingInit* init = paddlerec_embedding_init(folder);
  return init == nullptr || init->lazy_adam;
}

const PaddleRecEmbeddingInit* paddlerec_embedding_init(const std::string& folder) {
  for (const PaddleRecEmbeddingInit& init : kEmbeddingInits) {
    if (folder == init.folder) return &init;
  }
  return nullptr;
}

std::optional<std::string> paddlerec_model_name(const std::string& workspace,
                                                const std::string& config_path,
                                                std::string* source) {
  if (auto name = rank_folder(workspace_path(workspace) + "/")) {
    *source = "workspace " + workspace;
    return name;
  }
  const std::string folder = std::filesystem::path(config_path).parent_path().string();
  if (folder.empty()) return std::nullopt;
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(folder, ec);
  if (ec) return std::nullopt;
  if (auto name = rank_folder(absolute.string() + "/")) {
    *source = "the config's folder " + folder;
    return name;
  }
  // A link to a model folder (or a folder holding a link to one's config).
  const std::filesystem::path real = std::filesystem::canonical(config_path, ec);
  if (!ec) {
    if (auto name = rank_folder(real.parent_path().string() + "/")) {
      *source = "the config's folder " + folder + " (" + real.parent_path().string() + ")";
      return name;
    }
  }
  std::string first_class;
  const std::string copied = net_py_folder(absolute, &first_class);
  if (copied.empty()) return std::nullopt;
  *source = "the config's folder " + folder + " (its net.py's first class " + first_class + ")";
  return copied;
}

std::string paddlerec_model_name(const ConfigDocument& doc) {
  std::string source;
  return paddlerec_model_name(doc.get_string("workspace"), config_path_of(doc), &source)
      .value_or("");
}

DlrmOutput resolve_dlrm_output(const ConfigDocument& doc) {
  const DlrmOutput output = doc.get_enum("hyper_parameters.dlrm_output", kDlrmOutputNames);
  if (doc.is_set("hyper_parameters.dlrm_output")) return output;
  // PaddleRec's dlrm folder only, which also turns dnn_batch_norm on: elsewhere top_layer_sizes'
  // last 2 keeps its meaning before the key (one logit), as a 2-wide ReLU output without the norm
  // can die whole (both outputs 0: logloss ln 2, AUC 0.5, for good).
  const StatusOr<NetworkChoice> network = resolve_network(doc);
  const bool dlrm = network.ok() && network->model == ModelKind::kDlrm;
  return dlrm && paddlerec_model_name(doc) == "dlrm" &&
                 doc.output_layer_width("hyper_parameters.top_layer_sizes") == 2
             ? DlrmOutput::kSoftmax2
             : DlrmOutput::kLogit;
}

bool paddlerec_dlrm_network(const ConfigDocument& doc) {
  const DlrmOutput output = resolve_dlrm_output(doc);  // read whether or not it decides
  return paddlerec_model_name(doc) == "dlrm" && output == DlrmOutput::kSoftmax2;
}

DenseOptimizerKind resolve_dense_optimizer(const ConfigDocument& doc) {
  const DenseOptimizerKind named =
      doc.get_enum("hyper_parameters.optimizer.class", kDenseOptimizerKindNames);
  return paddlerec_dlrm_network(doc) ? DenseOptimizerKind::kAdam : named;
}

std::string dense_optimizer_note(const ConfigDocument& doc) {
  const char* const kDenseClass = "hyper_parameters.optimizer.class";
  const DenseOptimizerKind named = doc.get_enum(kDenseClass, kDenseOptimizerKindNames);
  if (paddlerec_model_name(doc) != "dlrm" || named == DenseOptimizerKind::kAdam) return "";
  const std::string written =
      std::string(kDenseClass) + ": " + name_of(kDenseOptimizerKindNames, named);
  const std::string rate = doc.value_text("hyper_parameters.optimizer.learning_rate");
  const std::string paddlerec =
      "PaddleRec's dlrm network steps every parameter, its embedding tables too, with Adam at "
      "hyper_parameters.optimizer.learning_rate (" +
      rate + ") whatever class says (its static_model.py and dygraph_model.py read no class)";
  if (paddlerec_dlrm_network(doc)) {
    const char* const chosen = doc.is_set("hyper_parameters.dlrm_output")
                                   ? "as the config sets it"
                                   : "this folder's default for top_layer_sizes' last 2";
    return written + " has no effect here: " + paddlerec +
           ", and so does GPUBox with PaddleRec's output layer (hyper_parameters.dlrm_output "
           "softmax2, " +
           chosen + "): Adam at " + rate +
           " for the dense net (the embedding rows: the line on their rule; on this folder's "
           "sample, batches of 2: training logloss 1.00-1.06 times the constant predictor's, "
           "Paddle's 1.2: BENCHMARKS.md); -o hyper_parameters.dlrm_output=logit trains GPUBox's "
           "one-logit dlrm, which follows class";
  }
  return written + " as written, though " + paddlerec +
         ": GPUBox's dlrm with one linear logit (hyper_parameters.dlrm_output logit) diverges "
         "under Adam at 0.1 on this folder's batches of 2; -o hyper_parameters.dlrm_output="
         "softmax2 trains PaddleRec's output layer under the network's Adam";
}

StatusOr<NetworkChoice> network_from_paddlerec_folder(const std::string& workspace,
                                                      const std::string& config_path) {
  NetworkChoice choice;
  std::string from;
  const std::optional<std::string> name = paddlerec_model_name(workspace, config_path, &from);
  if (!name) {
    // A model folder of another PaddleRec family (its config copied in, or named as the
    // workspace) trained the default dnn, exit 0.
    std::string folder = std::filesystem::path(config_path).parent_path().string();
    std::error_code ec;
    if (!folder.empty()) folder = std::filesystem::absolute(folder, ec).string();
    struct Place {
      std::string path;
      std::string what;
      bool in_checkout;  // a workspace is PaddleRec's key: its models/<family> is PaddleRec's
    };
    for (const Place& place : {Place{workspace_path(workspace), "workspace " + workspace, false},
                               Place{folder, "the config's folder " + folder, true}}) {
      const std::string& what = place.what;
      if (auto other = other_family_folder(place.path + "/", place.in_checkout)) {
        return Status::InvalidArgument(
            config_path + ": " + what + " names PaddleRec's network models/" + *other +
            ", which GPUBox does not build (it builds ranking networks, PaddleRec's models/rank); "
            "to train one of those instead, knowingly, set it: -o hyper_parameters.model=dnn");
      }
    }
    choice.source = "the default (no hyper_parameters.model, no PaddleRec model folder)";
    return choice;
  }
  for (const Known& known : kBuilt) {
    if (*name == known.folder) {
      choice.model = known.model;
      choice.source = "PaddleRec's model folder (" + from + ")";
      return choice;
    }
  }
  std::string built;
  for (const auto& [kind, text] : kModelKindNames) {
    built += (built.empty() ? "" : ", ") + std::string(text);
  }
  return Status::InvalidArgument(
      config_path + ": " + from + " names PaddleRec's network '" + *name +
      "', which GPUBox does not build (it builds " + built +
      "); to train one of those instead, knowingly, set it: -o hyper_parameters.model=dnn");
}

StatusOr<NetworkChoice> resolve_network(const ConfigDocument& doc) {
  const ModelKind model = doc.get_enum("hyper_parameters.model", kModelKindNames);
  // Read whether or not it decides: every binary reads the same keys (the key table's parts).
  const std::string workspace = doc.get_string("workspace");
  if (doc.is_set("hyper_parameters.model")) return NetworkChoice{model, "hyper_parameters.model"};
  // No model key (no PaddleRec config has one): the network its model folder names.
  return network_from_paddlerec_folder(workspace, config_path_of(doc));
}

int resolve_dense_dim(const ConfigDocument& doc) {
  const int dense_dim = doc.get_int("hyper_parameters.dense_input_dim");
  if (!doc.is_set("hyper_parameters.dense_input_dim") && paddlerec_model_name(doc) == "slot_dnn") {
    return 0;
  }
  return dense_dim;
}

StatusOr<int64_t> resolve_embedx_width(const ConfigDocument& doc) {
  StatusOr<NetworkChoice> network = resolve_network(doc);
  if (!network.ok()) return network.status();
  // The label is one of sparse_inputs_slots, and no key slot.
  const int64_t sparse_slots =
      std::max(0, doc.get_int<int32_t>("hyper_parameters.sparse_inputs_slots") - 1);
  return row_embedx_width(network->model, doc.get_int("hyper_parameters.sparse_feature_dim") - 1,
                          sparse_slots, resolve_dense_dim(doc));
}

}  // namespace gpubox::config
