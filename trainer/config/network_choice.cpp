#include "trainer/config/network_choice.hpp"

#include <filesystem>
#include <vector>

namespace gpubox::trainer {
namespace {

// PaddleRec's models/rank folder names GPUBox builds the network of.
struct Known {
  const char* folder;
  config::ModelKind model;
};
constexpr Known kBuilt[] = {
    {"dnn", config::ModelKind::kDnn},
    {"slot_dnn", config::ModelKind::kDnn},  // the dnn over PaddleRec's slot data
    {"wide_deep", config::ModelKind::kWideDeep},
    {"deepfm", config::ModelKind::kDeepFm},
    {"dcn_v2", config::ModelKind::kDcnV2},
    {"logistic_regression", config::ModelKind::kWide},
    {"fm", config::ModelKind::kFm},
    {"dcn", config::ModelKind::kDcn},
    {"dlrm", config::ModelKind::kDlrm},
    {"xdeepfm", config::ModelKind::kXdeepfm},
    {"ffm", config::ModelKind::kFfm},
    {"deepfefm", config::ModelKind::kDeepFefm},
    {"autoint", config::ModelKind::kAutoint},
    {"fat_deepffm", config::ModelKind::kFatDeepffm},
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

}  // namespace

std::optional<std::string> paddlerec_model_name(const std::string& workspace,
                                                const std::string& config_path,
                                                std::string* source) {
  if (auto name = rank_folder(workspace + "/")) {
    *source = "workspace " + workspace;
    return name;
  }
  // A config parsed from text ("<config>") sits in no folder.
  const std::string folder = std::filesystem::path(config_path).parent_path().string();
  if (folder.empty()) return std::nullopt;
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(folder, ec);
  if (ec) return std::nullopt;
  if (auto name = rank_folder(absolute.string() + "/")) {
    *source = "the config's folder " + folder;
    return name;
  }
  return std::nullopt;
}

std::string differences_from_paddlerec(config::ModelKind model) {
  switch (model) {
    case config::ModelKind::kDeepFefm:
      return "a dense feature's field vector is its value times a learned vector (PaddleRec's net "
             "looks up a key quantised from the value); the dense features' first-order weights "
             "start at 0 (PaddleRec's at a truncated normal); no dropout, no L2 decay";
    case config::ModelKind::kAutoint:
      return "a dense field's index and a sparse field's value are not read (PaddleRec's sample "
             "has 0 and 1 only); its dnn (fc_sizes) has no batch norm and a ReLU after every "
             "layer, where PaddleRec's has batch norm and no ReLU after the first";
    case config::ModelKind::kFatDeepffm:
      return "a field's factor has sparse_feature_dim - 1 values (PaddleRec's sparse_feature_dim, "
             "ffm's rows); no dropout (PaddleRec's 0.5 after every DNN layer, the output's too), "
             "no L2 decay; CEN's and the DNN's weights start at N(0, 1/fan_in) (PaddleRec's CEN: "
             "Paddle's default), the embeddings by the sparse rule; the DNN's output bias stands "
             "for PaddleRec's separate bias";
    default:
      return "";
  }
}

StatusOr<NetworkChoice> network_from_paddlerec_folder(const std::string& workspace,
                                                      const std::string& config_path) {
  NetworkChoice choice;
  std::string from;
  const std::optional<std::string> name = paddlerec_model_name(workspace, config_path, &from);
  if (!name) {
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
  for (const auto& [kind, text] : config::kModelKindNames) {
    built += (built.empty() ? "" : ", ") + std::string(text);
  }
  return Status::InvalidArgument(
      config_path + ": " + from + " names PaddleRec's network '" + *name +
      "', which GPUBox does not build (it builds " + built +
      "); to train one of those instead, knowingly, set it: -o hyper_parameters.model=dnn");
}

}  // namespace gpubox::trainer
