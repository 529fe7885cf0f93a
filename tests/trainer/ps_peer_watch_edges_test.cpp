// PsPeerWatch at its edges, against a loopback gpubox_server: a reason of an earlier run is never
// reported in a later one; trainers failing at once are all named.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/status.hpp"
#include "table/server/ps_protocol.hpp"
#include "tests/trainer/ps_peer_watch_fixture.hpp"
#include "trainer/ps_modes/ps_peer_watch.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using table::server::DenseAction;
using watch_test::Clock;
using watch_test::kTimeout;
using watch_test::Losses;
using watch_test::options;
using watch_test::PsPeerWatchTest;

// Trainer 1 marked a failure at a meeting of run 1 (its reason, no flag) and has not begun run 2,
// which would take it back. Read for run 2, it is no reason; and a failed flag of run 2 whose
// reason is not run 2's is reported without that stale reason.
TEST_F(PsPeerWatchTest, AReasonOfAnEarlierRunIsNotReportedInALaterOne) {
  reset(2);
  ASSERT_TRUE(PsPeerWatch::mark_failed(*clients_[1], 1, 2, "run 1: unreadable data",
                                       FailureNotice::kAtMeeting, /*run=*/1)
                  .ok());
  for (const int run : {1, 2, PsPeerWatch::kAnyRun}) {
    StatusOr<std::string> reason = PsPeerWatch::failure_of(*clients_[0], 1, 2, run);
    ASSERT_TRUE(reason.ok()) << reason.status().to_string();
    EXPECT_EQ(*reason, run == 2 ? "" : "run 1: unreadable data") << "run " << run;
  }
  std::vector<float> flagged_in_run_2 = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 2.0f, 0.0f, 0.0f};
  ASSERT_TRUE(
      clients_[0]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &flagged_in_run_2).ok());
  PsPeerWatchOptions second_run = options();
  second_run.run = 2;
  Losses losses;
  PsPeerWatch watch(*clients_[0], 0, 2, second_run, losses.callback());
  ASSERT_TRUE(losses.wait_for_report()) << "trainer 1's flag of run 2 was never reported";
  EXPECT_EQ(losses.reasons().at(0),
            "trainer 1 of 2 failed: (what it reported in this run is not on the first server)");
}

// Trainers 1 and 2 fail at the same instant, each marking its failure: trainer 0 names both, in one
// report when one beat saw both marks, and in what lost() says when a later beat saw the second.
TEST_F(PsPeerWatchTest, TwoTrainersFailingAtOnceAreBothReported) {
  const std::string both = "trainer 1 of 3 failed: one; trainer 2 of 3 failed: two";
  const auto mark = [&](int trainer, const std::string& reason) {
    return PsPeerWatch::mark_failed(*clients_[static_cast<std::size_t>(trainer)], trainer, 3,
                                    reason, FailureNotice::kToWatches, /*run=*/1)
        .ok();
  };
  reset(3);
  ASSERT_TRUE(mark(1, "one"));
  ASSERT_TRUE(mark(2, "two"));
  {
    Losses losses;
    PsPeerWatch survivor(*clients_[0], 0, 3, options(), losses.callback());
    ASSERT_TRUE(losses.wait_for_report()) << "the failures were never reported";
    EXPECT_EQ(losses.reports_after_quiet_window(), 1u) << losses.reasons().back();
    EXPECT_EQ(losses.reasons().at(0), both);
    EXPECT_EQ(survivor.lost(), both);
  }
  reset(3);
  Losses losses;
  PsPeerWatch survivor(*clients_[0], 0, 3, options(), losses.callback());
  ASSERT_TRUE(mark(1, "one"));
  ASSERT_TRUE(losses.wait_for_report()) << "trainer 1's failure was never reported";
  ASSERT_TRUE(mark(2, "two"));
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (survivor.lost() != both && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(survivor.lost(), both);
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
