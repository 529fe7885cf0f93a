// PsPeerWatch at its edges, against a loopback gpubox_server: a trainer of the job that never
// begins its train() is named once runner.collective_timeout_s passed (begin_timeout_s), a slow
// starter within it is not, nor one whose begun flag was lost with the table; beat counts stay
// exact past 2^24 beats; a reason of an earlier run is never reported in a later one; trainers
// failing at once are all named.
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

// Trainers 1 and 2 passed the job's start (its meeting) with trainer 0. Trainer 1 begins its
// train() a timeout after trainer 0, within the bound (a slow start); trainer 2 never does (it died
// after the meeting). Trainer 0's watch names trainer 2, not before the bound, and never trainer
// 1; so does trainer 1's. (A trainer that began and died right after is named by its silence:
// ps_modes_telling_test's ATrainerThatBeganTheRunAndNeverBeatAgainIsLost.)
TEST_F(PsPeerWatchTest, ATrainerThatNeverBeginsIsLostAfterTheBoundASlowStarterIsNot) {
  reset(3);
  PsPeerWatchOptions o = options();
  o.begin_timeout_s = 4 * kTimeout;
  Losses first_losses;
  Losses slow_losses;
  const auto started = Clock::now();
  PsPeerWatch first(*clients_[0], 0, 3, o, first_losses.callback());
  std::this_thread::sleep_for(std::chrono::duration<double>(kTimeout));
  PsPeerWatch slow(*clients_[1], 1, 3, o, slow_losses.callback());
  ASSERT_TRUE(first_losses.wait_for_report()) << "trainer 2 was never lost";
  // Not before the bound (load only delays the report).
  EXPECT_GE(std::chrono::duration<double>(Clock::now() - started).count(), o.begin_timeout_s);
  ASSERT_TRUE(slow_losses.wait_for_report()) << "trainer 2 was never lost";
  EXPECT_EQ(first_losses.reports_after_quiet_window(), 1u) << first_losses.reasons().back();
  for (const Losses* losses : {&first_losses, &slow_losses}) {
    const auto reasons = losses->reasons();
    ASSERT_EQ(reasons.size(), 1u) << reasons.back();
    EXPECT_NE(reasons[0].find("lost trainer 2 of 3: it did not begin training run 1 within "),
              std::string::npos)
        << reasons[0];
    EXPECT_NE(reasons[0].find("runner.collective_timeout_s=4"), std::string::npos) << reasons[0];
  }
}

// Trainer 1 began (trainer 0's watch saw it so) and then its begun flag was lost with the table (a
// first server restarted empty; trainer 1's next beats would set it again, here they do not),
// while its count moves: not taken for a trainer that never began, however short the bound.
TEST_F(PsPeerWatchTest, ABegunFlagLostWithTheTableIsNotATrainerThatNeverBegan) {
  reset(2);
  PsPeerWatchOptions o = options();
  o.begin_timeout_s = kTimeout / 2;
  Losses losses;
  PsPeerWatch watch(*clients_[0], 0, 2, o, losses.callback());
  const auto beat_of_trainer_1 = [&](float begun) {
    std::vector<float> beat = {0.0f, 1.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, begun};
    return clients_[1]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &beat).ok();
  };
  ASSERT_TRUE(beat_of_trainer_1(1.0f));
  ASSERT_TRUE(beaten_after(2, 1, {0}, 2)) << "trainer 0 did not beat";
  ASSERT_TRUE(beat_of_trainer_1(-1.0f));  // its flag gone
  const auto until = Clock::now() + std::chrono::duration<double>(3 * kTimeout);
  while (Clock::now() < until) {
    ASSERT_TRUE(beat_of_trainer_1(0.0f));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(losses.reasons().empty()) << losses.reasons().front();
}

// A job long enough for its beat counts to pass 2^24 (the last integer a float holds exactly, so a
// count kept there stopped: its trainer was found lost); here they start just below it. The counts
// go on moving and stay exact (they wrap at kBeatWrap), and nobody is lost.
TEST_F(PsPeerWatchTest, BeatCountsStayExactPast2To24Beats) {
  reset(2);
  const float high = 16777216.0f - 2.0f;  // 2^24 - 2
  std::vector<float> long_job = {high, high, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  ASSERT_TRUE(clients_[0]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &long_job).ok());
  Losses losses0;
  Losses losses1;
  PsPeerWatch watch0(*clients_[0], 0, 2, options(), losses0.callback());
  PsPeerWatch watch1(*clients_[1], 1, 2, options(), losses1.callback());
  // Past the old count's stop (2 beats) and a timeout of silence after it, several times over.
  std::this_thread::sleep_for(std::chrono::duration<double>(4 * kTimeout));
  const std::vector<float> before = beats(2);
  ASSERT_EQ(before.size(), 2u);
  std::vector<float> after = before;
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < until &&
         (after.size() != 2 || after[0] == before[0] || after[1] == before[1])) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    after = beats(2);
  }
  ASSERT_EQ(after.size(), 2u);
  for (std::size_t w = 0; w < 2; ++w) {
    EXPECT_NE(after[w], before[w]) << "trainer " << w << "'s count stopped at " << before[w];
    EXPECT_LT(after[w], 16777216.0f) << "trainer " << w;
  }
  EXPECT_TRUE(losses0.reasons().empty()) << losses0.reasons().front();
  EXPECT_TRUE(losses1.reasons().empty()) << losses1.reasons().front();
}

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
