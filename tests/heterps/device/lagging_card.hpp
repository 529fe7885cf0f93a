// LaggingCard: a test's card that runs behind the host (cpu backend). On the cpu backend the
// streams made while it lives defer their work (GPUBOX_DEVICE_CHECK=defer, no seed: a stream
// reads the mode when it is made), and while it lives a poll that finds any deferring stream's
// work pending runs it only at the `polls`-th such poll since that stream's work last ran, as a
// card `polls` polls behind the host (device::set_deferred_poll_lag: one process-wide setting,
// read at each poll, so it holds for every deferring stream, those made before it too, and ends
// with it). With 1 (the default lag) the first poll that finds work pending runs it. The mode
// and lag before are back after. On CUDA nothing changes: a GPU lags as it will.
#pragma once

#include <cstdint>

#include "heterps/device/deferred.hpp"

namespace gpubox::device::testing {

class LaggingCard {
 public:
  explicit LaggingCard(unsigned polls)
      : was_enabled_(deferred_execution_enabled()),
        was_seed_(deferred_execution_seed()),
        was_lag_(deferred_poll_lag()) {
    set_deferred_execution(true, 0);
    set_deferred_poll_lag(polls);
  }
  ~LaggingCard() {
    set_deferred_poll_lag(was_lag_);
    set_deferred_execution(was_enabled_, was_seed_);
  }
  LaggingCard(const LaggingCard&) = delete;
  LaggingCard& operator=(const LaggingCard&) = delete;

 private:
  bool was_enabled_;
  uint64_t was_seed_;
  unsigned was_lag_;
};

}  // namespace gpubox::device::testing
