#include "trainer/config/dnn_dropout.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "common/config/config_document.hpp"
#include "common/config/config_keys.hpp"
#include "common/config/network_shape.hpp"
#include "common/enum_names.hpp"

namespace gpubox::trainer {

namespace {
constexpr const char* kKey = "hyper_parameters.dnn_dropout";
}  // namespace

double paddlerec_dnn_dropout(const std::string& model) {
  // Their DNNLayer's (DNN's) dropout_rate: a Dropout after every Linear and every ReLU (flen's:
  // and every batch norm, and its fwbi_drop at the same 0.2).
  if (model == "dcn_v2" || model == "fat_deepffm") return 0.5;
  if (model == "deepfefm" || model == "flen") return 0.2;
  return 0.0;
}

double folder_dnn_dropout(const config::ConfigDocument& doc) {
  const std::string folder = config::paddlerec_model_name(doc);
  const double p = paddlerec_dnn_dropout(folder);
  if (p == 0.0) return 0.0;
  // The folder's net's rate, for that net only (its folder names the ModelKind).
  const StatusOr<config::NetworkChoice> network = config::resolve_network(doc);
  return network.ok() && name_of(kModelKindNames, network->model) == folder ? p : 0.0;
}

double dnn_dropout_of(const config::ConfigDocument& doc) {
  const double p = doc.get_float(kKey);
  if (doc.is_set(kKey)) return p;
  // Not built with batch norm: the folder's rate gives way (dnn_dropout_note says so).
  return doc.get_bool("hyper_parameters.dnn_batch_norm") ? 0.0 : folder_dnn_dropout(doc);
}

Status check_dnn_dropout(const TrainerConfig& c, const config::ConfigDocument& doc) {
  const double p = c.hyper.dnn_dropout;
  const std::string from = doc.is_set(kKey) ? std::string(kKey) + " is " + config::number_text(p)
                                            : std::string(kKey) + " is not set, and PaddleRec's " +
                                                  config::paddlerec_model_name(doc) +
                                                  " folder's rate is " + config::number_text(p);
  // At most 0.999 (a float, as the rate the net is given): a hidden unit kept with probability
  // (1-p)^2 >= 1e-6, its scale 1/(1-p)^2 <= 1e6. flen's (1-p)^3 must also be at least
  // kMinDropoutKeep (below, the mask's 32-bit threshold misstates it): p at most 0.990.
  if (!(p >= 0.0 && p <= kMaxDnnDropout && static_cast<float>(p) <= 0.999f)) {
    return Status::InvalidArgument(doc.source() + ": " + kKey + " must be in [0, 0.999] (the " +
                                   "probability a Dropout zeroes a unit), got " +
                                   config::number_text(p));
  }
  if (p == 0.0) return Status::OK();
  const ModelKind model = c.hyper.model;
  const bool no_dnn = !config::has_dnn(model, c.hyper.fc_sizes.empty());
  if (no_dnn) {
    return Status::InvalidArgument(doc.source() + ": " + from + ", a dropout after the dnn's " +
                                   "layers, but " + name_of(kModelKindNames, model) +
                                   " has no dnn; set " + kKey + "=0");
  }
  // The keep the net builds, from the float it is given (MlpDropout); no hidden layer, no such
  // mask (the output's and the side layer's keep 1-p >= 0.001).
  const int dropouts = dropouts_per_hidden_unit(model);
  const double keep = dropout_hidden_keep(static_cast<float>(p), dropouts);
  if (!c.hyper.fc_sizes.empty() && keep < kMinDropoutKeep) {
    const double highest =
        std::floor((1.0 - std::pow(kMinDropoutKeep, 1.0 / dropouts)) * 1e4) / 1e4;
    std::ostringstream out;
    out << doc.source() << ": " << from << ", but " << name_of(kModelKindNames, model)
        << "'s net drops a hidden unit " << dropouts << " times: kept with probability (1-p)^"
        << dropouts << " = " << keep << ", below 2^-20, the least the mask's 32-bit threshold "
        << "holds to 1e-3 of its scale 1/keep; " << kKey << " must be at most " << highest
        << " for " << name_of(kModelKindNames, model);
    return Status::InvalidArgument(out.str());
  }
  if (c.hyper.dnn_batch_norm) {
    return Status::InvalidArgument(
        doc.source() + ": " + from + ", which is not built with hyper_parameters.dnn_batch_norm " +
        "(the normalised output is not a ReLU's, whose mask the dropout's backward reuses); set " +
        kKey + "=0 or hyper_parameters.dnn_batch_norm=false");
  }
  return Status::OK();
}

std::string dnn_dropout_text(double p) {
  // As ConfigDocument::value_text writes a float key: the shortest text that reads back as p.
  char text[32];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, p);
    if (std::strtod(text, nullptr) == p) break;
  }
  return text;
}

void record_dnn_dropout(const config::ConfigDocument& doc, TrainerConfig* c) {
  c->model_keys[kKey] = dnn_dropout_text(c->hyper.dnn_dropout);
  if (doc.is_set(kKey) || c->hyper.dnn_dropout == 0.0) return;
  c->derived_model_keys[kKey] = "derived when unset from PaddleRec's " +
                                config::paddlerec_model_name(doc) + " net.py's Dropout rate";
}

std::string dnn_dropout_note(const config::ConfigDocument& doc) {
  const double p = doc.is_set(kKey) ? 0.0 : folder_dnn_dropout(doc);
  if (p == 0.0) return "";
  if (dnn_dropout_of(doc) == 0.0) {
    return std::string(kKey) + ": 0, not PaddleRec's " + config::paddlerec_model_name(doc) +
           " folder's " + config::number_text(p) +
           ": dropout is not built with hyper_parameters.dnn_batch_norm (the normalised output "
           "is not a ReLU's, whose mask the dropout's backward reuses); "
           "-o hyper_parameters.dnn_batch_norm=false trains the folder's dropout";
  }
  // flen's net drops after its DNN's batch norms too (not built) and its bi-interaction's layer.
  const bool flen = config::paddlerec_model_name(doc) == "flen";
  const double keep = flen ? (1.0 - p) * (1.0 - p) * (1.0 - p) : (1.0 - p) * (1.0 - p);
  return std::string(kKey) + ": " + config::number_text(p) + ", PaddleRec's " +
         config::paddlerec_model_name(doc) + " folder's (its net's Dropout after every Linear " +
         (flen ? "and every ReLU and batch norm of the dnn, and after the bi-interaction's layer"
               : "and every ReLU of the dnn") +
         ": a hidden unit kept with probability " + config::number_text(keep) +
         ", in training only); -o " + kKey + "=0 turns it off";
}

}  // namespace gpubox::trainer
