// How a PS trainer that fails for good tells the others (PsPeerWatch's failure marks), in the
// orders of threads that used to lose or misread a mark, each forced by the test (a server's
// fault hook, PsTrainer's order hook, the order the test calls train() in) rather than by sleeps:
// - a mark left by an earlier train() of the same objects is not reported by a watch of the next
//   one, which a trainer may begin before the marked trainer takes its mark back;
// - nor do a finished flag or a beat count an earlier train() left hide a trainer dead in the
//   next one, or get one beginning it late judged lost (a negative check waits a few timeouts);
// - a trainer whose watch of the run before still beats as another begins the next is not judged
//   in the next until it begins it (its begun flag; no bound judges one that never begins a run
//   after the first, found at that run's first meeting: ps_peer_watch_edges_test); one that began
//   it and never beat again is;
// - a recovery's reset of the beats keeps a mark made between its read and its change;
// - a failed trainer's wait for the others' watches ends at once when they saw the mark before the
//   wait began;
// - a sync job's trainer slower to read the job's id than trainer 0 is to write its token into
//   runner.model_save_path still joins trainer 0's job (the token is the job's id);
// - a trainer that came alone to a recovery's meeting counts trainer 0's parts after the run as
//   trainer 0 does.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/status.hpp"
#include "common/thread_annotations.hpp"
#include "table/server/protocol.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/server/server.hpp"
#include "tests/trainer/ps_modes_fixture.hpp"
#include "tests/trainer/ps_peer_watch_fixture.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/ps_modes/ps_peer_watch.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/schedule/trainer_env.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

namespace fs = std::filesystem;
using ps_test::PsModes;
using table::server::DenseAction;
using table::server::RemoteHostTier;
using watch_test::Clock;
using watch_test::kTimeout;
using watch_test::Losses;
using watch_test::options;

// Named points the test's threads reach, awaited by others. The wait is bounded (a point never
// reached fails the test instead of hanging it); what it waits for is an order, not a time.
class Milestones {
 public:
  void reach(const std::string& point) {
    {
      MutexLock lock(mu_);
      reached_.insert(point);
    }
    cv_.notify_all();
  }
  bool reached(const std::string& point) const {
    MutexLock lock(mu_);
    return reached_.count(point) > 0;
  }
  // Whether `point` was reached (within 120 s: a loaded machine).
  bool await(const std::string& point) {
    MutexLock lock(mu_);
    const auto until = Clock::now() + std::chrono::seconds(120);
    while (reached_.count(point) == 0) {
      if (cv_.wait_until(lock, until) == std::cv_status::timeout) break;
    }
    return reached_.count(point) > 0;
  }

 private:
  mutable Mutex mu_;
  CondVar cv_;
  std::set<std::string> reached_ GPUBOX_GUARDED_BY(mu_);
};

// kAliveTable of a job of `trainers` as `servers` reads it (empty when it cannot).
std::vector<float> alive_table(RemoteHostTier& servers, int trainers) {
  std::vector<float> values(PsPeerWatch::kAliveSections * static_cast<std::size_t>(trainers), 0.0f);
  if (!servers.dense(DenseAction::kRead, PsPeerWatch::kAliveTable, &values).ok()) return {};
  return values;
}

// The watch's tests with a server whose fault hook runs `between_` on a server thread once the
// server applied the next DENSE request of the client `between_client_` names, before it
// replies: what another client does there lands between that request and the next.
class PsPeerWatchTelling : public watch_test::PsPeerWatchTest {
 protected:
  table::server::ServerOptions server_options() override {
    table::server::ServerOptions o;
    o.threads = 2;  // one runs the hook while the other serves what it sends
    o.drop_reply = [this](const table::server::FrameHeader& header) {
      uint64_t armed = header.client_id;
      if (header.op == table::server::Op::kDense && armed != 0 &&
          between_client_.compare_exchange_strong(armed, 0)) {
        between_();
      }
      return false;
    };
    return o;
  }

  // The server stops before this fixture's members go (its threads call the hook).
  void TearDown() override {
    if (server_) {
      server_->stop();
      server_->wait();
    }
  }

  std::function<void()> between_;  // set before between_client_
  std::atomic<uint64_t> between_client_{0};
};

// Trainer 1 failed in the job's first run (train()) and has not begun the second, its mark still
// set; trainer 0 began the second: its watch (run 2) neither reports that mark nor judges trainer
// 1, whose count stopped with the first run, lost. Once trainer 1 marks a failure of run 2 (its
// mark replacing the old one), trainer 0's watch reports that one.
TEST_F(PsPeerWatchTelling, AMarkOfAnEarlierRunIsNeitherReportedNorALoss) {
  reset(2);
  std::vector<float> first_run_beats = {0.0f, 3.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 1.0f};
  ASSERT_TRUE(
      clients_[0]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &first_run_beats).ok());
  ASSERT_TRUE(PsPeerWatch::mark_failed(*clients_[1], 1, 2, "run 1: unreadable data",
                                       FailureNotice::kToWatches, /*run=*/1)
                  .ok());
  PsPeerWatchOptions second_run = options();
  second_run.run = 2;
  Losses losses;
  PsPeerWatch watch(*clients_[0], 0, 2, second_run, losses.callback());
  ASSERT_TRUE(beaten_after(2, 0, {0}, 2)) << "trainer 0 did not beat";
  StatusOr<int> flagged = PsPeerWatch::failed_peer(*clients_[0], 0, 2, /*run=*/2);
  ASSERT_TRUE(flagged.ok()) << flagged.status().to_string();
  EXPECT_EQ(*flagged, -1);
  flagged = PsPeerWatch::failed_peer(*clients_[0], 0, 2, /*run=*/1);
  ASSERT_TRUE(flagged.ok()) << flagged.status().to_string();
  EXPECT_EQ(*flagged, 1);
  // Past runner.peer_timeout_s of trainer 1's silence: not lost either (it has not begun run 2).
  EXPECT_EQ(losses.reports_after_quiet_window(), 0u) << losses.reasons().front();
  EXPECT_EQ(watch.lost(), "");

  ASSERT_TRUE(PsPeerWatch::mark_failed(*clients_[1], 1, 2, "run 2: diverged",
                                       FailureNotice::kToWatches, /*run=*/2)
                  .ok());
  ASSERT_TRUE(losses.wait_for_report()) << "trainer 1's failure in run 2 was never reported";
  EXPECT_EQ(losses.reasons().at(0), "trainer 1 of 2 failed: run 2: diverged");
}

// Run 1 of the job ended well: both trainers beat and finished (their finished flags set). In run
// 2 trainer 1 dies (its beats stop, no finish()): trainer 0's watch of run 2 finds it lost, its
// finished flag being run 1's. And a failed trainer's wait in run 2 waits for a trainer that
// finished run 1 only and has not beaten past the mark.
TEST_F(PsPeerWatchTelling, ATrainerThatFinishedTheFirstRunIsLostInTheSecond) {
  reset(2);
  for (int w = 0; w < 2; ++w) {
    PsPeerWatch first_run(*clients_[static_cast<std::size_t>(w)], w, 2, options());
    ASSERT_TRUE(beaten_after(2, w, {w}, 1)) << "trainer " << w << " did not beat";
    ASSERT_TRUE(first_run.finish().ok());
  }
  const std::vector<float> after_run_1 = alive_table(*clients_[0], 2);
  ASSERT_EQ(after_run_1.size(), 8u);
  EXPECT_EQ(after_run_1[2], 1.0f);  // the finished flags hold the run
  EXPECT_EQ(after_run_1[3], 1.0f);
  PsPeerWatchOptions second_run = options();
  second_run.run = 2;
  {
    Losses losses;
    PsPeerWatch survivor(*clients_[0], 0, 2, second_run, losses.callback());
    // Trainer 0's watch read the counts once (they move for it from there), then trainer 1 beats.
    ASSERT_TRUE(beaten_after(2, 0, {0}, 1)) << "trainer 0 did not beat";
    {
      PsPeerWatch dying(*clients_[1], 1, 2, second_run);
      ASSERT_TRUE(beaten_after(2, 1, {1}, 1)) << "trainer 1 did not beat";
    }  // trainer 1's process "dies" in run 2
    ASSERT_TRUE(losses.wait_for_report()) << "trainer 1, dead in run 2, was never lost";
    EXPECT_NE(losses.reasons().at(0).find("lost trainer 1 of 2"), std::string::npos)
        << losses.reasons().at(0);
  }  // trainer 0's watch stops too

  // Trainer 0 finished run 1, began run 2 and has not beaten since (stopped): trainer 1's wait for
  // its watch to see trainer 1's mark of run 2 runs out naming it (a finished flag of run 1 is not
  // run 2's).
  reset(2);
  std::vector<float> run_1_ended = {5.0f, 5.0f, 1.0f, 1.0f, 0.0f, 0.0f, 2.0f, 0.0f};
  ASSERT_TRUE(clients_[0]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &run_1_ended).ok());
  PsPeerWatch failing(*clients_[1], 1, 2, second_run);
  std::vector<float> alive_at_mark;
  ASSERT_TRUE(PsPeerWatch::mark_failed(*clients_[1], 1, 2, "run 2: diverged",
                                       FailureNotice::kToWatches, /*run=*/2, &alive_at_mark)
                  .ok());
  const Status unseen = failing.wait_until_failure_seen(alive_at_mark, kTimeout, nullptr);
  EXPECT_EQ(unseen.code(), Status::Code::kDeadlineExceeded) << unseen.to_string();
  EXPECT_NE(unseen.message().find("the watch of trainer(s) 0 did not beat"), std::string::npos)
      << unseen.to_string();
}

// Trainer 1's run 1 ended by another's failure (PeerFailed): its count stays above 0, with no
// finished or failed flag. Trainer 0 begins run 2 and trainer 1 comes more than
// runner.peer_timeout_s later: trainer 0's watch does not judge it lost meanwhile (its count has
// not moved in run 2: it has not begun), and once it began and died, does.
TEST_F(PsPeerWatchTelling, ATrainerBeginningTheSecondRunLateIsNotLost) {
  reset(2);
  std::vector<float> run_1_ended = {7.0f, 6.0f, 0.0f, 0.0f, 0.0f, 0.0f, 1.0f, 1.0f};
  ASSERT_TRUE(clients_[0]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &run_1_ended).ok());
  PsPeerWatchOptions second_run = options();
  second_run.run = 2;
  Losses losses;
  PsPeerWatch early(*clients_[0], 0, 2, second_run, losses.callback());
  ASSERT_TRUE(beaten_after(2, 0, {0}, 2)) << "trainer 0 did not beat";
  // Past runner.peer_timeout_s of trainer 1's silence (3 timeouts): not lost.
  EXPECT_EQ(losses.reports_after_quiet_window(), 0u) << losses.reasons().front();
  EXPECT_EQ(early.lost(), "");
  {
    PsPeerWatch late(*clients_[1], 1, 2, second_run);
    ASSERT_TRUE(beaten_after(2, 1, {1}, 1)) << "trainer 1 did not beat";
  }  // trainer 1 began run 2 and died
  ASSERT_TRUE(losses.wait_for_report()) << "trainer 1, dead in run 2, was never lost";
  EXPECT_NE(losses.reasons().at(0).find("lost trainer 1 of 2"), std::string::npos)
      << losses.reasons().at(0);
}

// Trainer 1 is slower to leave run 1 (its last meeting): its watch of run 1 still beats while
// trainer 0 begins run 2, then stops, and trainer 1 begins run 2 more than runner.peer_timeout_s
// later. Trainer 0's watch of run 2 saw trainer 1's count move, but trainer 1 had not begun run 2
// (its begun flag run 1's): not judged, so not lost, until it begins.
TEST_F(PsPeerWatchTelling, ATrainerStillBeatingInTheRunBeforeIsNotLostInTheNext) {
  reset(2);
  PsPeerWatchOptions second_run = options();
  second_run.run = 2;
  auto leaving_run_1 = std::make_unique<PsPeerWatch>(*clients_[1], 1, 2, options());
  ASSERT_TRUE(beaten_after(2, 1, {1}, 1)) << "trainer 1 did not beat";
  Losses losses;
  PsPeerWatch early(*clients_[0], 0, 2, second_run, losses.callback());
  // Trainer 0's watch read trainer 1's count several times as it moved.
  ASSERT_TRUE(beaten_after(2, 0, {0, 1}, 3)) << "the trainers did not beat";
  leaving_run_1.reset();  // trainer 1's run 1 ends; it has not begun run 2
  // Past runner.peer_timeout_s of trainer 1's silence (3 timeouts): not lost.
  EXPECT_EQ(losses.reports_after_quiet_window(), 0u) << losses.reasons().front();
  EXPECT_EQ(early.lost(), "");
  {
    PsPeerWatch late(*clients_[1], 1, 2, second_run);
    ASSERT_TRUE(beaten_after(2, 1, {0, 1}, 2)) << "trainer 1 did not beat in run 2";
    EXPECT_EQ(early.lost(), "");
    const std::vector<float> table = alive_table(*clients_[0], 2);
    ASSERT_EQ(table.size(), 8u);
    EXPECT_EQ(table[PsPeerWatch::kBegunSection * 2 + 1], 2.0f);  // its begun flag: run 2
  }                                                              // trainer 1 began run 2 and died
  ASSERT_TRUE(losses.wait_for_report()) << "trainer 1, dead in run 2, was never lost";
  EXPECT_NE(losses.reasons().at(0).find("lost trainer 1 of 2"), std::string::npos)
      << losses.reasons().at(0);
}

// Trainer 1 began run 2 (its begun flag set) and died before its count moved again: trainer 0's
// watch of run 2, started after, times its silence from its own start and finds it lost.
TEST_F(PsPeerWatchTelling, ATrainerThatBeganTheRunAndNeverBeatAgainIsLost) {
  reset(2);
  std::vector<float> began_run_2 = {7.0f, 6.0f, 1.0f, 1.0f, 0.0f, 0.0f, 1.0f, 2.0f};
  ASSERT_TRUE(clients_[0]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &began_run_2).ok());
  PsPeerWatchOptions second_run = options();
  second_run.run = 2;
  Losses losses;
  PsPeerWatch watch(*clients_[0], 0, 2, second_run, losses.callback());
  ASSERT_TRUE(losses.wait_for_report()) << "trainer 1, dead in run 2, was never lost";
  EXPECT_NE(losses.reasons().at(0).find("lost trainer 1 of 2"), std::string::npos)
      << losses.reasons().at(0);
}

// The first server restarted empty (its table recreated with zeros, as the recovery's first read
// does): every begun flag is lost while both watches beat. Each watch's next beats set its own
// again, so a trainer that dies after that is still found lost.
TEST_F(PsPeerWatchTelling, ATrainerIsJudgedAgainAfterTheFirstServerLostTheBegunFlags) {
  reset(2);
  Losses losses;
  PsPeerWatch survivor(*clients_[0], 0, 2, options(), losses.callback());
  {
    PsPeerWatch dying(*clients_[1], 1, 2, options());
    ASSERT_TRUE(beaten_after(2, 1, {0}, 2)) << "the trainers did not beat";
    std::vector<float> emptied(PsPeerWatch::kAliveSections * 2, 0.0f);
    ASSERT_TRUE(clients_[0]->dense(DenseAction::kWrite, PsPeerWatch::kAliveTable, &emptied).ok());
    ASSERT_TRUE(beaten_after(2, 1, {0}, 2)) << "the trainers did not beat again";
  }  // trainer 1's process "dies": no finish()
  ASSERT_TRUE(losses.wait_for_report()) << "trainer 1 was never lost after the table was emptied";
  EXPECT_NE(losses.reasons().at(0).find("lost trainer 1 of 2"), std::string::npos)
      << losses.reasons().at(0);
}

// A recovery's reset (trainer 0 restarting the job's beats) reads the table and then changes it:
// trainer 1's mark, made right between (the server's hook), stays, as do the beats it adds.
TEST_F(PsPeerWatchTelling, ARecoverysResetKeepsAMarkMadeBetweenItsReadAndItsChange) {
  reset(2);
  std::vector<float> beats_before = {3.0f, 4.0f, 0.0f, 0.0f, 0.0f, 0.0f, 1.0f, 1.0f};
  ASSERT_TRUE(clients_[0]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &beats_before).ok());
  std::atomic<bool> marked{false};
  between_ = [&] {
    std::vector<float> beat = {0.0f, 1.0f, 0.0f, 0.0f,
                               0.0f, 0.0f, 0.0f, 0.0f};  // trainer 1's watch beats
    marked = clients_[1]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &beat).ok() &&
             PsPeerWatch::mark_failed(*clients_[1], 1, 2, "unreadable data",
                                      FailureNotice::kToWatches, /*run=*/1)
                 .ok();
  };
  between_client_ = clients_[2]->client_id();
  ASSERT_TRUE(PsPeerWatch::reset(*clients_[2], 2, /*keep_failures=*/true).ok());
  ASSERT_EQ(between_client_.load(), 0u) << "the reset sent the server no DENSE request";
  ASSERT_TRUE(marked.load());
  // The beat made in between stays counted; the mark stays.
  EXPECT_EQ(alive_table(*clients_[0], 2),
            std::vector<float>({0.0f, 1.0f, 0.0f, 0.0f, 0.0f, 1.0f, 1.0f, 1.0f}));
  StatusOr<std::string> mark = PsPeerWatch::failure_of(*clients_[0], 1, 2, PsPeerWatch::kAnyRun);
  ASSERT_TRUE(mark.ok()) << mark.status().to_string();
  EXPECT_EQ(*mark, "unreadable data");
}

// Trainer 0's watch saw trainer 1's mark and trainer 0 stopped (its train() unwound: no more
// beats, no finished flag) before trainer 1's wait for the watches began: the wait ends at once,
// the mark's own add having counted the beats it waits past. One that never beat past the mark
// is named when the wait runs out.
TEST_F(PsPeerWatchTelling, TheWaitForTheMarkToBeSeenCountsABeatBeforeIt) {
  reset(2);
  Losses losses;
  auto survivor = std::make_unique<PsPeerWatch>(*clients_[0], 0, 2, options(), losses.callback());
  PsPeerWatch failing(*clients_[1], 1, 2, options());
  ASSERT_TRUE(beaten_after(2, 1, {0}, 1)) << "the trainers did not beat";
  std::vector<float> alive_at_mark;
  ASSERT_TRUE(PsPeerWatch::mark_failed(*clients_[1], 1, 2, "pass 0 diverged",
                                       FailureNotice::kToWatches, 1, &alive_at_mark)
                  .ok());
  ASSERT_EQ(alive_at_mark.size(), 8u);
  EXPECT_EQ(alive_at_mark[5], 1.0f);  // the table as the flag's add left it
  ASSERT_TRUE(losses.wait_for_report()) << "trainer 0's watch never saw the mark";
  survivor.reset();
  // Bounded by 3 timeouts only so that a broken wait fails the test instead of hanging it.
  const Status seen = failing.wait_until_failure_seen(alive_at_mark, 3 * kTimeout, nullptr);
  EXPECT_TRUE(seen.ok()) << seen.to_string();

  // A watch that never beat past it: trainer 0 of a new job beat once, then stopped.
  reset(2);
  std::vector<float> one_beat = {1.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0.0f};
  ASSERT_TRUE(clients_[0]->dense(DenseAction::kAdd, PsPeerWatch::kAliveTable, &one_beat).ok());
  ASSERT_TRUE(PsPeerWatch::mark_failed(*clients_[1], 1, 2, "pass 0 diverged",
                                       FailureNotice::kToWatches, 1, &alive_at_mark)
                  .ok());
  const Status unseen = failing.wait_until_failure_seen(alive_at_mark, kTimeout, nullptr);
  EXPECT_EQ(unseen.code(), Status::Code::kDeadlineExceeded) << unseen.to_string();
  EXPECT_NE(unseen.message().find("the watch of trainer(s) 0 did not beat"), std::string::npos)
      << unseen.to_string();
  // A wait that ends before its first read names no trainer, and says so.
  const Status unread = failing.wait_until_failure_seen(alive_at_mark, 0, nullptr);
  EXPECT_EQ(unread.code(), Status::Code::kDeadlineExceeded) << unread.to_string();
  EXPECT_NE(unread.message().find("no other trainer's watch was seen to beat within 0 s"),
            std::string::npos)
      << unread.to_string();
}

// The error `train` threw ("" for none).
std::string error_of(const std::function<void()>& train) {
  try {
    train();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Waits until trainer 0's beat count on `servers` rose by 2 from now (its watch beat twice, so
// the first of those beats was handled: a report it made is in), or `ended` was reached.
bool trainer_zero_beat_twice(RemoteHostTier& servers, Milestones& milestones,
                             const std::string& ended) {
  const std::vector<float> before = alive_table(servers, 2);
  const auto until = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < until && !milestones.reached(ended)) {
    const std::vector<float> now = alive_table(servers, 2);
    if (!before.empty() && !now.empty() && now[0] >= before[0] + 2) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// A C++ program's loop: the job's trainers call train() twice on the same objects. In the first
// run trainer 1 fails (its data folder is empty) and marks its failure; trainer 0, failing after
// it, marks none. Data arrive, and trainer 0 begins the second run first: its watch beats twice
// before trainer 1 begins it (taking its mark back). The mark is the first run's: trainer 0's
// watch does not report it, and both trainers train the second run.
TEST_F(PsModes, ASecondTrainIsNotStoppedByTheFirstRunsMark) {
  const fs::path data = root_ / "second_run_data";
  fs::create_directories(data);  // empty for the first run
  const TrainerConfig cfg = config(
      {"runner.train_data_dir=" + data.string(), "runner.test_data_dir=", "runner.sync_mode=async",
       "runner.epochs=1", "runner.peer_timeout_s=10", "runner.collective_timeout_s=60"});
  Servers shards(cfg, 1);
  Milestones milestones;
  std::vector<std::string> first(2);
  std::vector<std::string> second(2);
  const ps_test::TrainerJob job =
      ps_test::run_trainers(cfg, shards.endpoints(), 2, [&](PsTrainer& trainer, int w) {
        const auto at = static_cast<std::size_t>(w);
        if (w == 0) {
          EXPECT_TRUE(milestones.await("trainer 1 ended run 1"));
        }
        first[at] = error_of([&] { trainer.train(); });
        if (w == 1) {
          milestones.reach("trainer 1 ended run 1");
          EXPECT_TRUE(milestones.await("trainer 0 begins run 2"));
          auto& servers = dynamic_cast<RemoteHostTier&>(trainer.host_tier());
          EXPECT_TRUE(trainer_zero_beat_twice(servers, milestones, "trainer 0 ended run 2"))
              << "trainer 0's watch of run 2 did not beat twice";
          second[at] = error_of([&] { trainer.train(); });
          return;
        }
        for (const std::string& file : data_files((root_ / "train").string())) {
          fs::copy_file(file, data / fs::path(file).filename());
        }
        milestones.reach("trainer 0 begins run 2");
        second[at] = error_of([&] { trainer.train(); });
        milestones.reach("trainer 0 ended run 2");
      });
  EXPECT_EQ(job.errors, std::vector<std::string>(2, ""));
  EXPECT_NE(first[1].find(data.string()), std::string::npos) << first[1];
  EXPECT_NE(first[0], "");
  EXPECT_EQ(second[0], "") << "trainer 0";
  EXPECT_EQ(second[1], "") << "trainer 1";
}

// A sync job of two trainers that recovers from saves: trainer 1 reads the job's id (in its
// constructor, after the job start's meeting) only once trainer 0, in train(), wrote its token
// into runner.model_save_path and came to the meeting after it (the order hook). The token is
// the job's id, so trainer 1 still joins trainer 0's job: their steps are summed and the job
// trains. (When trainer 0 wrote a new id as the token, trainer 1 read that one instead: its
// steps' parts went to another job, each dropping the other's held step, and the job failed.)
TEST_F(PsModes, ASyncTrainerSlowToReadTheJobsIdJoinsTrainerZerosJob) {
  const std::string saves = (root_ / "slow_reader_saves").string();
  const TrainerConfig cfg =
      config({"runner.train_data_dir=" + (root_ / "train").string(), "runner.test_data_dir=",
              "runner.sync_mode=sync", "runner.epochs=1", "runner.save_mode=checkpoint",
              "runner.model_save_path=" + saves, "runner.collective_timeout_s=120"});
  Servers shards(cfg, 1);
  Milestones milestones;
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      PsTrainer::OrderHook hook = [&, w](const std::string& point) {
        if (w == 0 && point == "meet ps/save_folder") milestones.reach("trainer 0 wrote the token");
        if (w == 1 && point == "ps/start: read the job's id" && !milestones.reached("read")) {
          milestones.reach("read");
          EXPECT_TRUE(milestones.await("trainer 0 wrote the token"));
        }
      };
      errors[static_cast<std::size_t>(w)] = error_of([&] {
        TrainerEnv env;
        env.servers = shards.endpoints();
        env.trainer_id = w;
        env.trainers = 2;
        PsTrainer trainer(cfg, env, hook);
        trainer.train();
      });
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_TRUE(milestones.reached("trainer 0 wrote the token"));
  EXPECT_EQ(errors[0], "") << "trainer 0";
  EXPECT_EQ(errors[1], "") << "trainer 1";
}

// A PsTrainer reused after a recovery only one trainer came to. In run 1, trainer 0's outcome of
// pass 0's save is replaced by a restart's (as if its save had found one) between its write and
// the meeting after the save (trainer 0's order hook): trainer 1 goes to the recovery's meeting,
// which trainer 0, whose run ends well, never comes to, and trainer 1's run fails there. Then the
// program has both trainers save again (save(), between train() calls): trainer 0's part, which
// trainer 1 waits for as the same part (TrainerZeroParts: the recoveries counted per run, the
// parts after a run in a stage of their own), and both save well. With the recoveries counted
// for the job, trainer 1 counted it one stage after trainer 0's, waited for a part trainer 0
// never begins and failed ("it did not begin it"), and trainer 0 with it at the meeting.
TEST_F(PsModes, ARecoveryOnlyOneTrainerCameToShiftsNoPartAfterTheRun) {
  const TrainerConfig cfg =
      config({"runner.train_data_dir=" + (root_ / "train").string(),
              "runner.test_data_dir=", "runner.sync_mode=async", "runner.epochs=1",
              "runner.save_mode=checkpoint", "runner.resume=off",
              "runner.model_save_path=" + (root_ / "one_sided_recovery").string()});
  Servers shards(cfg, 1);
  const fs::path again = root_ / "one_sided_recovery_again";
  Milestones milestones;
  std::atomic<bool> replaced{false};
  std::vector<std::string> first(2);
  std::vector<std::string> second(2);
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      const auto at = static_cast<std::size_t>(w);
      std::unique_ptr<PsTrainer> trainer;
      const PsTrainer::OrderHook hook = [&, w](const std::string& point) {
        if (w != 0 || point != "meet ps/saved/1" || replaced.exchange(true)) return;
        // PsTrainer's outcome table and its restart's outcome (ps_trainer.cpp).
        auto& servers = dynamic_cast<RemoteHostTier&>(trainer->host_tier());
        std::vector<float> outcome(4, 0.0f);
        EXPECT_TRUE(servers.dense(DenseAction::kRead, "ps_outcome", &outcome).ok());
        outcome[0] = 2.0f;
        EXPECT_TRUE(servers.dense(DenseAction::kWrite, "ps_outcome", &outcome).ok());
      };
      first[at] = error_of([&] {
        TrainerEnv env;
        env.servers = shards.endpoints();
        env.trainer_id = w;
        env.trainers = 2;
        trainer = std::make_unique<PsTrainer>(cfg, env, hook);
        trainer->train();
      });
      milestones.reach("trainer " + std::to_string(w) + " ended run 1");
      EXPECT_TRUE(milestones.await("trainer " + std::to_string(1 - w) + " ended run 1"));
      if (trainer) second[at] = error_of([&] { trainer->save(again.string()); });
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_TRUE(replaced.load());
  EXPECT_EQ(first[0], "") << "trainer 0";
  EXPECT_NE(first[1].find("to go back to the last save together"), std::string::npos) << first[1];
  EXPECT_EQ(second[0], "") << "trainer 0";
  EXPECT_EQ(second[1], "") << "trainer 1";
  EXPECT_TRUE(fs::exists(again / "MODEL_MANIFEST"));
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
