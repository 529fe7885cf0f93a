// The nice value of the calling thread. On Linux a thread's nice value is its own (setpriority
// on its thread id), and the threads it starts inherit it; threads made elsewhere (a pool made
// once, at nice 0) do not, so a pool that runs lowered work lowers its own threads.
//
// Host-only, no state.
#pragma once

#include "common/status.hpp"

namespace gpubox {

// Adds `nice` (> 0) to the calling thread's nice value, at most 19; nothing when nice <= 0.
// Raising one's nice needs no privilege; a refusal comes back as an Internal Status naming errno.
Status lower_thread_priority(int nice);
// The calling thread's nice value (getpriority of its thread id).
int thread_nice();

}  // namespace gpubox
