// gpubox._core.load_config: the config loader of every binary (common/config) and gpubox_train's
// typed config (trainer/config), with their errors as gpubox.ConfigError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "common/config/config_enums.hpp"
#include "common/enum_names.hpp"
#include "common/logging.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/config/unread_keys.hpp"

namespace py = pybind11;

namespace gpubox::python {
namespace {

LoadedConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  auto doc = config::ConfigDocument::load(path, overrides);
  if (!doc.ok()) raise(errors().config_error, doc.status().to_string());
  if (const std::string note = doc->no_effect_note(); !note.empty()) GPUBOX_LOG(INFO) << note;
  if (const std::string typed = doc->no_effect_overrides(overrides); !typed.empty()) {
    GPUBOX_LOG(WARNING) << typed;
  }
  auto config = trainer::trainer_config_from(*doc);
  if (!config.ok()) raise(errors().config_error, config.status().to_string());
  if (const std::string note = trainer::unread_keys_note(*doc); !note.empty()) {
    GPUBOX_LOG(WARNING) << note;
  }
  LoadedConfig loaded;
  loaded.doc = std::make_shared<const config::ConfigDocument>(std::move(doc.value()));
  loaded.config = std::move(config.value());
  loaded.path = path;
  loaded.overrides = overrides;
  return loaded;
}

}  // namespace

void register_config(py::module_& m) {
  py::class_<LoadedConfig>(m, "LoadedConfig",
                           "A config as gpubox_train loads it (read-only; gpubox.Config wraps it).")
      .def_readonly("path", &LoadedConfig::path)
      .def_readonly("overrides", &LoadedConfig::overrides)
      .def_property_readonly("model",
                             [](const LoadedConfig& c) {
                               return name_of(config::kModelKindNames, c.config.hyper.model);
                             })
      .def_property_readonly("sync_mode",
                             [](const LoadedConfig& c) {
                               return name_of(config::kSyncModeNames, c.config.runner.sync_mode);
                             })
      .def_property_readonly("train_data_dir",
                             [](const LoadedConfig& c) { return c.config.runner.train_data_dir; })
      .def_property_readonly("test_data_dir",
                             [](const LoadedConfig& c) { return c.config.runner.test_data_dir; })
      .def_property_readonly("model_save_path",
                             [](const LoadedConfig& c) { return c.config.runner.model_save_path; })
      .def_property_readonly("metrics_path",
                             [](const LoadedConfig& c) { return c.config.runner.metrics_path; })
      .def_property_readonly("epochs", [](const LoadedConfig& c) { return c.config.runner.epochs; })
      .def_property_readonly("slot_names",
                             [](const LoadedConfig& c) { return c.config.dataset.slots; })
      .def_property_readonly("label_name",
                             [](const LoadedConfig& c) { return c.config.dataset.label_name; })
      .def_property_readonly("dense_name",
                             [](const LoadedConfig& c) { return c.config.dataset.dense_name; })
      .def_property_readonly("dense_dim",
                             [](const LoadedConfig& c) { return c.config.dataset.dense_dim; });
  m.def("load_config", &load_config, py::arg("path"), py::arg("overrides"),
        "Loads `path` with `overrides` ('key=value') applied in order, as gpubox_train --config "
        "PATH -o key=value does; raises ConfigError with the loader's text.");
}

}  // namespace gpubox::python
