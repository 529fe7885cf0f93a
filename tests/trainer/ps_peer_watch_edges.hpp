// What the two sources of ps_peer_watch_edges_test share (ps_peer_watch_edges_test.cpp and
// ps_peer_watch_dropped_beats_test.cpp: PsPeerWatch at its edges): the watch's fixture
// (ps_peer_watch_fixture.hpp) with the names of it they use, and quiet_window. Their tests are in
// edges_test, each source's own in an anonymous namespace within it.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.hpp"
#include "common/thread_annotations.hpp"
#include "table/server/ps_protocol.hpp"
#include "tests/trainer/ps_peer_watch_fixture.hpp"
#include "trainer/ps_modes/ps_peer_watch.hpp"

namespace gpubox::trainer::ps_modes::edges_test {

using table::server::DenseAction;
using watch_test::Clock;
using watch_test::kTimeout;
using watch_test::LogLines;
using watch_test::Losses;
using watch_test::options;
using watch_test::PsPeerWatchTest;

// A window of many beats (3 timeouts) in which a loss a watch must not see would have been seen.
// A sleep, as the check is negative.
inline void quiet_window() {
  std::this_thread::sleep_for(std::chrono::duration<double>(3 * kTimeout));
}

}  // namespace gpubox::trainer::ps_modes::edges_test
