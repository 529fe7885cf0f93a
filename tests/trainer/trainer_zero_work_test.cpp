// wait_for_trainer_zero and TrainerZeroWork (trainer/schedule/trainer_zero_work.hpp) against a
// loopback gpubox_server, trainer 0's table written directly: a table an earlier job left (its
// part numbered as this job's, ended) is a part not begun; a later part of this job is trainer 0
// past it (a count that drifted); an unreadable table (another size: an earlier build's) or an
// unknown nonce ends the watching; a loss the watch saw fails at once; trainer 0's publishes end
// its part; a late end is no move, and so is a read that fails for a moment; a restarted first
// server ends trainer 0's publishing at once, and its publishes do not keep a restart from the last
// save from being adopted; another server's restart pending, trainer 0 still reads its end back
// (a late write of the part or of the previous part overwritten); parts count from 1 again in each
// stage. A waiter that must not return is given a short silence: it throws, naming why, rather than
// returning (no time is measured).
#include "trainer/schedule/trainer_zero_work.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "table/server/protocol.hpp"
#include "table/server/ps_protocol.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"

namespace gpubox::trainer {
namespace {

using table::server::DenseAction;
using table::server::testing::client_options;
using table::server::testing::connect_client;
using table::server::testing::FakeHostTier;
using table::server::testing::start_server;

constexpr uint64_t kJob = 0x123456789abull;
constexpr uint64_t kEarlierJob = 0x5555aaaaull;

TrainerZeroPart part_of(uint64_t job, int64_t run, int64_t recovery, int64_t index) {
  TrainerZeroPart part;
  part.job = job;
  part.run = run;
  part.recovery = recovery;
  part.index = index;
  return part;
}

// Waits for trainer 0 by `wait` through `client`: the error ("" when it returned).
std::string error_of_wait(table::server::RemoteHostTier& client, const TrainerZeroWait& wait) {
  try {
    wait_for_trainer_zero(client, wait);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

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
  {
    TrainerZeroWork work(*client_, part, 0.01, 1.0);
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
    server = start_server(&first, options);
    ASSERT_TRUE(server);
    options.port = server->port();
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
// every call Aborted): the end is not written again until call_s (which would keep trainer 0 from
// the meeting long past runner.collective_timeout_s). Without the fix this test does not end
// within its ctest timeout.
TEST_F(TrainerZeroWorkRestart, AFirstServerRestartedEndsThePartAtOnce) {
  ASSERT_NO_FATAL_FAILURE(start());
  // Rows the restart loses: it is not adopted quietly.
  std::vector<uint64_t> keys{5, 6, 7, 8};
  std::vector<float> rows(keys.size() * client->layout().stride(), 0.5f);
  ASSERT_TRUE(client->push(keys.data(), keys.size(), rows.data()).ok());
  {
    TrainerZeroWork work(*client, part_of(kJob, 0, 0, 1), 0.01, /*call_s=*/3600.0);
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
  { TrainerZeroWork work(*client, part_of(kJob, 0, 0, 1), 0.01, 3.0); }
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

// Two servers; the second restarted and found so by a call (its restart pending in the client,
// as after a SAVE that failed on it), the first answering as before. Between trainer 0's write of
// part `part`'s end and its read back, another client writes `late`, as a publish the client gave
// up on and the server applied late. *table: the table as read after trainer 0's part ended.
void read_after_a_late_write(const TrainerZeroPart& part, const std::vector<float>& late,
                             std::vector<float>* table) {
  using table::server::ServerOptions;
  FakeHostTier first(table::server::testing::test_config());
  FakeHostTier second(table::server::testing::test_config());
  FakeHostTier second_again(table::server::testing::test_config());
  std::function<void()> between;  // set before between_client
  std::atomic<uint64_t> between_client{0};
  ServerOptions options0;
  options0.threads = 2;  // one runs the hook while the other serves what it sends
  options0.shard_num = 2;
  options0.drop_reply = [&](const table::server::FrameHeader& header) {
    uint64_t armed = header.client_id;
    if (header.op == table::server::Op::kDense && armed != 0 &&
        between_client.compare_exchange_strong(armed, 0)) {
      between();
    }
    return false;
  };
  ServerOptions options1;
  options1.shard_id = 1;
  options1.shard_num = 2;
  auto server0 = start_server(&first, options0);
  auto server1 = start_server(&second, options1);
  ASSERT_TRUE(server0 && server1);
  const std::string endpoints = server0->endpoint() + "," + server1->endpoint();
  auto client = connect_client(client_options(endpoints));
  ASSERT_TRUE(client);
  std::vector<uint64_t> keys(32);
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = i + 1;
  std::vector<float> rows(keys.size() * client->layout().stride(), 0.5f);
  ASSERT_TRUE(client->push(keys.data(), keys.size(), rows.data()).ok());
  options1.port = server1->port();
  server1.reset();
  server1 = start_server(&second_again, options1);
  ASSERT_TRUE(server1);
  EXPECT_FALSE(client->pull(keys.data(), nullptr, keys.size(), rows.data(), nullptr).ok());
  ASSERT_EQ(client->pending_restarts().size(), 1u);
  ASSERT_EQ(client->pending_restarts()[0].endpoint, 1u);
  auto other = connect_client(client_options(endpoints));
  ASSERT_TRUE(other);
  {
    TrainerZeroWork work(*client, part, 0.01, 3.0);  // publishes seq 1, running
    between = [&] {
      std::vector<float> written = late;
      EXPECT_TRUE(other->dense(DenseAction::kWrite, TrainerZeroWork::kTable, &written).ok());
    };
    between_client = client->client_id();  // its next DENSE call: the end's write (seq 2)
  }
  EXPECT_EQ(between_client.load(), 0u) << "the end was not written";
  std::vector<float> read(TrainerZeroWork::kSlots, 0.0f);
  EXPECT_TRUE(other->dense(DenseAction::kRead, TrainerZeroWork::kTable, &read).ok());
  server0->stop();  // its threads call the hook, which uses this function's locals
  server0->wait();
  *table = read;
}

// A late write of the part (seq 1, running), another server's restart pending: trainer 0 reads it
// back and writes the end again, so the table ends showing the end. Before, any pending restart
// ended the publishing after the first write, and the table showed the part running: the others
// waited out runner.collective_timeout_s and named trainer 0 stuck.
TEST(TrainerZeroWorkOtherRestart, ALateWriteIsReadBackWhileAnotherServersRestartIsPending) {
  const TrainerZeroPart part = part_of(kJob, 0, 0, 1);
  std::vector<float> table;
  read_after_a_late_write(part, TrainerZeroWork::row(part, TrainerZeroWork::kRunning, 0, 1),
                          &table);
  ASSERT_EQ(table.size(), TrainerZeroWork::kSlots);
  EXPECT_EQ(table[5], TrainerZeroWork::kEnded);
  EXPECT_GT(table[7], 2.0f) << "the end was not written again";
}

// A late write of the previous part (running, with a seq above any of this part's: each part
// counts its own) overwritten alike: the table ends showing this part ended. Before, only a late
// write of this part was: the table showed the previous part running, and the others failed
// after runner.collective_timeout_s ("did not begin it").
TEST(TrainerZeroWorkOtherRestart, ALateWriteOfThePreviousPartIsReadBackAndOverwritten) {
  const TrainerZeroPart part = part_of(kJob, 0, 0, 2);
  std::vector<float> table;
  read_after_a_late_write(
      part, TrainerZeroWork::row(part_of(kJob, 0, 0, 1), TrainerZeroWork::kRunning, 0, 7), &table);
  ASSERT_EQ(table.size(), TrainerZeroWork::kSlots);
  EXPECT_EQ(table[4], 2.0f) << "the previous part's late write was left";
  EXPECT_EQ(table[5], TrainerZeroWork::kEnded);
  EXPECT_GT(table[7], 2.0f) << "the end was not written again";
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
