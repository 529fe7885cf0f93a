// gpubox._core.capture_logs / drain_logs: the engine's log lines (common/log_sink.hpp) kept for
// Python's logging. Lines are queued here, never handed to Python on the logging thread: a
// card thread that waited for the GIL while the main thread waits for it would deadlock. The
// package drains the queue at pass boundaries and after each call (gpubox/_logs.py).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "common/log_sink.hpp"
#include "common/thread_annotations.hpp"

namespace py = pybind11;

namespace gpubox::python {
namespace {

constexpr std::size_t kMaxQueued = 100000;  // older lines are dropped past this

Mutex g_queue_mu;
std::deque<std::pair<int, std::string>> g_queue GPUBOX_GUARDED_BY(g_queue_mu);

void capture_logs(bool on) {
  if (!on) {
    set_log_sink({});
    return;
  }
  set_log_sink([](LogLevel level, const std::string& line) {
    MutexLock lock(g_queue_mu);
    if (g_queue.size() >= kMaxQueued) g_queue.pop_front();
    g_queue.emplace_back(static_cast<int>(level), line);
  });
}

std::vector<std::pair<int, std::string>> drain_logs() {
  MutexLock lock(g_queue_mu);
  std::vector<std::pair<int, std::string>> lines(g_queue.begin(), g_queue.end());
  g_queue.clear();
  return lines;
}

}  // namespace

void register_logs(py::module_& m) {
  m.def("capture_logs", &capture_logs, py::arg("on"),
        "True: the engine's log lines are queued for drain_logs() instead of written to "
        "stderr; False: stderr again.");
  m.def("drain_logs", &drain_logs,
        "The queued log lines as (level, line): level 0 debug, 1 info, 2 warning, 3 error.");
}

}  // namespace gpubox::python
