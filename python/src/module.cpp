#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "common/cli.hpp"

namespace py = pybind11;

namespace gpubox::python {
namespace {
Errors* g_errors = nullptr;  // set at import, read under the GIL; lives as long as the process
}  // namespace

const Errors& errors() { return *g_errors; }

void raise(const py::object& type, const std::string& message) {
  PyErr_SetString(type.ptr(), message.c_str());
  throw py::error_already_set();
}

void register_errors(py::module_& m) {
  g_errors = new Errors();  // never freed: exception types outlive any interpreter teardown
  g_errors->config_error = py::reinterpret_borrow<py::object>(
      PyErr_NewExceptionWithDoc("gpubox._core.ConfigError",
                                "A config the loader refuses: the text gpubox_train prints "
                                "after 'gpubox_train: '.",
                                PyExc_ValueError, nullptr));
  g_errors->engine_error = py::reinterpret_borrow<py::object>(
      PyErr_NewExceptionWithDoc("gpubox._core.EngineError",
                                "An error of the engine while it trains, evaluates, exports or "
                                "predicts: the text the binaries print after their name.",
                                PyExc_RuntimeError, nullptr));
  m.attr("ConfigError") = g_errors->config_error;
  m.attr("EngineError") = g_errors->engine_error;
}

}  // namespace gpubox::python

namespace {

// pybind11 before 2.12 reads NumPy 1's array descriptor layout: under NumPy 2 it takes every
// array's element size for another, so a batch's predictions all read instance 0's and inputs
// are misread, silently (a helper's probe: every row of Model.predict was row 0's). Refused at
// import, naming both versions, where the extension was built with such a pybind11 (Debian
// bookworm's 2.10).
void check_numpy_layout() {
#if PYBIND11_VERSION_MAJOR < 2 || (PYBIND11_VERSION_MAJOR == 2 && PYBIND11_VERSION_MINOR < 12)
  const std::string version = pybind11::str(pybind11::module_::import("numpy").attr("__version__"));
  int major = 0;
  for (const char c : version) {
    if (c < '0' || c > '9') break;
    major = major * 10 + (c - '0');
  }
  if (major >= 2) {
    throw pybind11::import_error(
        "gpubox: NumPy " + version +
        " is installed, but this build of gpubox's extension uses "
        "pybind11 " +
        std::to_string(PYBIND11_VERSION_MAJOR) + "." + std::to_string(PYBIND11_VERSION_MINOR) +
        ", which reads NumPy 1's arrays only (under NumPy 2 every prediction of a batch would be "
        "the first one's): install numpy<2 (pip install 'numpy<2'), or build gpubox against "
        "pybind11 2.12 or later");
  }
#endif
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  check_numpy_layout();
  m.doc() = "GPUBox's engine, bound for Python (the gpubox package wraps it).";
  m.attr("__version__") = GPUBOX_VERSION;
  m.attr("backend") = GPUBOX_BACKEND_NAME;
  m.attr("version_text") = gpubox::cli::version_text("gpubox");
  gpubox::python::register_errors(m);
  gpubox::python::register_config(m);
  gpubox::python::register_train(m);
  gpubox::python::register_predict(m);
  gpubox::python::register_logs(m);
  gpubox::python::register_data_sets(m);
}
