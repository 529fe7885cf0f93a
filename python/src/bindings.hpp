// gpubox._core: the Python face of the engine (issue 33). Each part registers its functions on
// the module; nothing here trains, parses or predicts by itself: every call goes to the same
// library code the binaries run (trainer/main/run_job.hpp, common/config, serving/).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "common/config/config_document.hpp"
#include "dataset/instance_block.hpp"
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

using KeyArray = pybind11::array_t<uint64_t, pybind11::array::c_style | pybind11::array::forcecast>;
using OffsetArray =
    pybind11::array_t<int64_t, pybind11::array::c_style | pybind11::array::forcecast>;
using FloatArray = pybind11::array_t<float, pybind11::array::c_style | pybind11::array::forcecast>;

// Instances from columns: slot s of instance i holds keys[s][offsets[s][i] .. offsets[s][i +
// 1]) (key 0 dropped, as the parsers drop it), dense is n x dense_dim, labels n values (null: 0).
// Raises EngineError naming what does not fit.
dataset::InstanceBlock build_block(const std::vector<std::string>& slot_names, int dense_dim,
                                   const std::vector<KeyArray>& keys,
                                   const std::vector<OffsetArray>& offsets, const FloatArray& dense,
                                   const float* labels);

void register_errors(pybind11::module_& m);
void register_config(pybind11::module_& m);
void register_train(pybind11::module_& m);
void register_predict(pybind11::module_& m);
void register_logs(pybind11::module_& m);
void register_data_sets(pybind11::module_& m);

// Raises `type` with `message` (throws pybind11::error_already_set).
[[noreturn]] void raise(const pybind11::object& type, const std::string& message);

}  // namespace gpubox::python
