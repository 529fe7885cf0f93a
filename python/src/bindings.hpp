// gpubox._core: the Python face of the engine (issue 33). Each part registers its functions on
// the module; nothing here trains, parses or predicts by itself: every call goes to the same
// library code the binaries run (trainer/main/run_job.hpp, common/config, serving/).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "common/config/config_document.hpp"
#include "trainer/config/trainer_config.hpp"

namespace gpubox::python {

// A loaded config: the document (key table, defaults, resolved paths) and the typed
// TrainerConfig gpubox_train builds from it. Immutable once built.
struct LoadedConfig {
  std::shared_ptr<const config::ConfigDocument> doc;
  trainer::TrainerConfig config;
  std::string path;
  std::vector<std::string> overrides;  // "key=value", in order
};

// The module's exception types (set once by register_errors, before the other parts).
struct Errors {
  pybind11::object config_error;  // gpubox.ConfigError (ValueError)
  pybind11::object engine_error;  // gpubox.EngineError (RuntimeError)
};
const Errors& errors();

void register_errors(pybind11::module_& m);
void register_config(pybind11::module_& m);
void register_train(pybind11::module_& m);
void register_predict(pybind11::module_& m);
void register_logs(pybind11::module_& m);

// Raises `type` with `message` (throws pybind11::error_already_set).
[[noreturn]] void raise(const pybind11::object& type, const std::string& message);

}  // namespace gpubox::python
