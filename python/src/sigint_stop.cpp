#include "sigint_stop.hpp"

#include <pybind11/pybind11.h>

#include <csignal>

namespace py = pybind11;

namespace gpubox::python {
namespace {

// What the handler may touch: lock-free atomics only (async-signal-safe).
std::atomic<std::atomic<bool>*> g_stop_flag{nullptr};
std::atomic<bool> g_received{false};
struct sigaction g_previous {};

extern "C" void on_sigint(int) {
  g_received.store(true);
  if (std::atomic<bool>* flag = g_stop_flag.load(); flag != nullptr) flag->store(true);
}

// Python's SIGINT handler is its default (KeyboardInterrupt), and this is the main thread.
bool python_handler_is_default() {
  const py::module_ signal = py::module_::import("signal");
  const py::module_ threading = py::module_::import("threading");
  if (!threading.attr("current_thread")().is(threading.attr("main_thread")())) return false;
  return signal.attr("getsignal")(SIGINT).is(signal.attr("default_int_handler"));
}

}  // namespace

SigintStop::SigintStop(std::atomic<bool>* stop_flag) {
  static_assert(std::atomic<std::atomic<bool>*>::is_always_lock_free &&
                    std::atomic<bool>::is_always_lock_free,
                "the SIGINT handler needs lock-free atomics");
  if (g_stop_flag.load() != nullptr || !python_handler_is_default()) return;
  g_received.store(false);
  g_stop_flag.store(stop_flag);
  struct sigaction action {};
  action.sa_handler = on_sigint;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and waits in the engine go on; the flag is polled
  if (sigaction(SIGINT, &action, &g_previous) != 0) {
    g_stop_flag.store(nullptr);
    return;
  }
  installed_ = true;
}

bool SigintStop::release() {
  if (!installed_) return interrupted_;
  sigaction(SIGINT, &g_previous, nullptr);
  g_stop_flag.store(nullptr);
  installed_ = false;
  interrupted_ = g_received.exchange(false);
  return interrupted_;
}

}  // namespace gpubox::python
