// PsPeerWatch at its edges, against a loopback gpubox_server: a trainer of the job that never
// begins its first train() is named once runner.collective_timeout_s passed (begin_timeout_s), a
// slow starter within it is not, nor one of a later train(), whose start is not common; a trainer
// whose begun flag was lost with the table (its beats failing meanwhile) is not judged by its
// silence, only once the bound after a loss passed (after_loss_timeout_s), which also replaces the
// bound of run 1; one with a stale failed flag is judged as any other; beat counts wrap at 2^23
// and stay exact, a wrap whose reply was lost applied once, a wrap past a failure's mark counted
// as a beat; a reason of an earlier run is never reported in a later one; trainers failing at once
// are all named, in lost() and in the forced end's line; a server lost as a failure is reported
// keeps that end, and its line names the server too.
#include "tests/trainer/ps_peer_watch_edges.hpp"

namespace gpubox::trainer::ps_modes::edges_test {
namespace {

// Trainers 1 and 2 passed the job's start (its meeting) with trainer 0. Trainer 1 begins its
// train() a timeout after trainer 0, within the bound (a slow start); trainer 2 never does (it died
// after the meeting). Trainer 0's watch names trainer 2, not before the bound; so does trainer 1's;
// and no line names trainer 1. (A trainer that began and died right after is named by its
// silence: ps_modes_telling_test's ATrainerThatBeganTheRunAndNeverBeatAgainIsLost.)
TEST_F(PsPeerWatchTest, ATrainerThatNeverBeginsIsLostAfterTheBoundASlowStarterIsNot) {
  reset(3);
  LogLines log;
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
  for (const Losses* losses : {&first_losses, &slow_losses}) {
    const std::string reason = losses->reasons().at(0);
    EXPECT_NE(reason.find("lost trainer 2 of 3: it did not begin training run 1 within "),
              std::string::npos)
        << reason;
    EXPECT_NE(reason.find("runner.collective_timeout_s=4"), std::string::npos) << reason;
  }
  // The slow starter is never named, by a report or a logged loss after it (many beats).
  quiet_window();
  for (const std::string& line : log.holding("trainer 1 of 3")) ADD_FAILURE() << line;
}

// Trainer 0 begins the job's second train() (run 2) and trainer 1 only a while after the bound:
// the trainers met before run 1 only (the program may do anything between its calls), so trainer
// 1 is not taken for one that never comes; once begun, it is watched as any other.
TEST_F(PsPeerWatchTest, ATrainerBeginningALaterRunAfterTheBoundIsNotLost) {
  reset(2);
  LogLines log;
  std::vector<float> run_1 = {5.0f, 7.0f, 1.0f, 1.0f, 0.0f, 0.0f, 1.0f, 1.0f};  // both finished
  ASSERT_TRUE(clients_[1]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &run_1).ok());
  PsPeerWatchOptions o = options();
  o.run = 2;
  o.begin_timeout_s = kTimeout / 2;
  Losses losses;
  PsPeerWatch first(*clients_[0], 0, 2, o, losses.callback());
  std::this_thread::sleep_for(std::chrono::duration<double>(3 * kTimeout));  // 6 bounds
  PsPeerWatch late(*clients_[1], 1, 2, o);
  ASSERT_TRUE(beaten_after(2, 1, {0}, 2)) << "the trainers did not beat";
  quiet_window();
  EXPECT_TRUE(losses.reasons().empty()) << losses.reasons().front();
  for (const std::string& line : log.holding("trainer 1 of 2")) ADD_FAILURE() << line;
}

// Trainer 1's failed flag is run 1's (stale: in PsTrainer its trainer takes it back before its
// watch of run 2 starts; here it did not). It began run 2 and its count stopped: trainer 0's watch
// of run 2 judges it as any other, lost by its silence.
TEST_F(PsPeerWatchTest, ATrainerWithAFailedFlagOfAnEarlierRunIsJudged) {
  reset(2);
  std::vector<float> began_run_2 = {0.0f, 3.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0.0f, 2.0f};
  ASSERT_TRUE(clients_[1]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &began_run_2).ok());
  PsPeerWatchOptions o = options();
  o.run = 2;
  Losses losses;
  PsPeerWatch watch(*clients_[0], 0, 2, o, losses.callback());
  ASSERT_TRUE(losses.wait_for_report()) << "trainer 1 was never lost";
  const std::string reason = losses.reasons().at(0);
  EXPECT_NE(reason.find("lost trainer 1 of 2: its heartbeat through server "), std::string::npos)
      << reason;
}

// Trainers 1 and 2 began (trainer 0's watch saw them so), then the table was zeroed (a first
// server restarted empty: every begun flag, trainer 0's too, went with it). Their counts go on
// moving (without their flags) until trainer 0's watch found the loss; then trainer 1's beats fail
// for 3 timeouts (it has not accepted the restart yet: its count stands still, its flag not back)
// and go through again (its flag set again); trainer 2's never do (it died). Trainer 1 is never
// named; trainer 2 only after_loss_timeout_s after the loss, as one whose flag went with the table
// (before: both were judged by their silence, and trainer 1, alive, was named).
TEST_F(PsPeerWatchTest,
       ABegunFlagLostWithTheTableLeavesItsTrainerUnjudgedUntilTheBoundAfterTheLoss) {
  reset(3);
  LogLines log;
  PsPeerWatchOptions o = options();
  o.begin_timeout_s = kTimeout / 2;
  o.after_loss_timeout_s = 6 * kTimeout;
  Losses losses;
  PsPeerWatch watch(*clients_[0], 0, 3, o, losses.callback());
  const auto beat_of = [&](std::size_t trainer, float count, float begun) {
    std::vector<float> beat(PsPeerWatch::kAliveSections * 3, 0.0f);
    beat[trainer] = count;
    beat[PsPeerWatch::kBegunSection * 3 + trainer] = begun;
    return clients_[trainer]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &beat).ok();
  };
  ASSERT_TRUE(beat_of(1, 1.0f, 1.0f));
  ASSERT_TRUE(beat_of(2, 1.0f, 1.0f));
  enum Phase { kBoth, kNone, kTrainer1Again };
  std::atomic<int> phase{kBoth};
  std::atomic<bool> stop{false};
  std::thread others([&] {
    bool flag_back = false;
    while (!stop.load()) {
      if (phase.load() == kBoth) {
        beat_of(1, 1.0f, 0.0f);
        beat_of(2, 1.0f, 0.0f);
      } else if (phase.load() == kTrainer1Again) {
        flag_back = beat_of(1, 1.0f, flag_back ? 0.0f : 1.0f) || flag_back;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  ASSERT_TRUE(beaten_after(3, 2, {0}, 2)) << "trainer 0 did not beat";
  const auto zeroed = Clock::now();
  ASSERT_TRUE(zero_alive_table(3));
  const bool found = begun_again(3, 0, 1.0f);  // trainer 0's watch found the loss
  phase.store(kNone);
  std::this_thread::sleep_for(std::chrono::duration<double>(3 * kTimeout));
  phase.store(kTrainer1Again);
  const bool reported = losses.wait_for_report();
  const double after_s = std::chrono::duration<double>(Clock::now() - zeroed).count();
  const bool beat_again = beaten_after(3, 1, {0}, 2);
  quiet_window();
  stop.store(true);
  others.join();
  ASSERT_TRUE(found) << "trainer 0's watch did not beat after the loss";
  ASSERT_TRUE(reported) << "trainer 2 was never lost";
  EXPECT_TRUE(beat_again) << "trainer 1 did not beat again";
  const std::string reason = losses.reasons().at(0);
  EXPECT_NE(reason.find("lost trainer 2 of 3: it did not beat in training run 1 within "),
            std::string::npos)
      << reason;
  EXPECT_NE(reason.find("after trainer 0 found the table ps_alive of server "), std::string::npos)
      << reason;
  // Not before the bound (load only delays the report).
  EXPECT_GE(after_s, o.after_loss_timeout_s) << reason;
  for (const std::string& line : log.holding("trainer 1 of 3")) ADD_FAILURE() << line;
}

// Trainer 1 began run 1 and finished it (its finished flag this run's; it never beats again);
// then the table is zeroed (a first server restarted empty), its flags with it. Trainer 0's watch,
// which read it finished, never names it, after the bound after the loss neither (before, its
// flags gone, it was judged as one not begun and named then).
TEST_F(PsPeerWatchTest, ATrainerThatFinishedBeforeTheTableIsLostIsNotJudged) {
  reset(2);
  PsPeerWatchOptions o = options();
  o.after_loss_timeout_s = kTimeout;
  Losses losses;
  PsPeerWatch watch(*clients_[0], 0, 2, o, losses.callback());
  std::vector<float> finished(PsPeerWatch::kAliveSections * 2, 0.0f);
  finished[1] = 1.0f;
  finished[PsPeerWatch::kFinishedSection * 2 + 1] = 1.0f;
  finished[PsPeerWatch::kBegunSection * 2 + 1] = 1.0f;
  ASSERT_TRUE(clients_[1]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &finished).ok());
  ASSERT_TRUE(beaten_after(2, 1, {0}, 2)) << "trainer 0 did not beat";
  ASSERT_TRUE(zero_alive_table(2));
  ASSERT_TRUE(begun_again(2, 0, 1.0f)) << "trainer 0's watch did not beat after the loss";
  std::this_thread::sleep_for(std::chrono::duration<double>(o.after_loss_timeout_s));
  quiet_window();
  EXPECT_TRUE(losses.reasons().empty()) << losses.reasons().front();
}

// A job long enough for its beat counts to reach 2^23 (kBeatWrap; a count kept going stopped at
// 2^24, the last integer a float holds exactly, and its trainer was found lost); here they start
// just below it. Each count crosses it and goes back (it wrapped), goes on moving, and nobody is
// lost.
TEST_F(PsPeerWatchTest, BeatCountsWrapAt2To23AndGoOnMoving) {
  reset(2);
  const float start = PsPeerWatch::kBeatWrap - 2.0f;
  std::vector<float> long_job = {start, start, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  ASSERT_TRUE(clients_[2]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &long_job).ok());
  Losses losses0;
  Losses losses1;
  PsPeerWatch watch0(*clients_[0], 0, 2, options(), losses0.callback());
  PsPeerWatch watch1(*clients_[1], 1, 2, options(), losses1.callback());
  // Each count reached kBeatWrap, went back below its start, and moved on from there.
  std::vector<float> peak(2, start);
  std::vector<float> wrapped_at(2, -1.0f);
  std::vector<bool> moved_on(2, false);
  const auto until = Clock::now() + std::chrono::seconds(15);
  while (Clock::now() < until && !(moved_on[0] && moved_on[1])) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const std::vector<float> now = beats(2);
    for (std::size_t w = 0; w < now.size(); ++w) {
      peak[w] = std::max(peak[w], now[w]);
      if (wrapped_at[w] < 0 && now[w] < start) wrapped_at[w] = now[w];
      if (wrapped_at[w] >= 0 && now[w] > wrapped_at[w]) moved_on[w] = true;
    }
  }
  for (std::size_t w = 0; w < 2; ++w) {
    // A read every 20 ms may miss the count's beat at kBeatWrap itself (one beat interval).
    EXPECT_GE(peak[w], PsPeerWatch::kBeatWrap - 1.0f) << "trainer " << w;
    EXPECT_TRUE(moved_on[w]) << "trainer " << w << ": wrapped at " << wrapped_at[w];
    // Set only once read below `start` (-1 until then): it went back, to 1 or above.
    EXPECT_GE(wrapped_at[w], 1.0f) << "trainer " << w;
  }
  quiet_window();  // past a timeout of silence after the old count's stop, several times over
  EXPECT_TRUE(losses0.reasons().empty()) << losses0.reasons().front();
  EXPECT_TRUE(losses1.reasons().empty()) << losses1.reasons().front();
}

// Trainer 1 (begun in run 1) had reached kBeatWrap when trainer 0 marked its failure; its next
// beat wrapped its count to 1, a beat past the mark (its watch saw the mark): trainer 0's wait for
// the others to see it ends at once (before: the fall was taken for a reset of the beats, and the
// wait went on for the next beat; here there is none, so it timed out).
TEST_F(PsPeerWatchTest, AWrapPastTheMarkIsABeatThatSawIt) {
  reset(2);
  std::vector<float> at_mark = {0.0f, PsPeerWatch::kBeatWrap, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 1.0f};
  std::vector<float> held = at_mark;
  ASSERT_TRUE(clients_[1]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &held).ok());
  PsPeerWatch watch(*clients_[0], 0, 2, options());
  std::vector<float> wrap(PsPeerWatch::kAliveSections * 2, 0.0f);
  wrap[1] = 1.0f - PsPeerWatch::kBeatWrap;
  ASSERT_TRUE(clients_[1]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &wrap).ok());
  ASSERT_EQ(beats(2).at(1), 1.0f);
  const Status seen = watch.wait_until_failure_seen(at_mark, 2 * kTimeout, nullptr);
  EXPECT_TRUE(seen.ok()) << seen.to_string();
}

// As above, but trainer 1 was a beat below kBeatWrap at the mark: its next beats took its count to
// kBeatWrap, then wrapped it to 1, a fall of kBeatWrap - 2 (both past the mark; the wait reads
// after both): the wait ends at once (before: a fall of less than kBeatWrap - 1 was taken for a
// reset, and the wait timed out).
TEST_F(PsPeerWatchTest, TwoBeatsPastAMarkJustBelowTheWrapAreSeen) {
  reset(2);
  std::vector<float> at_mark = {0.0f, PsPeerWatch::kBeatWrap - 1.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f,
                                1.0f};
  std::vector<float> held = at_mark;
  ASSERT_TRUE(clients_[1]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &held).ok());
  PsPeerWatch watch(*clients_[0], 0, 2, options());
  std::vector<float> beat(PsPeerWatch::kAliveSections * 2, 0.0f);
  beat[1] = 1.0f;
  ASSERT_TRUE(clients_[1]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &beat).ok());
  std::vector<float> wrap(PsPeerWatch::kAliveSections * 2, 0.0f);
  wrap[1] = 1.0f - PsPeerWatch::kBeatWrap;
  ASSERT_TRUE(clients_[1]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &wrap).ok());
  ASSERT_EQ(beats(2).at(1), 1.0f);
  const Status seen = watch.wait_until_failure_seen(at_mark, 2 * kTimeout, nullptr);
  EXPECT_TRUE(seen.ok()) << seen.to_string();
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
  // Both began run 1 (and stopped beating as they failed): not judged by their silence besides.
  std::vector<float> began(PsPeerWatch::kAliveSections * 3, 0.0f);
  began[PsPeerWatch::kBegunSection * 3 + 1] = 1.0f;
  began[PsPeerWatch::kBegunSection * 3 + 2] = 1.0f;
  ASSERT_TRUE(clients_[1]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &began).ok());
  ASSERT_TRUE(mark(1, "one"));
  ASSERT_TRUE(mark(2, "two"));
  {
    LogLines log;
    Losses losses;
    PsPeerWatch survivor(*clients_[0], 0, 3, options(), losses.callback());
    ASSERT_TRUE(losses.wait_for_report()) << "the failures were never reported";
    EXPECT_EQ(losses.reasons().at(0), both);
    EXPECT_EQ(survivor.lost(), both);
    quiet_window();  // the failed trainers, begun and silent, are not found lost besides
    for (const std::string& line : log.holding("lost trainer")) ADD_FAILURE() << line;
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

// As TwoTrainersFailingAtOnceAreBothReported's second half, with the process's forced end armed:
// the failure seen at a later beat is named in its line too, not the first alone.
TEST_F(PsPeerWatchTest, TheForcedEndNamesEveryFailureSeenBeforeItFires) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto job = [&] {
    const auto mark = [&](int trainer, const std::string& reason) {
      return PsPeerWatch::mark_failed(*clients_[static_cast<std::size_t>(trainer)], trainer, 3,
                                      reason, FailureNotice::kToWatches, /*run=*/1)
          .ok();
    };
    reset(3);
    PsPeerWatchOptions o = options();
    o.exit_grace_s = 5;
    Losses losses;
    PsPeerWatch survivor(*clients_[0], 0, 3, o, losses.callback());
    ASSERT_TRUE(mark(1, "one"));
    ASSERT_TRUE(losses.wait_for_report()) << "trainer 1's failure was never reported";
    ASSERT_TRUE(mark(2, "two"));
    std::this_thread::sleep_for(std::chrono::seconds(20));
    std::fprintf(stderr, "still running\n");
    std::fflush(stderr);
    std::_Exit(7);
  };
  EXPECT_EXIT(job(), ::testing::ExitedWithCode(1),
              "trainer 1 of 3 failed: one; trainer 2 of 3 failed: two \\(the trainer had not");
}

// A server lost while the watch reports another trainer's failure (its callback running, the
// forced end not armed yet): the end stays when the watch is destroyed (the teardown may hang on
// that server), as for a server lost after the end was armed, and its line names both losses.
TEST_F(PsPeerWatchTest, AServerLostAsAFailureIsReportedKeepsTheForcedEnd) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto job = [&] {
    reset(2);
    LogLines log;
    PsPeerWatchOptions o = options();
    o.exit_grace_s = 5;
    std::atomic<bool> reported{false};
    const auto server_goes = [&](const std::string&) {
      server_->stop();
      server_->wait();
      const auto until = Clock::now() + std::chrono::seconds(10);
      while (log.holding("lost server").empty() && Clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      reported.store(true);
    };
    {
      PsPeerWatch survivor(*clients_[0], 0, 2, o, server_goes);
      ASSERT_TRUE(PsPeerWatch::mark_failed(*clients_[1], 1, 2, "one", FailureNotice::kToWatches,
                                           /*run=*/1)
                      .ok());
      const auto until = Clock::now() + std::chrono::seconds(20);
      while (!reported.load() && Clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      ASSERT_FALSE(log.holding("lost server").empty()) << "the server was never lost";
    }
    // The destructor returned before the end fired (else the end shows nothing of it).
    std::fprintf(stderr, "the watch is destroyed\n");
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::seconds(10));  // twice exit_grace_s
    std::fprintf(stderr, "still running\n");
    std::fflush(stderr);
    std::_Exit(7);
  };
  // The end's line names the server too (lost() does), not the failure alone.
  EXPECT_EXIT(job(), ::testing::ExitedWithCode(1),
              "the watch is destroyed.*trainer 1 of 2 failed: one; lost server .* \\(the trainer");
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes::edges_test
