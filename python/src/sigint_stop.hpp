// SigintStop: Ctrl-C while the engine trains, as a stop between two steps.
//
// Python's own SIGINT handler only marks the signal for the main thread, which is inside the
// engine (GIL released) until the run returns: Ctrl-C would be heard at the next pass boundary
// at best. While a SigintStop lives, a C handler takes SIGINT instead and sets the run's stop
// flag (StepHooks::stop_flag), which every card votes into its next step's all-reduce. It is
// installed only on the main thread and only while Python's handler is the default one
// (signal.default_int_handler: KeyboardInterrupt); a caller's own handler is left in place and
// runs between passes, as before. Ctrl-C again while the stop is under way changes nothing.
//
// Thread-safety: construct and release on the main thread with the GIL held; one at a time (a
// nested one, e.g. a train() called from a callback, leaves the outer one's handler in place).
#pragma once

#include <atomic>

namespace gpubox::python {

class SigintStop {
 public:
  explicit SigintStop(std::atomic<bool>* stop_flag);
  ~SigintStop() { release(); }
  SigintStop(const SigintStop&) = delete;
  SigintStop& operator=(const SigintStop&) = delete;

  // Puts the previous handler back (idempotent); returns whether SIGINT arrived meanwhile.
  bool release();

 private:
  bool installed_ = false;
  bool interrupted_ = false;
};

}  // namespace gpubox::python
