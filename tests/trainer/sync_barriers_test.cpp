// SyncBarriers (the sync mode's barriers of every trainer in a pass) against a loopback
// gpubox_server, trainers as threads of this process: a trainer whose step failed on a server
// restart comes to the barrier the others wait at and lets them out (hold), and each other trainer
// hears of it at that barrier or its next, never waiting at a barrier nobody comes to; a second
// trainer failing in the same gap comes too, one failing after it was let out does not; the job's
// start forgets the marks, as does the pass's end (forget_mark); a hold counts the trainer's
// arrival; none after the pass's last barrier (leave); a wait that fails is named by its cause.
// "Nobody waited out a barrier" is the server's count of waiters whose client gave up
// (barrier_waiters_dropped), never a time.
#include "trainer/ps_modes/sync_barriers.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/card.hpp"
#include "tests/table/server/fake_host_tier.hpp"
#include "tests/table/server/server_test_util.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using table::server::testing::client_options;
using table::server::testing::connect_client;
using table::server::testing::eventually;
using table::server::testing::FakeHostTier;
using table::server::testing::start_server;

// runner.collective_timeout_s of these tests: a wait that ran out is a failure, whatever its
// length (the server counts it), so it is long enough for a loaded machine.
constexpr double kWait = 20.0;
constexpr int64_t kPass = 3;

class SyncBarriersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = start_server(&table_);
    ASSERT_TRUE(server_);
  }
  // Trainer `id` of `trainers` in pass `pass`, on its own connection, waiting `timeout_s` at a
  // barrier; the table zeroed first when `reset` and it is trainer 0 (the job's start).
  SyncBarriers& trainer(int id, int trainers, int64_t pass = kPass, bool reset = true,
                        double timeout_s = kWait) {
    clients_.push_back(connect_client(client_options(server_->endpoint())));
    if (reset && id == 0) {
      EXPECT_TRUE(SyncBarriers::reset(*clients_.back(), trainers).ok());
    }
    trainers_.push_back(
        std::make_unique<SyncBarriers>(*clients_.back(), id, trainers, pass, timeout_s));
    return *trainers_.back();
  }
  // `step` on a thread of its own; what it threw ("" when nothing) once joined.
  struct Running {
    std::thread thread;
    std::string error;
  };
  static std::unique_ptr<Running> start(const std::function<void()>& step) {
    auto running = std::make_unique<Running>();
    running->thread = std::thread([step, r = running.get()] {
      try {
        step();
      } catch (const std::exception& e) {
        r->error = e.what();
      }
    });
    return running;
  }
  static std::string join(Running& running) {
    running.thread.join();
    return running.error;
  }
  // Until `waiters` trainers wait at the server's barriers, 60 s at most (then the test fails).
  void wait_for_waiters(uint64_t waiters) {
    if (!eventually([&] { return server_->counters().barrier_waiters >= waiters; }, 60.0)) {
      ADD_FAILURE() << "fewer than " << waiters << " trainers waited at a barrier in 60 s";
    }
  }
  // Every trainer of `all` arrives at its next barrier, together.
  static void all_arrive(const std::vector<SyncBarriers*>& all, const std::string& what) {
    std::vector<std::unique_ptr<Running>> running;
    for (SyncBarriers* t : all) running.push_back(start([t, what] { t->arrive(what); }));
    for (auto& r : running) EXPECT_EQ(join(*r), "");
  }
  // What `arrive` threw ("" when nothing).
  // The error of `t`'s arrival; one that hears of another trainer's restart is told
  // (FailureTold), not the trainer's own failure: a fault beside the restart elsewhere.
  static std::string arrive_error(SyncBarriers& t, const std::string& what) {
    try {
      t.arrive(what);
    } catch (const Error& e) {
      const bool told = dynamic_cast<const FailureTold*>(&e) != nullptr;
      const std::string error = e.what();
      EXPECT_EQ(told, error.find(kHeard) != std::string::npos) << error;
      return error;
    }
    return "";
  }
  void expect_nobody_waited_out() {
    const table::server::ServerCounters c = server_->counters();
    EXPECT_EQ(c.barrier_waiters, 0u);
    EXPECT_EQ(c.barrier_waiters_dropped, 0u) << "a trainer gave up waiting at a barrier";
    EXPECT_EQ(c.barrier_timeouts, 0u);
  }

  static constexpr const char* kHeard = "another trainer's step failed on a server restart";
  FakeHostTier table_{table::server::testing::test_config()};
  std::unique_ptr<table::server::Server> server_;
  std::vector<std::unique_ptr<table::server::RemoteHostTier>> clients_;
  std::vector<std::unique_ptr<SyncBarriers>> trainers_;
};

// Trainer 1 waits at barrier 1 (its step's push reached the server); trainer 0's step failed
// before it: it comes there and lets trainer 1 out, which read no mark and hears of the restart
// at its next barrier, where it does not wait.
TEST_F(SyncBarriersTest, TheFailedTrainerLetsOutTheOneWaitingWhichStopsAtItsNextBarrier) {
  SyncBarriers& failed = trainer(0, 2);
  SyncBarriers& waiting = trainer(1, 2);
  all_arrive({&failed, &waiting}, "counting batches");
  auto at_step = start([&] { waiting.arrive("step 0"); });
  wait_for_waiters(1);
  failed.hold();
  EXPECT_EQ(join(*at_step), "");
  EXPECT_FALSE(waiting.heard_restart());
  const std::string error = arrive_error(waiting, "step 1's pulls");
  EXPECT_NE(error.find(std::string("pass 3, step 1's pulls: ") + kHeard), std::string::npos)
      << error;
  EXPECT_TRUE(waiting.heard_restart());
  expect_nobody_waited_out();
}

// The failed trainer's mark is in before the other arrives: that one waits for it at the marked
// barrier (the failed trainer comes), then stops.
TEST_F(SyncBarriersTest, ATrainerComingAfterTheMarkMeetsTheFailedOneThereAndStops) {
  SyncBarriers& failed = trainer(0, 2);
  SyncBarriers& late = trainer(1, 2);
  all_arrive({&failed, &late}, "counting batches");
  auto holding = start([&] { failed.hold(); });
  wait_for_waiters(1);
  const std::string error = arrive_error(late, "step 0");
  EXPECT_NE(error.find(kHeard), std::string::npos) << error;
  EXPECT_EQ(join(*holding), "");
  EXPECT_TRUE(late.heard_restart());
  expect_nobody_waited_out();
}

// Of 3 trainers, two fail in the same gap: both mark barrier 1 and come to it, so the third is
// let out. Then the third fails in the next gap, after it left the marked barrier: it finds the
// lower mark and does not come to its next (nobody would).
TEST_F(SyncBarriersTest, TwoFailingInOneGapBothComeOneFailingLaterDoesNot) {
  SyncBarriers& first = trainer(0, 3);
  SyncBarriers& second = trainer(1, 3);
  SyncBarriers& third = trainer(2, 3);
  all_arrive({&first, &second, &third}, "counting batches");
  auto at_step = start([&] { third.arrive("step 0"); });
  wait_for_waiters(1);
  auto holding = start([&] { first.hold(); });
  wait_for_waiters(2);
  second.hold();
  EXPECT_EQ(join(*holding), "");
  EXPECT_EQ(join(*at_step), "");
  third.hold();
  expect_nobody_waited_out();
  // Holding once: a trainer that held or heard has left the pass's barriers.
  first.hold();
  expect_nobody_waited_out();
  EXPECT_THROW(first.arrive("step 1"), Error);
}

// A mark is the pass's: the job's start (reset, as a recovery starts it again) forgets it, and a
// later pass's barriers do not read it.
TEST_F(SyncBarriersTest, MarksAreForgottenAtTheJobsStartAndBelongToTheirPass) {
  SyncBarriers& failed = trainer(0, 2);
  SyncBarriers& other = trainer(1, 2);
  all_arrive({&failed, &other}, "counting batches");
  auto holding = start([&] { failed.hold(); });
  wait_for_waiters(1);
  EXPECT_NE(arrive_error(other, "step 0").find(kHeard), std::string::npos);
  EXPECT_EQ(join(*holding), "");
  SyncBarriers& later_0 = trainer(0, 2, kPass + 1, /*reset=*/false);
  SyncBarriers& later_1 = trainer(1, 2, kPass + 1, /*reset=*/false);
  all_arrive({&later_0, &later_1}, "counting batches");
  EXPECT_FALSE(later_0.heard_restart());
  SyncBarriers& again_0 = trainer(0, 2);
  SyncBarriers& again_1 = trainer(1, 2);
  all_arrive({&again_0, &again_1}, "counting batches");
  EXPECT_FALSE(again_1.heard_restart());
  expect_nobody_waited_out();
}

// A hold counts its trainer's arrival at the barrier, as arrive does: a wait there that runs out
// names the trainer that did not come, not the holding one (before, "missing: trainer 0, 2").
TEST_F(SyncBarriersTest, AWaitRunningOutAtAHeldBarrierDoesNotNameTheHoldingTrainer) {
  SyncBarriers& holding = trainer(0, 3, kPass, /*reset=*/true, /*timeout_s=*/0.5);
  SyncBarriers& waiting = trainer(1, 3, kPass, /*reset=*/true, /*timeout_s=*/0.5);
  holding.hold();  // trainer 2 never comes: its wait runs out (logged)
  const std::string error = arrive_error(waiting, "counting batches");
  EXPECT_NE(error.find("counting batches: not every one of the 3 trainers arrived within "
                       "runner.collective_timeout_s=0.5 s (missing: trainer 2): "),
            std::string::npos)
      << error;
}

// After the pass's last barrier (leave), a trainer whose pass fails later holds nothing: it
// neither waits at a barrier nobody comes to (before, it waited out runner.collective_timeout_s)
// nor leaves a mark that the pass's barriers, met again, would read.
TEST_F(SyncBarriersTest, AfterThePassesLastBarrierAHoldWaitsForNobodyAndMarksNothing) {
  SyncBarriers& failed = trainer(0, 2);
  SyncBarriers& other = trainer(1, 2);
  all_arrive({&failed, &other}, "the pass's dense table");
  failed.leave();
  other.leave();
  failed.hold();
  expect_nobody_waited_out();
  SyncBarriers& again_0 = trainer(0, 2, kPass, /*reset=*/false);
  SyncBarriers& again_1 = trainer(1, 2, kPass, /*reset=*/false);
  all_arrive({&again_0, &again_1}, "counting batches");
  EXPECT_FALSE(again_0.heard_restart());
  expect_nobody_waited_out();
}

// A mark taken back at the pass's end (forget_mark) is not read by the same pass met again
// without the job's start (a trainer object whose train() is called again after a refused
// recovery), and a later hold's mark there is read as made, not summed onto the old one.
TEST_F(SyncBarriersTest, AMarkTakenBackAtThePassesEndIsNotReadAgain) {
  SyncBarriers& failed = trainer(0, 2);
  SyncBarriers& other = trainer(1, 2);
  all_arrive({&failed, &other}, "counting batches");
  auto holding = start([&] { failed.hold(); });
  wait_for_waiters(1);
  EXPECT_NE(arrive_error(other, "step 0").find(kHeard), std::string::npos);
  EXPECT_EQ(join(*holding), "");
  failed.forget_mark();
  SyncBarriers& again_0 = trainer(0, 2, kPass, /*reset=*/false);
  SyncBarriers& again_1 = trainer(1, 2, kPass, /*reset=*/false);
  all_arrive({&again_0, &again_1}, "counting batches");
  EXPECT_FALSE(again_1.heard_restart());
  holding = start([&] { again_0.hold(); });
  wait_for_waiters(1);
  EXPECT_NE(arrive_error(again_1, "step 0").find(kHeard), std::string::npos);
  EXPECT_EQ(join(*holding), "");
  expect_nobody_waited_out();
}

// A wait that fails says why: the others did not come (the trainers behind named), or the first
// server, which holds the barrier, was lost.
TEST_F(SyncBarriersTest, AFailedWaitIsNamedByItsCause) {
  clients_.push_back(connect_client(client_options(server_->endpoint())));
  ASSERT_TRUE(SyncBarriers::reset(*clients_.back(), 2).ok());
  SyncBarriers alone(*clients_.back(), 0, 2, kPass, /*timeout_s=*/0.5);
  const std::string waited_out = arrive_error(alone, "step 0");
  EXPECT_NE(waited_out.find("step 0: not every one of the 2 trainers arrived within "
                            "runner.collective_timeout_s=0.5 s (missing: trainer 1): a trainer "
                            "died or is stuck"),
            std::string::npos)
      << waited_out;
  // What the other tests count; no more than this one. The server counts it when its session
  // sees the connection close, after the client's deadline returned: waited for.
  EXPECT_TRUE(eventually([&] { return server_->counters().barrier_waiters_dropped >= 1; }, 60.0));
  EXPECT_EQ(server_->counters().barrier_waiters_dropped, 1u);
  SyncBarriers& waiting = trainer(0, 2, kPass + 1);
  auto at_step = start([&] { waiting.arrive("step 0"); });
  wait_for_waiters(1);
  server_->stop();
  server_->wait();
  const std::string lost = join(*at_step);
  EXPECT_NE(lost.find("step 0: waiting for all 2 trainers: the first server, which holds the "
                      "barrier, was lost or restarted"),
            std::string::npos)
      << lost;
  EXPECT_EQ(lost.find("died or is stuck"), std::string::npos) << lost;
}

// Trainers started with different PADDLE_TRAINERS_NUM meet at a barrier of other party counts:
// the server refuses the second, which was told its first server "was lost or restarted".
TEST_F(SyncBarriersTest, ABarrierOfAnotherTrainerCountIsNamedAsSuch) {
  clients_.push_back(connect_client(client_options(server_->endpoint())));
  table::server::RemoteHostTier& two = *clients_.back();
  clients_.push_back(connect_client(client_options(server_->endpoint())));
  table::server::RemoteHostTier& three = *clients_.back();
  auto waiting = start([&] { (void)two.barrier("ps/start", 2, 2.0); });
  wait_for_waiters(1);
  const Status refused = three.barrier("ps/start", 3, 2.0);
  ASSERT_EQ(refused.code(), Status::Code::kInvalidArgument) << refused.to_string();
  EXPECT_NE(std::string(barrier_failure_cause(refused))
                .find("different counts of trainers (PADDLE_TRAINERS_NUM)"),
            std::string::npos)
      << refused.to_string();
  join(*waiting);
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
