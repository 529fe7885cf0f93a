#include "dataset/paddlerec_readers.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "common/config/config_document.hpp"
#include "common/config/network_shape.hpp"

namespace gpubox::dataset {
namespace {

using config::DenseTransform;

// A reader of PaddleRec's models/rank (read in its public repository) and what it does to dense
// values. `module` "*": every reader of the folder.
struct KnownReader {
  const char* model;
  const char* module;
  DenseTransform dense;
  bool criteo_minmax;  // scales raw Criteo TSV's integers by min-max (GPUBox's criteo format)
};
constexpr KnownReader kReaders[] = {
    // np.log(float(x) + 1), then astype("float32").
    {"dcn_v2", "reader", DenseTransform::kLog1p, false},
    // max(0.0, min(1.0, float(x))).
    {"deepfefm", "criteo_reader", DenseTransform::kClip01, false},
    // (float(x) - cont_min_[i]) / cont_diff_[i] on Criteo TSV, "" -> 0 (GPUBox's kCriteoMin,
    // kCriteoDiff); they read nothing else.
    {"dnn", "benchmark_reader", DenseTransform::kNone, true},
    {"deepfm", "benchmark_reader", DenseTransform::kNone, true},
    {"wide_deep", "benchmark_reader", DenseTransform::kNone, true},
    {"wide_deep", "benchmark_reader_lineid", DenseTransform::kNone, true},
    // float(x) as written.
    {"dnn", "criteo_reader", DenseTransform::kNone, false},
    {"dnn", "queuedataset_reader", DenseTransform::kNone, false},
    {"wide_deep", "criteo_reader", DenseTransform::kNone, false},
    {"wide_deep", "queuedataset_reader", DenseTransform::kNone, false},
    {"deepfm", "criteo_reader", DenseTransform::kNone, false},
    {"dcn", "reader", DenseTransform::kNone, false},
    {"fm", "criteo_reader", DenseTransform::kNone, false},
    {"ffm", "criteo_reader", DenseTransform::kNone, false},
    {"xdeepfm", "criteo_reader", DenseTransform::kNone, false},
    {"fat_deepffm", "criteo_reader", DenseTransform::kNone, false},
    {"dlrm", "criteo_reader", DenseTransform::kNone, false},
    {"autoint", "criteo_reader", DenseTransform::kNone, false},
    {"flen", "avazu_reader", DenseTransform::kNone, false},  // integers only, no dense
    {"logistic_regression", "criteo_lr_reader", DenseTransform::kNone, false},
    // No dense features: the label, the show field and slots only.
    {"slot_dnn", "*", DenseTransform::kNone, false},
};

// "reader" from "reader", "models/rank/dcn_v2/reader" or "reader.py".
std::string module_name(std::string path) {
  path = std::filesystem::path(path).filename().string();
  if (path.size() > 3 && path.compare(path.size() - 3, 3, ".py") == 0) path.resize(path.size() - 3);
  return path;
}

const KnownReader* find_reader(const std::string& model, const std::string& module) {
  for (const KnownReader& r : kReaders) {
    if (model == r.model && (module == r.module || std::string(r.module) == "*")) return &r;
  }
  return nullptr;
}

void apply_slot_dnn(const config::ConfigDocument& doc, ReaderProfile* p) {
  if (!doc.is_set("runner.label_name")) p->label_name = "1";
  if (!doc.is_set("runner.multislot_order")) {
    // inmemorydataset_reader.py writes the instance id first (parse_ins_id), then the show.
    const std::string piped = doc.get_string("runner.pipe_command");
    if (piped.find("inmemorydataset_reader") != std::string::npos) {
      p->multislot_order.push_back("ins_id");
    }
    p->multislot_order.push_back("0");
    for (int s = 1; s <= kSlotDnnReaderSlots + 1; ++s)
      p->multislot_order.push_back(std::to_string(s));
  }
  p->notes.push_back(
      "reader: PaddleRec's slot_dnn (models/rank/" + p->model + "): the label is slot \"1\"" +
      (p->label_name.empty() ? " unless runner.label_name says otherwise" : "") +
      ", the sparse slots \"2\" on, no dense features" +
      (doc.is_set("hyper_parameters.dense_input_dim")
           ? " (but hyper_parameters.dense_input_dim is set)"
           : "") +
      "; its readers' MultiSlot output (runner.pipe_command) is read as fields \"0\" "
      "(the show, always 1: every instance counts one show), \"1\" .. \"" +
      std::to_string(kSlotDnnReaderSlots + 1) + "\"");
}

std::string reader_text(const ReaderProfile& p) {
  return "models/rank/" + p.model + "'s " + p.reader + ".py (runner.train_reader_path)";
}

// The dense transform and its note when GPUBox reads the files in the named reader's place.
void apply_reader(const config::ConfigDocument& doc, ReaderProfile* p) {
  const DenseTransform asked = doc.get_enum("runner.dense_transform", config::kDenseTransformNames);
  const KnownReader* known = find_reader(p->model, p->reader);
  const bool piped = !doc.get_string("runner.pipe_command").empty();
  if (asked != DenseTransform::kAuto) {
    p->dense = asked;
    if (piped && asked != DenseTransform::kNone) {
      p->notes.push_back(std::string("runner.dense_transform: ") +
                         name_of(config::kDenseTransformNames, asked) + " applies " +
                         describe(asked) +
                         " to what runner.pipe_command writes: if that command runs a reader "
                         "that applies it already" +
                         (known != nullptr ? " (as " + reader_text(*p) + " does)" : "") +
                         ", it is applied twice (set runner.dense_transform: none)");
    } else if (known != nullptr && !piped && known->dense != asked) {
      p->notes.push_back("reader: " + reader_text(*p) + " applies " + describe(known->dense) +
                         " to the dense features; runner.dense_transform: " +
                         std::string(name_of(config::kDenseTransformNames, asked)) + " applies " +
                         describe(asked) + " instead");
    }
    return;
  }
  if (piped || p->reader.empty()) return;  // the reader runs, or none is named
  if (known == nullptr) {
    if (p->model.empty()) return;  // not a PaddleRec model folder: its readers are not known
    p->notes.push_back(
        "reader: " + reader_text(*p) +
        " is not a reader GPUBox knows: whatever it does to the dense features is not "
        "applied (they are read as written; runner.dense_transform sets log1p or clip01)");
    return;
  }
  p->dense = known->dense;
  if (known->dense != DenseTransform::kNone) {
    p->notes.push_back("reader: " + reader_text(*p) + " applies " + describe(known->dense) +
                       " to the dense features: GPUBox reads the files itself and applies it too "
                       "to slot and multislot data (runner.dense_transform: auto; none reads them "
                       "as written)");
  } else if (known->criteo_minmax) {
    const bool minmax = doc.get_enum("runner.criteo_dense", config::kCriteoDenseNames) ==
                        config::CriteoDense::kMinMax;
    p->notes.push_back(
        "reader: " + reader_text(*p) +
        " scales raw Criteo TSV's integer features by min-max with its constants: " +
        (minmax ? std::string("GPUBox's criteo format applies the same (runner.criteo_dense: "
                              "minmax); slot text is read as written")
                : std::string("not applied, runner.criteo_dense is ") +
                      std::string(name_of(
                          config::kCriteoDenseNames,
                          doc.get_enum("runner.criteo_dense", config::kCriteoDenseNames)))));
  }
}

}  // namespace

ReaderProfile paddlerec_reader_profile(const config::ConfigDocument& doc) {
  ReaderProfile p;
  p.model = config::paddlerec_model_name(doc);
  const std::string& path = doc.get_string("runner.train_reader_path");
  if (!path.empty()) p.reader = module_name(path);
  if (p.model == "slot_dnn") apply_slot_dnn(doc, &p);
  if (p.model == "flen" && p.reader == "avazu_reader" &&
      doc.get_string("runner.pipe_command").empty()) {
    p.avazu = true;
    p.notes.push_back(
        "reader: " + reader_text(p) +
        " reads comma-separated integers (an id, one index per field, the label last): GPUBox "
        "reads them as runner.data_format avazu, hyper_parameters.sparse_inputs_slots slots (its "
        "net's field count, the label not among them), the id not read (flen's net reads it "
        "not), one key per index shared by every slot (its one embedding table)");
  }
  apply_reader(doc, &p);
  return p;
}

double dense_transform(double x, DenseTransform transform) {
  switch (transform) {
    case DenseTransform::kLog1p:
      return std::log(x + 1.0);  // np.log(x + 1), not log1p: the same rounding as the reader
    case DenseTransform::kClip01:
      return std::max(0.0, std::min(1.0, x));
    case DenseTransform::kAuto:
    case DenseTransform::kNone:
      break;
  }
  return x;
}

bool transformed_dense(double x, DenseTransform transform, float* out) {
  *out = static_cast<float>(dense_transform(x, transform));
  return std::isfinite(*out);
}

const char* describe(DenseTransform transform) {
  switch (transform) {
    case DenseTransform::kLog1p:
      return "log(x + 1)";
    case DenseTransform::kClip01:
      return "clip to [0, 1]";
    case DenseTransform::kAuto:
    case DenseTransform::kNone:
      break;
  }
  return "nothing";
}

}  // namespace gpubox::dataset
