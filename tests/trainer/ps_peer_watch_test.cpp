// PsPeerWatch (the PS modes' lost-peer watch) against a loopback gpubox_server: trainers that
// beat see each other alive; one whose beats stop before it finished is named lost within about
// runner.peer_timeout_s, once; one that finished, or has not begun to beat, is never named; a
// stopped server is named by address; a table left by an earlier job is zeroed by reset(); a
// trainer that marks its failure is named failed with what it reported, cut at a character; one
// failing itself hears of no other's failure; a reported failure's forced end is cancelled at the
// watch's end.
// PsPassStop's votes through the same server: exact past 2^24 steps, filtered by pass and step, a
// second vote refused.
#include "trainer/ps_modes/ps_peer_watch.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "common/status.hpp"
#include "common/thread_annotations.hpp"
#include "table/server/ps_protocol.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"
#include "tests/trainer/ps_peer_watch_fixture.hpp"
#include "trainer/ps_modes/ps_step_hooks.hpp"
#include "trainer/schedule/lost_peers.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using table::server::testing::client_options;
using table::server::testing::connect_client;
using table::server::testing::FakeHostTier;
using table::server::testing::start_server;
using table::server::testing::test_config;
using watch_test::Clock;
using watch_test::kTimeout;
using watch_test::Losses;
using watch_test::options;
using watch_test::PsPeerWatchTest;

TEST_F(PsPeerWatchTest, TrainersThatBeatAreNeverLost) {
  reset(3);
  Losses losses;
  std::vector<std::unique_ptr<PsPeerWatch>> watches;
  for (int t = 0; t < 3; ++t) {
    watches.push_back(std::make_unique<PsPeerWatch>(*clients_[static_cast<std::size_t>(t)], t, 3,
                                                    options(), losses.callback()));
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(4 * kTimeout));
  EXPECT_TRUE(losses.reasons().empty()) << losses.reasons().front();
  for (auto& watch : watches) EXPECT_EQ(watch->lost(), "");
}

TEST_F(PsPeerWatchTest, ATrainerWhoseBeatsStopIsNamedOnceWithinTheTimeout) {
  reset(3);
  Losses survivor_losses;
  Losses other_losses;
  PsPeerWatch survivor(*clients_[0], 0, 3, options(), survivor_losses.callback());
  PsPeerWatch other(*clients_[2], 2, 3, options(), other_losses.callback());
  {
    PsPeerWatch dying(*clients_[1], 1, 3, options());
    // Until both others saw trainer 1 beat (a trainer not yet beating is not judged): each beat
    // twice after its count was above 0.
    ASSERT_TRUE(beaten_after(3, 1, {0, 2}, 2)) << "the trainers did not beat";
  }  // trainer 1's process "dies": no finish()
  // Within 10 s (wait_for_report): the time it took is not asserted beyond that, as a loaded
  // machine delays it; that it came no earlier than the timeout is (load only delays it).
  ASSERT_TRUE(survivor_losses.wait_for_report()) << "trainer 1 was never lost";
  ASSERT_TRUE(other_losses.wait_for_report()) << "trainer 1 was never lost";
  EXPECT_EQ(survivor_losses.reports_after_quiet_window(), 1u);  // once (both quiet meanwhile)
  for (const Losses* losses : {&survivor_losses, &other_losses}) {
    const auto reasons = losses->reasons();
    ASSERT_EQ(reasons.size(), 1u) << reasons.back();
    EXPECT_NE(reasons[0].find("lost trainer 1 of 3"), std::string::npos) << reasons[0];
    EXPECT_NE(reasons[0].find("runner.peer_timeout_s"), std::string::npos) << reasons[0];
    EXPECT_NE(reasons[0].find(server_->endpoint()), std::string::npos) << reasons[0];
    // Not before its silence reached the timeout, as the watch measured it (from the beat that
    // last saw trainer 1's count move to the beat that reported it).
    EXPECT_GE(silence_s(reasons[0]), kTimeout) << reasons[0];
  }
  EXPECT_NE(survivor.lost().find("lost trainer 1"), std::string::npos);
}

TEST_F(PsPeerWatchTest, ATrainerThatFinishedIsNeverLost) {
  reset(2);
  Losses losses;
  PsPeerWatch survivor(*clients_[0], 0, 2, options(), losses.callback());
  {
    PsPeerWatch done(*clients_[1], 1, 2, options());
    ASSERT_TRUE(beaten_after(2, 1, {0}, 2)) << "the trainers did not beat";
    ASSERT_TRUE(done.finish().ok());
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(4 * kTimeout));
  EXPECT_TRUE(losses.reasons().empty()) << losses.reasons().front();
}

TEST_F(PsPeerWatchTest, ATrainerNotYetBeatingIsNotJudged) {
  reset(2);
  Losses losses;
  PsPeerWatch early(*clients_[0], 0, 2, options(), losses.callback());
  // Trainer 1 reaches train() late (a slow start): no loss while its count is 0.
  std::this_thread::sleep_for(std::chrono::duration<double>(2 * kTimeout));
  PsPeerWatch late(*clients_[1], 1, 2, options());
  std::this_thread::sleep_for(std::chrono::duration<double>(2 * kTimeout));
  EXPECT_TRUE(losses.reasons().empty()) << losses.reasons().front();
}

TEST_F(PsPeerWatchTest, AStoppedServerIsNamedByAddress) {
  reset(2);
  Losses losses;
  const std::string endpoint = server_->endpoint();
  PsPeerWatch watch(*clients_[0], 0, 2, options(), losses.callback());
  PsPeerWatch peer(*clients_[1], 1, 2, options());
  ASSERT_TRUE(beaten_after(2, 1, {0}, 2)) << "the trainers did not beat";
  reader_.reset();  // before the server stops: its client would retry
  server_->stop();
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (watch.lost().empty() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string lost = watch.lost();
  EXPECT_NE(lost.find("lost server " + endpoint), std::string::npos) << lost;
}

// A server that refuses this host's AUTH proofs unchecked (its AUTH backoff, after a neighbour's
// wrong proof) still answers: pings that need a new connection count it reachable. They used to
// retry the refusal to their deadline and report "lost server ...: the network to it is down".
TEST(ServerPingsTest, AServerRefusingProofsForTheHostsBackoffIsNotLost) {
  namespace ts = table::server::testing;
  FakeHostTier table(test_config());
  table::server::ServerOptions so;
  so.auth_token = ts::kTestToken;
  so.auth_timeout_s = 0.3;
  so.auth_backoff_base_s = 30.0;
  so.auth_backoff_max_s = 30.0;
  so.idle_timeout_s = 0.2;  // the client's pooled connections go: each ping connects anew
  auto server = start_server(&table, so);
  ASSERT_TRUE(server);
  auto o = client_options(server->endpoint());
  o.auth_token = ts::kTestToken;
  auto client = connect_client(o);
  ASSERT_TRUE(client);
  {
    table::server::Connection guess = ts::raw_connection(server->port());
    const std::string wrong = std::string(ts::kTestToken).replace(0, 1, "X");
    ASSERT_EQ(ts::raw_authenticate(guess, wrong).code(), Status::Code::kPermissionDenied);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // the idle timeout's
  ServerPings pings(*client, kTimeout);
  std::vector<std::string> lost;
  const auto until = Clock::now() + std::chrono::duration<double>(3 * kTimeout);
  while (lost.empty() && Clock::now() < until) lost = pings.round();
  EXPECT_TRUE(lost.empty()) << lost.front();
  // The pings were refused, and heard so.
  bool heard = false;
  const Status st = client->ping(0, 0.3, &heard);
  EXPECT_EQ(st.code(), Status::Code::kDeadlineExceeded) << st.to_string();
  EXPECT_NE(st.message().find("too many wrong AUTH proofs"), std::string::npos) << st.to_string();
  EXPECT_TRUE(heard);
}

TEST_F(PsPeerWatchTest, ResetZeroesWhatAnEarlierJobLeft) {
  reset(2);
  {
    PsPeerWatch old(*clients_[1], 1, 2, options());
    ASSERT_TRUE(beaten_after(2, 1, {}, 0)) << "trainer 1 did not beat";
    ASSERT_TRUE(old.finish().ok());
  }
  ASSERT_TRUE(PsPeerWatch::reset(*clients_[0], 2).ok());
  std::vector<float> values(PsPeerWatch::kAliveSections * 2, 0.0f);
  ASSERT_TRUE(clients_[0]
                  ->dense(table::server::DenseAction::kRead, PsPeerWatch::kAliveTable, &values)
                  .ok());
  EXPECT_EQ(values, std::vector<float>(PsPeerWatch::kAliveSections * 2, 0.0f));
  // The old finished flag is gone: a new job's trainer 1 that beats and then stops is lost.
  Losses losses;
  PsPeerWatch watch(*clients_[0], 0, 2, options(), losses.callback());
  {
    PsPeerWatch again(*clients_[1], 1, 2, options());
    ASSERT_TRUE(beaten_after(2, 1, {0}, 2)) << "the trainers did not beat";
  }
  ASSERT_TRUE(losses.wait_for_report()) << "trainer 1 was never lost";
  ASSERT_EQ(losses.reports_after_quiet_window(), 1u) << losses.reasons().back();
  EXPECT_NE(losses.reasons()[0].find("lost trainer 1 of 2"), std::string::npos);
}

// Trainer 1 fails for good and marks it: trainer 0's watch reports it failed, naming what it
// reported, once (not again as lost when its beats stop); trainer 1's wait for that beat ends.
TEST_F(PsPeerWatchTest, AFailedTrainerIsReportedWithWhatItReported) {
  reset(2);
  Losses losses;
  PsPeerWatch survivor(*clients_[0], 0, 2, options(), losses.callback());
  {
    PsPeerWatch failing(*clients_[1], 1, 2, options());
    ASSERT_TRUE(beaten_after(2, 1, {0}, 2)) << "the trainers did not beat";
    std::vector<float> alive_at_mark;
    ASSERT_TRUE(PsPeerWatch::mark_failed(*clients_[1], 1, 2, "pass 0: no valid instance",
                                         FailureNotice::kToWatches, 1, &alive_at_mark)
                    .ok());
    const Status seen = failing.wait_until_failure_seen(alive_at_mark, 10, nullptr);
    ASSERT_TRUE(seen.ok()) << seen.to_string();
  }  // trainer 1 ends without finish()
  ASSERT_TRUE(losses.wait_for_report()) << "trainer 1's failure was never reported";
  ASSERT_EQ(losses.reports_after_quiet_window(), 1u) << losses.reasons().back();
  EXPECT_EQ(losses.reasons()[0], "trainer 1 of 2 failed: pass 0: no valid instance");
  EXPECT_EQ(survivor.lost(), losses.reasons()[0]);
}

// A second mark of a trainer in one job (a second failure, or train() again on the same object)
// replaces the first: the reason is the second's, not the bytes of both summed, and the failed
// flag stays 1; an empty reason gets a wording of its own.
TEST_F(PsPeerWatchTest, ASecondMarkReplacesTheFirst) {
  reset(2);
  ASSERT_TRUE(PsPeerWatch::mark_failed(*clients_[0], 1, 2, "first failure",
                                       FailureNotice::kToWatches, /*run=*/1)
                  .ok());
  ASSERT_TRUE(
      PsPeerWatch::mark_failed(*clients_[0], 1, 2, "second", FailureNotice::kToWatches, /*run=*/1)
          .ok());
  StatusOr<std::string> mark = PsPeerWatch::failure_of(*clients_[0], 1, 2, PsPeerWatch::kAnyRun);
  ASSERT_TRUE(mark.ok()) << mark.status().to_string();
  EXPECT_EQ(*mark, "second");
  std::vector<float> values(PsPeerWatch::kAliveSections * 2, 0.0f);
  ASSERT_TRUE(clients_[0]
                  ->dense(table::server::DenseAction::kRead, PsPeerWatch::kAliveTable, &values)
                  .ok());
  EXPECT_EQ(values[5], 1.0f);  // trainer 1's failed flag
  ASSERT_TRUE(
      PsPeerWatch::mark_failed(*clients_[0], 0, 2, "", FailureNotice::kAtMeeting, /*run=*/1).ok());
  mark = PsPeerWatch::failure_of(*clients_[0], 0, 2, PsPeerWatch::kAnyRun);
  ASSERT_TRUE(mark.ok()) << mark.status().to_string();
  EXPECT_EQ(*mark, "(it reported no reason)");
  mark = PsPeerWatch::failure_of(*clients_[0], 1, 2, PsPeerWatch::kAnyRun);
  ASSERT_TRUE(mark.ok()) << mark.status().to_string();
  EXPECT_EQ(*mark, "second");
}

// A recovery's reset (the job restarted from a save) zeroes the beats but keeps a failure marked
// just before it; clear_failure (a new train() of the marked trainer) takes the mark back.
TEST_F(PsPeerWatchTest, ARecoverysResetKeepsTheMarksAndClearFailureTakesOneBack) {
  reset(2);
  std::vector<float> beat = {3.0f, 4.0f, 0.0f, 0.0f, 0.0f, 0.0f, 1.0f, 1.0f};
  ASSERT_TRUE(
      clients_[0]->dense(table::server::DenseAction::kAdd, PsPeerWatch::kAliveTable, &beat).ok());
  ASSERT_TRUE(PsPeerWatch::mark_failed(*clients_[0], 1, 2, "unreadable data",
                                       FailureNotice::kToWatches, /*run=*/1)
                  .ok());
  ASSERT_TRUE(PsPeerWatch::reset(*clients_[0], 2, /*keep_failures=*/true).ok());
  EXPECT_EQ(beats(2), std::vector<float>(2, 0.0f));
  StatusOr<int> flagged = PsPeerWatch::failed_peer(*clients_[0], 0, 2, /*run=*/1);
  ASSERT_TRUE(flagged.ok()) << flagged.status().to_string();
  EXPECT_EQ(*flagged, 1);
  StatusOr<std::string> mark = PsPeerWatch::failure_of(*clients_[0], 1, 2, PsPeerWatch::kAnyRun);
  ASSERT_TRUE(mark.ok()) << mark.status().to_string();
  EXPECT_EQ(*mark, "unreadable data");
  ASSERT_TRUE(PsPeerWatch::clear_failure(*clients_[0], 1, 2).ok());
  flagged = PsPeerWatch::failed_peer(*clients_[0], 0, 2, /*run=*/1);
  ASSERT_TRUE(flagged.ok()) << flagged.status().to_string();
  EXPECT_EQ(*flagged, -1);
  mark = PsPeerWatch::failure_of(*clients_[0], 1, 2, PsPeerWatch::kAnyRun);
  ASSERT_TRUE(mark.ok()) << mark.status().to_string();
  EXPECT_EQ(*mark, "");
}

// Runs count from 1: run 0 (before any train()) would take every unflagged trainer as marked.
TEST_F(PsPeerWatchTest, FailedPeerRefusesRunZero) {
  reset(2);
  StatusOr<int> flagged = PsPeerWatch::failed_peer(*clients_[0], 0, 2, /*run=*/0);
  EXPECT_EQ(flagged.status().code(), Status::Code::kInvalidArgument)
      << (flagged.ok() ? "trainer " + std::to_string(*flagged) : flagged.status().to_string());
}

// A failure every trainer hits at once: a trainer that is failing itself (tell_failure began, or
// its own failed flag is set) hears of no other's failed flag, so its watch reports nothing and
// arms no forced end of its process; failed_peer names the trainer that marked first.
TEST_F(PsPeerWatchTest, AFailingTrainerHearsOfNoOtherTrainersFailure) {
  for (const bool own_flag : {false, true}) {
    SCOPED_TRACE(own_flag ? "its own failed flag set" : "tell_failure began");
    reset(2);
    StatusOr<int> first = PsPeerWatch::failed_peer(*clients_[0], 0, 2, /*run=*/1);
    ASSERT_TRUE(first.ok()) << first.status().to_string();
    EXPECT_EQ(*first, -1);
    Losses losses;
    PsPeerWatch failing(*clients_[0], 0, 2, options(), losses.callback());
    if (own_flag) {
      ASSERT_TRUE(PsPeerWatch::mark_failed(*clients_[0], 0, 2, "diverged",
                                           FailureNotice::kToWatches, /*run=*/1)
                      .ok());
    } else {
      failing.ignore_failed_peers();
    }
    {
      PsPeerWatch other(*clients_[1], 1, 2, options());
      ASSERT_TRUE(beaten_after(2, 1, {0}, 2)) << "the trainers did not beat";
      ASSERT_TRUE(PsPeerWatch::mark_failed(*clients_[1], 1, 2, "diverged",
                                           FailureNotice::kToWatches, /*run=*/1)
                      .ok());
      first = PsPeerWatch::failed_peer(*clients_[0], 0, 2, /*run=*/1);
      ASSERT_TRUE(first.ok()) << first.status().to_string();
      EXPECT_EQ(*first, 1);
      ASSERT_TRUE(beaten_after(2, 0, {0}, 2)) << "trainer 0 did not beat after the mark";
    }  // trainer 1 ends without finish(): failed, so not found lost either
    EXPECT_EQ(losses.reports_after_quiet_window(), 0u) << losses.reasons().front();
    EXPECT_EQ(failing.lost(), "");
  }
}

// A watch that reported another trainer's failure, destroyed (train() unwound: nothing of its
// trainer left blocked), cancels its forced end: the process goes on past exit_grace_s.
TEST_F(PsPeerWatchTest, TheForcedEndOfAReportedFailureIsCancelledAtTheWatchsEnd) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto job = [&] {
    reset(2);
    PsPeerWatchOptions o = options();
    o.exit_grace_s = 2;
    {
      Losses losses;
      PsPeerWatch survivor(*clients_[0], 0, 2, o, losses.callback());
      ASSERT_TRUE(PsPeerWatch::mark_failed(*clients_[1], 1, 2, "failed", FailureNotice::kToWatches,
                                           /*run=*/1)
                      .ok());
      ASSERT_TRUE(losses.wait_for_report()) << "trainer 1's failure was never reported";
    }
    std::this_thread::sleep_for(std::chrono::seconds(6));  // 3 times exit_grace_s
    std::fprintf(stderr, "still running\n");
    std::fflush(stderr);
    std::_Exit(7);
  };
  EXPECT_EXIT(job(), ::testing::ExitedWithCode(7), "still running");
}

// A failed trainer whose peers' watches do not beat (stuck, or not yet beating) waits at most its
// timeout, or until its stop flag is set.
TEST_F(PsPeerWatchTest, TheWaitForAFailureToBeSeenEndsAtTheStopFlag) {
  reset(2);
  PsPeerWatch failing(*clients_[1], 1, 2, options());
  std::vector<float> beat = {1.0f, 0.0f, 0.0f, 0.0f,
                             0.0f, 0.0f, 1.0f, 0.0f};  // trainer 0 beat once, then
  ASSERT_TRUE(clients_[0]
                  ->dense(table::server::DenseAction::kAdd, PsPeerWatch::kAliveTable, &beat)
                  .ok());  // never again
  ASSERT_TRUE(
      PsPeerWatch::mark_failed(*clients_[1], 1, 2, "failed", FailureNotice::kToWatches, /*run=*/1)
          .ok());
  std::atomic<bool> stop{true};
  EXPECT_TRUE(failing.wait_until_failure_seen({}, 600, &stop).ok());  // returns: not 600 s later
}

// What a failed trainer reported is cut to 513 bytes at a character's boundary (Python decodes it
// as UTF-8), and read back from the servers as stored.
TEST_F(PsPeerWatchTest, AReasonIsCutAtACharactersBoundary) {
  EXPECT_EQ(PsPeerWatch::stored_reason("short"), "short");
  const std::string fits(PsPeerWatch::kReasonBytes, 'a');
  EXPECT_EQ(PsPeerWatch::stored_reason(fits), fits);
  // The cut (byte 510) falls within a 2-byte and within a 3-byte character.
  for (const std::string character : {"\u00e9", "\u20ac"}) {
    const std::string prefix(509, 'a');
    const std::string reason = prefix + character + std::string(20, 'b');
    EXPECT_EQ(PsPeerWatch::stored_reason(reason), prefix + "...") << character.size();
  }
  const std::string whole = std::string(508, 'a') + "\u00e9" + std::string(20, 'b');
  EXPECT_EQ(PsPeerWatch::stored_reason(whole), std::string(508, 'a') + "\u00e9...");
  reset(2);
  ASSERT_TRUE(
      PsPeerWatch::mark_failed(*clients_[0], 1, 2, whole, FailureNotice::kAtMeeting, /*run=*/1)
          .ok());
  StatusOr<std::string> read = PsPeerWatch::failure_of(*clients_[0], 1, 2, PsPeerWatch::kAnyRun);
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  EXPECT_EQ(*read, PsPeerWatch::stored_reason(whole));
  StatusOr<std::string> none = PsPeerWatch::failure_of(*clients_[0], 0, 2, PsPeerWatch::kAnyRun);
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_EQ(*none, "");
}

// Trainer 1 stops at a step past 2^24 (a float holds it no more): trainer 0 reads the vote at
// that step in sync mode (its last barrier), not one before, and only in that pass.
TEST_F(PsPeerWatchTest, AStopVoteNamesItsPassAndExactStep) {
  ASSERT_TRUE(PsPassStop::reset(*clients_[0], 3).ok());
  const std::size_t step = (std::size_t{1} << 24) + 2;  // + 1 rounds to + 4 in a float
  std::atomic<bool> flag{true};
  PsPassStop voter(*clients_[1], 1, 3, &flag, /*pass=*/2);
  voter.before_sync_barrier(step);
  PsPassStop before(*clients_[0], 0, 3, nullptr, 2);
  before.after_sync_barrier(step - 1, /*last=*/true);
  EXPECT_FALSE(before.stopping());
  PsPassStop at(*clients_[0], 0, 3, nullptr, 2);
  at.after_sync_barrier(step, /*last=*/true);
  EXPECT_TRUE(at.stopping());
  EXPECT_TRUE(at.pass_stopped([] {}));
  PsPassStop next_pass(*clients_[2], 2, 3, nullptr, 3);
  EXPECT_FALSE(next_pass.pass_stopped([] {}));
  // The job stops after pass 2; a vote of trainer 1 in a later pass would not read back.
  PsPassStop again(*clients_[1], 1, 3, &flag, 3);
  EXPECT_THROW(again.before_sync_barrier(5), Error);
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
