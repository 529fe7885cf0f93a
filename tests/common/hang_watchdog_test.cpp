// tests/common/hang_watchdog.hpp: a watchdog whose limit passes aborts the process, naming what
// was waited for, for how long and the test; one disarmed in time lets the run go on.
#include "tests/common/hang_watchdog.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

namespace gpubox::testing {
namespace {

// The watchdog runs a thread: its death tests re-execute the binary ("threadsafe"), and the
// style the rest of common_test runs with is restored after each.
class HangWatchdogDeathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    style_ = GTEST_FLAG_GET(death_test_style);
    GTEST_FLAG_SET(death_test_style, "threadsafe");
  }
  void TearDown() override { GTEST_FLAG_SET(death_test_style, style_); }

 private:
  std::string style_;
};

TEST_F(HangWatchdogDeathTest, AbortsPastItsLimitNamingTheWaitAndTheTest) {
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
