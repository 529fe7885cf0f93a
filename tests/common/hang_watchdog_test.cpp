// tests/common/hang_watchdog.hpp: a watchdog whose limit passes aborts the process, naming what
// was waited for, for how long and the test; one disarmed in time lets the run go on.
#include "tests/common/hang_watchdog.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace gpubox::testing {
namespace {

TEST(HangWatchdogDeathTest, AbortsPastItsLimitNamingTheWaitAndTheTest) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";  // the watchdog runs a thread
  EXPECT_DEATH(
      {
        const HangWatchdog watchdog("a wait that never ends", std::chrono::seconds(1),
                                    StackDump::kNone);
        std::this_thread::sleep_for(std::chrono::seconds(30));
      },
      "HangWatchdog: still waiting after 1 s for a wait that never ends \\(test "
      "HangWatchdogDeathTest\\.AbortsPastItsLimitNamingTheWaitAndTheTest\\)");
}

TEST(HangWatchdog, ADisarmedWatchdogLetsTheRunGoOn) {
  for (int i = 0; i < 3; ++i) {
    const HangWatchdog watchdog("a short wait", std::chrono::seconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(10 * i));
  }
  SUCCEED();  // reached: no watchdog aborted the process
}

}  // namespace
}  // namespace gpubox::testing
