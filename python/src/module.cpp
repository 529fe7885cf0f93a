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

PYBIND11_MODULE(_core, m) {
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
