// wait_for_trainer_zero, TrainerZeroWork and TrainerZeroPublishes
// (trainer/schedule/trainer_zero_work.hpp) against a loopback gpubox_server, trainer 0's table
// written directly: a table an earlier job left (its part numbered as this job's, ended) is a part
// not begun; a later part of this job is trainer 0 past it (a count that drifted); an unreadable
// table (another size: an earlier build's) or an unknown nonce ends the watching; a loss the watch
// saw fails at once; trainer 0's publishes end its part; a late end is no move, and so is a read
// that fails for a moment; a restarted first server ends trainer 0's publishing at once, and its
// publishes do not keep a restart from the last save from being adopted; a publish trainer 0 gave
// up on that the first server applies late (held in the server) lands before trainer 0's later
// publishes, of the part or of the next part, never after them; parts count from 1 again in each
// stage (trainer 0's local write of a save's dense half: trainer_zero_local_save_test.cpp). A
// waiter that must not return is given a short silence: it throws, naming why, rather than
// returning (no time is measured).
#include "trainer/schedule/trainer_zero_work.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "table/server/protocol.hpp"
#include "table/server/ps_protocol.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"
#include "tests/trainer/trainer_zero_work_util.hpp"

namespace gpubox::trainer {
namespace {

using table::server::DenseAction;
using table::server::testing::client_options;
using table::server::testing::connect_client;
using table::server::testing::FakeHostTier;
using table::server::testing::start_server;
using table::server::testing::TempDir;

using zero_test::error_of_wait;
using zero_test::kEarlierJob;
using zero_test::kJob;
using zero_test::part_of;

class TrainerZeroWorkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = start_server(&table_);
    ASSERT_TRUE(server_);
    client_ = connect_client(client_options(server_->endpoint()));
    ASSERT_TRUE(client_);
  }
  void write(std::vector<float> table) {
    ASSERT_TRUE(client_->dense(DenseAction::kWrite, TrainerZeroWork::kTable, &table).ok());
  }
  void write(const TrainerZeroPart& part, float state, uint64_t seq = 1) {
    write(TrainerZeroWork::row(part, state, 0, seq));
  }
  // Waits for `part` with a short silence; the error ("" when it returned).
  std::string wait_for(const TrainerZeroPart& part, std::string lost = "") {
    return error_of_wait(*client_, TrainerZeroWait::of(part, "to write the save S", 0.3, 3.0, "LOG",
                                                       [lost] { return lost; }));
  }

  // The table as read: its job's nonce and its state.
  std::pair<uint64_t, float> read() {
    std::vector<float> table(TrainerZeroWork::kSlots, 0.0f);
    EXPECT_TRUE(client_->dense(DenseAction::kRead, TrainerZeroWork::kTable, &table).ok());
    return {trainer_zero_job_of(table[0], table[1]), table[5]};
  }

  FakeHostTier table_{table::server::testing::test_config()};
  std::unique_ptr<table::server::Server> server_;
  std::unique_ptr<table::server::RemoteHostTier> client_;
};

TEST_F(TrainerZeroWorkTest, ThisJobsPartEndedIsWaitedOut) {
  write(part_of(kJob, 1, 0, 2), TrainerZeroWork::kEnded);
  EXPECT_EQ(wait_for(part_of(kJob, 1, 0, 2)), "");
}

// A server that outlives its jobs: the earlier job's part 1 ended is not this job's part 1.
TEST_F(TrainerZeroWorkTest, AnEarlierJobsTableIsAPartNotBegun) {
  write(part_of(kEarlierJob, 0, 0, 1), TrainerZeroWork::kEnded);
  const std::string error = wait_for(part_of(kJob, 0, 0, 1));
  EXPECT_NE(error.find("trainer 0 made no progress to write the save S for 0.3 s "
                       "(runner.collective_timeout_s): it did not begin it"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("(trainer 0's log, LOG, names"), std::string::npos) << error;
}

TEST_F(TrainerZeroWorkTest, AnEarlierPartOfThisJobIsAPartNotBegun) {
  write(part_of(kJob, 1, 0, 1), TrainerZeroWork::kEnded);
  EXPECT_NE(wait_for(part_of(kJob, 1, 0, 2)).find("it did not begin it"), std::string::npos);
}

TEST_F(TrainerZeroWorkTest, ThisJobsPartRunningThatStopsMovingFails) {
  write(part_of(kJob, 1, 0, 2), TrainerZeroWork::kRunning);
  EXPECT_NE(wait_for(part_of(kJob, 1, 0, 2)).find("its part stopped moving"), std::string::npos);
}

// A count that drifted (trainer 0 counted one part more before a recovery): trainer 0 past the
// part waited for, in its index or a later stage, is at the meeting.
TEST_F(TrainerZeroWorkTest, ALaterPartOfThisJobGoesToTheMeeting) {
  write(part_of(kJob, 1, 0, 3), TrainerZeroWork::kRunning);
  EXPECT_EQ(wait_for(part_of(kJob, 1, 0, 2)), "");
  write(part_of(kJob, 1, 1, 1), TrainerZeroWork::kRunning);
  EXPECT_EQ(wait_for(part_of(kJob, 1, 0, 5)), "");
  write(part_of(kJob, 2, 0, 1), TrainerZeroWork::kRunning);
  EXPECT_EQ(wait_for(part_of(kJob, 1, 3, 7)), "");
}

// A table of another size (an earlier build's {part, state, moves}) cannot be read: no move, and
// after the silence the waiter goes to the meeting (bounded by runner.collective_timeout_s there)
// rather than fail naming trainer 0.
TEST_F(TrainerZeroWorkTest, AnUnreadableTableEndsTheWatching) {
  write(std::vector<float>{1.0f, TrainerZeroWork::kRunning, 0.0f});
  EXPECT_EQ(wait_for(part_of(kJob, 0, 0, 1)), "");
}

TEST_F(TrainerZeroWorkTest, AnUnknownNonceIsNotWatched) {
  write(part_of(kJob, 0, 0, 1), TrainerZeroWork::kRunning);
  EXPECT_EQ(wait_for(part_of(0, 0, 0, 1)), "");
}

TEST_F(TrainerZeroWorkTest, ALossTheWatchSawFailsAtOnce) {
  write(part_of(kJob, 0, 0, 1), TrainerZeroWork::kRunning);
  const std::string error = wait_for(part_of(kJob, 0, 0, 1), "trainer 0 is lost");
  EXPECT_NE(error.find("waiting for trainer 0 to write the save S: trainer 0 is lost"),
            std::string::npos)
      << error;
}

// Trainer 0's own publishes: running while its TrainerZeroWork lives, ended after, under this
// job's nonce.
TEST_F(TrainerZeroWorkTest, TrainerZerosPartIsShownRunningThenEnded) {
  write(part_of(kEarlierJob, 0, 0, 1), TrainerZeroWork::kEnded);
  const TrainerZeroPart part = part_of(kJob, 0, 0, 1);
  TrainerZeroPublishes publishes;
  {
    TrainerZeroWork work(*client_, publishes, part, 0.01, 1.0, /*end_s=*/1.0, nullptr);
    EXPECT_NE(wait_for(part).find("its part stopped moving"), std::string::npos);
    EXPECT_EQ(read(), std::make_pair(kJob, TrainerZeroWork::kRunning));
  }
  EXPECT_EQ(wait_for(part), "");
  EXPECT_EQ(read(), std::make_pair(kJob, TrainerZeroWork::kEnded));
}

// A nonce reads back whole from the table's floats, and from the two floats PS's ps_outcome
// carries: the largest (2^48 - 1) and a drawn one.
TEST_F(TrainerZeroWorkTest, TheNonceSurvivesTheFloats) {
  for (const uint64_t job : {(uint64_t{1} << 48) - 1, draw_trainer_zero_job()}) {
    EXPECT_NE(job, 0u);
    EXPECT_LT(job, uint64_t{1} << 48);
    const std::vector<float> halves = trainer_zero_job_floats(job);
    ASSERT_EQ(halves.size(), 2u);
    EXPECT_EQ(trainer_zero_job_of(halves[0], halves[1]), job);
    write(part_of(job, 0, 0, 1), TrainerZeroWork::kEnded);
    EXPECT_EQ(read().first, job);
  }
}

// An end written late (a publish of the part with a lower seq than one already read, applied
// after it) is no move: the waiter goes on waiting, and fails when nothing newer comes.
TEST_F(TrainerZeroWorkTest, AStaleEndIsNoMove) {
  const TrainerZeroPart part = part_of(kJob, 0, 0, 1);
  write(part, TrainerZeroWork::kRunning, /*seq=*/3);
  int looks = 0;
  TrainerZeroWait wait = TrainerZeroWait::of(part, "to write the save S", 0.3, 3.0, "LOG", [&] {
    // After the first read (seq 3): the end of seq 2 arrives.
    if (++looks == 2) write(part, TrainerZeroWork::kEnded, /*seq=*/2);
    return std::string();
  });
  const std::string error = error_of_wait(*client_, wait);
  EXPECT_GE(looks, 3);
  EXPECT_NE(error.find("its part stopped moving"), std::string::npos) << error;
}

// A first server that a test stops and starts again (`second`, on the same port) under one
// client.
class TrainerZeroWorkRestart : public ::testing::Test {
 protected:
  void start(const std::string& data_dir = "") {
    options.data_dir = data_dir;
    options.port = gpubox::testing::port_below_ephemeral_range();  // `second` starts on it
    server = start_server(&first, options);
    ASSERT_TRUE(server);
    client = connect_client(client_options(server->endpoint()));
    ASSERT_TRUE(client);
  }

  FakeHostTier first{table::server::testing::test_config()};
  FakeHostTier second{table::server::testing::test_config()};
  table::server::ServerOptions options;
  std::unique_ptr<table::server::Server> server;
  std::unique_ptr<table::server::RemoteHostTier> client;
};

// A read that fails (the first server down for a moment, not Aborted) is no move: the waiter
// reads again, and once the server is back (a restart adopted quietly: this client changed
// nothing on it) it goes on watching, here a table with no part of this job, until it fails
// naming trainer 0 (before, the first failed read ended the watching).
TEST_F(TrainerZeroWorkRestart, AReadThatFailsForAMomentIsNoMove) {
  ASSERT_NO_FATAL_FAILURE(start());
  int looks = 0;
  const TrainerZeroWait wait =
      TrainerZeroWait::of(part_of(kJob, 0, 0, 1), "to write the save S", 1.0, 3.0, "LOG", [&] {
        ++looks;
        if (looks == 1) server.reset();  // the first read fails
        if (looks == 2) server = start_server(&second, options);
        return std::string();
      });
  const std::string error = error_of_wait(*client, wait);
  ASSERT_TRUE(server);
  EXPECT_GE(looks, 3);
  EXPECT_NE(error.find("it did not begin it"), std::string::npos) << error;
}

// The first server restarted during trainer 0's part (not accepted until after it: it answers
// every call Aborted): the end is not written again until call_s, nor tried again until end_s
// (which would keep trainer 0 from the meeting long past runner.collective_timeout_s). Without the
// fix this test does not end within its ctest timeout.
TEST_F(TrainerZeroWorkRestart, AFirstServerRestartedEndsThePartAtOnce) {
  ASSERT_NO_FATAL_FAILURE(start());
  // Rows the restart loses: it is not adopted quietly.
  std::vector<uint64_t> keys{5, 6, 7, 8};
  std::vector<float> rows(keys.size() * client->layout().stride(), 0.5f);
  ASSERT_TRUE(client->push(keys.data(), keys.size(), rows.data()).ok());
  TrainerZeroPublishes publishes;
  {
    TrainerZeroWork work(*client, publishes, part_of(kJob, 0, 0, 1), 0.01, /*call_s=*/3600.0,
                         /*end_s=*/3600.0, nullptr);
    server.reset();
    server = start_server(&second, options);
    ASSERT_TRUE(server);
  }
  EXPECT_FALSE(client->pending_restarts().empty());
}

// Trainer 0's publishes are no change of the first server's state: restarted from the save
// written just before them, it is adopted quietly (as with no call since the save).
TEST_F(TrainerZeroWorkRestart, PublishesDoNotKeepARestartFromTheLastSaveFromBeingAdopted) {
  table::server::testing::TempDir dir("trainer0_work_restart");
  ASSERT_NO_FATAL_FAILURE(start(dir.path().string()));
  std::vector<uint64_t> keys{5, 6, 7, 8};
  std::vector<float> rows(keys.size() * client->layout().stride(), 0.5f);
  ASSERT_TRUE(client->push(keys.data(), keys.size(), rows.data()).ok());
  ASSERT_TRUE(client->save("ckpt", table::SaveKind::kCheckpoint).ok());
  TrainerZeroPublishes publishes;
  { TrainerZeroWork work(*client, publishes, part_of(kJob, 0, 0, 1), 0.01, 3.0, 3.0, nullptr); }
  server.reset();
  auto loaded = table::server::load_before_start(&second, options, "ckpt");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  options.loaded_model = *loaded;
  server = start_server(&second, options);
  ASSERT_TRUE(server);
  const Status pulled = client->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr);
  EXPECT_TRUE(pulled.ok()) << pulled.to_string();
  EXPECT_TRUE(client->pending_restarts().empty());
}

// A DENSE request of one client that the first server holds (a request it read while its client
// gave up on it): the first copy of the client's next DENSE request after arm() waits in the
// server until release(), and the client's other copies of it (its retries) are dropped unapplied
// until stop_dropping() (the client gave up on the call). install() before the server starts;
// release() before it stops (a held thread would keep it from stopping).
class HeldRequest {
 public:
  void install(table::server::ServerOptions* options) {
    options->threads = 4;  // one holds the request while the others serve
    options->before_apply = [this](const table::server::FrameHeader& header) {
      return before_apply(header);
    };
    options->drop_reply = [this](const table::server::FrameHeader& header) {
      std::lock_guard<std::mutex> lock(mu_);
      if (released_ && header.request_id == held_id_ && std::this_thread::get_id() == holder_) {
        applied_ = true;  // the held copy was applied (or found applied before), late
        cv_.notify_all();
      }
      return false;
    };
  }
  void arm(uint64_t client_id) {
    std::lock_guard<std::mutex> lock(mu_);
    client_ = client_id;
    armed_ = true;
  }
  void stop_dropping() {
    std::lock_guard<std::mutex> lock(mu_);
    dropping_ = false;
  }
  // Lets the held copy go on, and returns once the server handled it.
  void release_and_wait() {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_NE(held_id_, 0u) << "no request was held";
    released_ = true;
    cv_.notify_all();
    if (held_id_ != 0) cv_.wait(lock, [this] { return applied_; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  bool before_apply(const table::server::FrameHeader& header) {
    std::unique_lock<std::mutex> lock(mu_);
    if (header.op != table::server::Op::kDense || header.client_id != client_) return false;
    if (armed_) {
      armed_ = false;
      dropping_ = true;
      held_id_ = header.request_id;
      holder_ = std::this_thread::get_id();
      cv_.wait(lock, [this] { return released_; });
      return false;
    }
    return dropping_ && header.request_id == held_id_;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t client_ = 0;
  bool armed_ = false;
  bool dropping_ = false;
  bool released_ = false;
  bool applied_ = false;
  uint64_t held_id_ = 0;
  std::thread::id holder_;
};

// Trainer 0's publishes through `zero`, one of them held by the first server until trainer 0 gave
// up on it, then applied late, after trainer 0's next publish; `other` follows them as a waiter.
class TrainerZeroLatePublish : public ::testing::Test {
 protected:
  void SetUp() override {
    table::server::ServerOptions options;
    held_.install(&options);
    server_ = start_server(&table_, options);
    ASSERT_TRUE(server_);
    zero_ = connect_client(client_options(server_->endpoint()));
    other_ = connect_client(client_options(server_->endpoint()));
    ASSERT_TRUE(zero_ && other_);
  }
  void TearDown() override { held_.release(); }

  // Publishes `first`, then `late` (held: trainer 0 gives up on it), then `next`; then the server
  // applies its held copy of `late`. *table: the table as `other` reads it after.
  void publish_with_a_late_copy(const std::vector<float>& first, const std::vector<float>& late,
                                const std::vector<float>& next, std::vector<float>* table) {
    TrainerZeroPublishes publishes;
    ASSERT_TRUE(publishes.publish(*zero_, first, 3.0).ok());
    held_.arm(zero_->client_id());
    EXPECT_FALSE(publishes.publish(*zero_, late, /*call_s=*/0.2).ok()) << "it was not held";
    EXPECT_TRUE(publishes.unanswered());
    held_.stop_dropping();
    const Status next_published = publishes.publish(*zero_, next, 3.0);
    EXPECT_TRUE(next_published.ok()) << next_published.to_string();
    EXPECT_FALSE(publishes.unanswered());
    held_.release_and_wait();
    table->assign(TrainerZeroWork::kSlots, 0.0f);
    EXPECT_TRUE(other_->dense(DenseAction::kRead, TrainerZeroWork::kTable, table).ok());
  }
  std::string wait_for(const TrainerZeroPart& part) {
    return error_of_wait(*other_, TrainerZeroWait::of(part, "to write the save S", 0.3, 3.0, "LOG",
                                                      [] { return std::string(); }));
  }

  // `part`'s running publish (seq 2) applied late, after its end (seq 3): the table shows the end
  // and the waiter goes to the meeting.
  void expect_a_late_running_keeps_the_end(const TrainerZeroPart& part) {
    std::vector<float> table;
    publish_with_a_late_copy(TrainerZeroWork::row(part, TrainerZeroWork::kRunning, 0, 1),
                             TrainerZeroWork::row(part, TrainerZeroWork::kRunning, 5, 2),
                             TrainerZeroWork::row(part, TrainerZeroWork::kEnded, 5, 3), &table);
    EXPECT_EQ(table, TrainerZeroWork::row(part, TrainerZeroWork::kEnded, 5, 3));
    EXPECT_EQ(wait_for(part), "");
  }

  HeldRequest held_;  // outlives the server, whose threads call it
  FakeHostTier table_{table::server::testing::test_config()};
  std::unique_ptr<table::server::Server> server_;
  std::unique_ptr<table::server::RemoteHostTier> zero_;
  std::unique_ptr<table::server::RemoteHostTier> other_;
};

// The part's running publish applied after its end: the end stays, and the waiter goes to the
// meeting. Before (every publish a new write, the end read back once), the late write showed the
// part running again, and the waiters failed after runner.collective_timeout_s naming trainer 0.
TEST_F(TrainerZeroLatePublish, ThePartsRunningAppliedLateDoesNotHideItsEnd) {
  const TrainerZeroPart part = part_of(kJob, 0, 0, 1);
  expect_a_late_running_keeps_the_end(part);
}

// The previous part's end applied after the next part began: the table shows the next part. Before,
// it showed the previous part, and the waiters failed "did not begin it".
TEST_F(TrainerZeroLatePublish, ThePreviousPartsEndAppliedLateDoesNotHideTheNextPart) {
  const TrainerZeroPart previous = part_of(kJob, 0, 0, 1);
  const TrainerZeroPart part = part_of(kJob, 0, 0, 2);
  std::vector<float> table;
  publish_with_a_late_copy(TrainerZeroWork::row(previous, TrainerZeroWork::kRunning, 0, 1),
                           TrainerZeroWork::row(previous, TrainerZeroWork::kEnded, 0, 2),
                           TrainerZeroWork::row(part, TrainerZeroWork::kRunning, 0, 1), &table);
  EXPECT_EQ(table, TrainerZeroWork::row(part, TrainerZeroWork::kRunning, 0, 1));
  // Nothing moves it after: a stall of the part, which the waiter saw begin.
  EXPECT_NE(wait_for(part).find("its part stopped moving"), std::string::npos);
}

// Two servers, the second restarted and found so by a call of trainer 0's client (its restart
// pending there, as after a SAVE that failed on it), the first answering as before: trainer 0's
// publishes to the first server go on, in order. Before publishes went out in order, a pending
// restart of any server ended the publishing after the first write, and the table showed the part
// running: the waiters failed after runner.collective_timeout_s naming trainer 0.
class TrainerZeroWorkOtherRestart : public TrainerZeroLatePublish {
 protected:
  void SetUp() override {
    using table::server::ServerOptions;
    ServerOptions options0;
    held_.install(&options0);
    options0.shard_num = 2;
    ServerOptions options1;
    options1.shard_id = 1;
    options1.shard_num = 2;
    options1.port = gpubox::testing::port_below_ephemeral_range();  // restarted on it below
    server_ = start_server(&table_, options0);
    second_ = start_server(&second_table_, options1);
    ASSERT_TRUE(server_ && second_);
    const std::string endpoints = server_->endpoint() + "," + second_->endpoint();
    zero_ = connect_client(client_options(endpoints));
    other_ = connect_client(client_options(endpoints));
    ASSERT_TRUE(zero_ && other_);
    std::vector<uint64_t> keys(32);
    for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = i + 1;
    std::vector<float> rows(keys.size() * zero_->layout().stride(), 0.5f);
    ASSERT_TRUE(zero_->push(keys.data(), keys.size(), rows.data()).ok());
    second_.reset();
    second_ = start_server(&second_again_, options1);
    ASSERT_TRUE(second_);
    EXPECT_FALSE(zero_->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr).ok());
    ASSERT_EQ(zero_->pending_restarts().size(), 1u);
    ASSERT_EQ(zero_->pending_restarts()[0].endpoint, 1u);
  }

  FakeHostTier second_table_{table::server::testing::test_config()};
  FakeHostTier second_again_{table::server::testing::test_config()};
  std::unique_ptr<table::server::Server> second_;
};

// The part's running publish applied late, after its end: the end stays; the next part is
// published running and ended by its TrainerZeroWork; the waiters of both go to the meeting.
TEST_F(TrainerZeroWorkOtherRestart, PublishesGoOnInOrderWhileAnotherServersRestartIsPending) {
  const TrainerZeroPart part = part_of(kJob, 0, 0, 1);
  expect_a_late_running_keeps_the_end(part);
  const TrainerZeroPart next = part_of(kJob, 0, 0, 2);
  TrainerZeroPublishes publishes;
  { TrainerZeroWork work(*zero_, publishes, next, 0.01, 3.0, 3.0, nullptr); }
  EXPECT_FALSE(publishes.unanswered());
  EXPECT_EQ(wait_for(next), "");
  EXPECT_EQ(zero_->pending_restarts().size(), 1u) << "the publishes accepted the restart";
}

// A part's stage and number, as the waiters compare them.
std::tuple<int64_t, int64_t, int64_t> place(const TrainerZeroPart& part) {
  return {part.run, part.recovery, part.index};
}

// Every trainer counts alike; a part one trainer skipped in a stage shifts nothing after the
// stage every trainer reaches together (a recovery, a run, the end of a run).
TEST(TrainerZeroParts, CountFromOneInEachStage) {
  TrainerZeroParts zero;
  TrainerZeroParts other;
  zero.job = kJob;
  zero.begin_run(1);
  other.begin_run(1);
  EXPECT_EQ(zero.next().index, 1);
  EXPECT_EQ(zero.next().index, 2);
  EXPECT_EQ(zero.next().job, kJob);
  EXPECT_EQ(other.next().index, 1);  // skipped two parts, failing towards a recovery
  EXPECT_EQ(zero.begin_recovery(), 1);
  EXPECT_EQ(other.begin_recovery(), 1);
  EXPECT_EQ(place(zero.next()), place(other.next()));
  EXPECT_EQ(place(zero.next()), std::make_tuple(int64_t{1}, int64_t{1}, int64_t{2}));
  zero.end_run();
  EXPECT_EQ(place(zero.next()),
            std::make_tuple(int64_t{1}, TrainerZeroPart::kAfterRun, int64_t{1}));
  zero.begin_run(2);
  EXPECT_EQ(place(zero.next()), std::make_tuple(int64_t{2}, int64_t{0}, int64_t{1}));
  EXPECT_EQ(zero.next().index, 2);
}

// A recovery that failed: in run 1 trainer 1 came to a recovery's meeting and trainer 0 failed
// before it (its run ended, no recovery counted). The parts after the run (a save the program
// calls between its train() calls) and in the next run are numbered alike on both, and so is the
// next run's recovery (its meeting's name). With the recoveries counted for the job, trainer 1
// counted every later part one stage after trainer 0's: it waited for a part trainer 0 never
// begins and failed after runner.collective_timeout_s.
TEST(TrainerZeroParts, ARecoveryOnlyOneTrainerBeganShiftsNoPartOfTheNextRun) {
  TrainerZeroParts zero;
  TrainerZeroParts other;
  zero.begin_run(1);
  other.begin_run(1);
  EXPECT_EQ(place(zero.next()), place(other.next()));
  EXPECT_EQ(other.begin_recovery(), 1);
  other.next();  // the recovery's reload: trainer 1 waits for it, trainer 0 is gone
  zero.end_run();
  other.end_run();
  EXPECT_EQ(place(zero.next()), place(other.next()));
  zero.begin_run(2);
  other.begin_run(2);
  EXPECT_EQ(place(zero.next()), place(other.next()));
  EXPECT_EQ(zero.begin_recovery(), other.begin_recovery());
  EXPECT_EQ(place(zero.next()), place(other.next()));
}

}  // namespace
}  // namespace gpubox::trainer
