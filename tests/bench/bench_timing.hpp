// Timing a card's calls for gpubox_bench's sub-commands: warm-up, then `repeats` timings of
// `calls` calls each, every timing ended by the card's stream.
#pragma once

#include <algorithm>
#include <vector>

#include "common/timer.hpp"
#include "heterps/device/card.hpp"
#include "tests/bench/bench_command.hpp"

namespace gpubox::bench {

// Microseconds per call: the median and the fastest of the timings. On a shared machine the
// fastest is the kernel's own rate; the median also holds the time other processes took the core
// away.
struct Timing {
  double median_us = 0, best_us = 0;
};

template <class Call>
Timing time_calls(device::Card& card, int calls, int repeats, Call&& call) {
  for (int i = 0; i < calls; ++i) call();  // warm-up
  card.stream().synchronize();
  std::vector<double> us;
  for (int r = 0; r < repeats; ++r) {
    Timer timer;
    for (int i = 0; i < calls; ++i) call();
    card.stream().synchronize();
    us.push_back(timer.seconds() * 1e6 / calls);
  }
  return Timing{median(us), *std::min_element(us.begin(), us.end())};
}

}  // namespace gpubox::bench
