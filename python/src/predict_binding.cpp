// gpubox._core.ServingModel: what gpubox_serve loads and how it predicts (serving/), for
// NumPy arrays and slot text: instances -> dataset::assemble_batch -> serving::Predictor, the
// code path of gpubox_serve's micro-batches. export_save is gpubox_train --mode export.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>

#include "bindings.hpp"
#include "common/config/config_enums.hpp"
#include "common/enum_names.hpp"
#include "common/error_report.hpp"
#include "common/thread_annotations.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "dataset/paddlerec_readers.hpp"
#include "serving/predictor.hpp"
#include "serving/request_parser.hpp"
#include "serving/serving_model.hpp"

namespace py = pybind11;

namespace gpubox::python {
namespace {

constexpr std::size_t kChunk = 4096;  // instances per Predictor::predict call

// A loaded export and its predictor (the predictor holds a reference: neither moves).
// Thread-safety: predict and predict_text run one at a time (predict_mu_): the GIL is released
// while they compute, and the Predictor's buffers serve one batch at a time.
class LoadedModel {
 public:
  // `precision`: the dense net's, fp32 or bf16 (gpubox_serve's --precision); None: the one the
  // export records.
  LoadedModel(const std::string& dir, int card_threads,
              const std::optional<std::string>& precision) {
    std::optional<config::DensePrecision> asked;
    if (precision.has_value()) {
      auto parsed = parse_enum(config::kDensePrecisionNames, *precision);
      if (!parsed.ok()) raise(errors().config_error, "precision: " + parsed.status().message());
      asked = *parsed;
    }
    auto model = serving::ServingModel::load(dir);
    if (!model.ok()) raise(errors().engine_error, model.status().to_string());
    model_ = std::make_unique<serving::ServingModel>(std::move(model.value()));
    auto predictor = std::make_unique<serving::Predictor>(*model_, card_threads, asked);
    precision_ = predictor->precision();
    predictor_ = std::move(predictor);
  }

  const serving::ServingSpec& spec() const { return model_->spec(); }
  // What the dense net computes in: the precision asked or recorded, fp32 where it has no bf16.
  std::string precision() const { return name_of(config::kDensePrecisionNames, precision_); }
  // The precision the export records as trained in.
  std::string trained_precision() const {
    return name_of(config::kDensePrecisionNames, spec().model.precision);
  }

  // Instances as CSR per slot: slot s of instance i holds keys[s][offsets[s][i] ..
  // offsets[s][i + 1]); dense is n x dense_dim.
  // The dense values as in the training data: through the transform the export records, as
  // gpubox_serve and predict_text apply it.
  py::array_t<float> predict(const std::vector<KeyArray>& keys,
                             const std::vector<OffsetArray>& offsets, const FloatArray& dense) {
    dataset::InstanceBlock block =
        build_block(spec().slot_names, spec().model.dense_dim, keys, offsets, dense, nullptr);
    const config::DenseTransform transform = spec().dense_transform;
    if (transform != config::DenseTransform::kNone && transform != config::DenseTransform::kAuto) {
      for (std::size_t i = 0; i < block.dense.size(); ++i) {
        float v = 0.0f;
        if (!dataset::transformed_dense(block.dense[i], transform, &v)) {
          raise(errors().engine_error,
                "dense value " + std::to_string(i % block.dense_dim) + " of instance " +
                    std::to_string(i / block.dense_dim) + " (" + std::to_string(block.dense[i]) +
                    ") is not one the model's dense transform (" +
                    name_of(config::kDenseTransformNames, transform) + ") takes");
        }
        block.dense[i] = v;
      }
    }
    return predict_block(block);
  }

  // Slot text lines, parsed by gpubox_serve's request parser (the dataset's line parser).
  py::array_t<float> predict_text(const std::string& text) {
    serving::RequestParser parser(spec(), std::size_t{1} << 40);
    auto block = parser.parse(text, serving::BodyForm::kSlotText);
    if (!block.ok()) raise(errors().engine_error, block.status().to_string());
    return predict_block(*block);
  }

 private:
  py::array_t<float> predict_block(const dataset::InstanceBlock& block) {
    const std::size_t n = block.size();
    py::array_t<float> out(static_cast<py::ssize_t>(n));
    float* at = out.mutable_data();
    std::vector<dataset::InstanceRef> refs;
    std::vector<float> predictions;
    dataset::Batch batch;
    std::string failure;
    {
      py::gil_scoped_release released;  // before the lock: a thread waiting for it holds no GIL
      MutexLock lock(predict_mu_);
      try {
        for (std::size_t first = 0; first < n; first += kChunk) {
          const std::size_t count = std::min(kChunk, n - first);
          refs.clear();
          for (std::size_t i = first; i < first + count; ++i) refs.push_back(block.instance(i));
          dataset::assemble_batch(refs.data(), count, block.num_slots, block.dense_dim, &batch);
          predictor_->predict(batch, &predictions);
          std::copy(predictions.begin(), predictions.end(), at + first);
        }
      } catch (const std::exception& e) {
        failure = "prediction failed: " + user_message(e);
      }
    }
    if (!failure.empty()) raise(errors().engine_error, failure);
    return out;
  }

  std::unique_ptr<serving::ServingModel> model_;
  Mutex predict_mu_;
  std::unique_ptr<serving::Predictor> predictor_ GPUBOX_PT_GUARDED_BY(predict_mu_);
  config::DensePrecision precision_ = config::DensePrecision::kFp32;  // predictor_'s, fixed
};

py::dict export_save(const LoadedConfig& config, const std::string& save_dir,
                     const std::string& out_dir, double show_threshold, bool fp16) {
  serving::ExportOptions options;
  options.show_threshold = show_threshold;
  options.value_type = fp16 ? serving::ValueType::kFloat16 : serving::ValueType::kFloat32;
  std::optional<StatusOr<serving::ExportSummary>> summary;
  std::string failure;
  {
    py::gil_scoped_release released;
    try {
      summary = serving::export_serving_model(config.config, save_dir, out_dir, options);
    } catch (const std::exception& e) {
      failure = user_message(e);
    }
  }
  if (!failure.empty()) raise(errors().engine_error, failure);
  if (!summary->ok()) raise(errors().engine_error, summary->status().to_string());
  const serving::ExportSummary& done = summary->value();
  py::dict d;
  d["rows_in_save"] = done.rows_in_save;
  d["rows_exported"] = done.rows_exported;
  d["dense_parameters"] = done.dense_parameters;
  d["dense_precision"] = name_of(config::kDensePrecisionNames, done.precision);
  d["bytes"] = done.bytes;
  return d;
}

}  // namespace

void register_predict(py::module_& m) {
  py::class_<LoadedModel>(m, "ServingModel", "An export (gpubox_train --mode export) loaded.")
      .def(py::init<const std::string&, int, const std::optional<std::string>&>(), py::arg("dir"),
           py::arg("card_threads") = 0, py::arg("precision") = py::none())
      .def_property_readonly("precision", &LoadedModel::precision)
      .def_property_readonly("trained_precision", &LoadedModel::trained_precision)
      .def_property_readonly("slot_names", [](const LoadedModel& l) { return l.spec().slot_names; })
      .def_property_readonly("dense_dim",
                             [](const LoadedModel& l) { return l.spec().model.dense_dim; })
      .def_property_readonly("label_name", [](const LoadedModel& l) { return l.spec().label_name; })
      .def_property_readonly("dense_name", [](const LoadedModel& l) { return l.spec().dense_name; })
      .def_property_readonly("model",
                             [](const LoadedModel& l) {
                               return name_of(config::kModelKindNames, l.spec().model.kind);
                             })
      .def_property_readonly("rows", [](const LoadedModel& l) { return l.spec().rows; })
      .def("predict", &LoadedModel::predict, py::arg("keys"), py::arg("offsets"), py::arg("dense"))
      .def("predict_text", &LoadedModel::predict_text, py::arg("text"));
  m.def("export_save", &export_save, py::arg("config"), py::arg("save_dir"), py::arg("out_dir"),
        py::arg("show_threshold") = 0.0, py::arg("fp16") = false,
        "gpubox_train --mode export: the save `save_dir` as a serving model in `out_dir`.");
}

}  // namespace gpubox::python
