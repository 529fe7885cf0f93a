// Issue 32, a PS job of 2 trainers: the vote for a restart found in an epoch's evaluation
// (PsTrainer::vote_after_evaluation). The restart is known when the vote is cast, so a vote the
// first server does not take (it is still there, not restarted) does not stop the trainer that
// found the restart: it goes back, and the other, waiting at the meeting after the evaluation,
// waits it out, finds the restart by asking every server who it is and goes back too; both
// reload the save and finish the run. The vote is refused here by the servers' votes table of
// another size (written by the test as the restart happens): an add refused whole, as a vote
// lost before the server applied it. Its own binary: before, the trainer that found the restart
// threw, and the other's peer watch ended the whole process (std::_Exit) once it saw that.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/status.hpp"
#include "table/server/host_tier_factory.hpp"
#include "table/server/protocol.hpp"
#include "table/server/remote_host_tier.hpp"
#include "tests/trainer/ps_modes_fixture.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

// Until a trainer waits at a barrier of the first server, for 60 s at most.
void wait_for_a_barrier_waiter(Servers& shards) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (shards.barrier_waiters(0) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "no trainer waited at a barrier of the first server within 60 s";
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// The servers' restart votes table (ps_trainer_recovery.cpp) written with 3 values for a job of
// 2 trainers: every vote's add is refused whole, nothing applied.
void spoil_the_votes_table(const TrainerConfig& cfg, const std::string& endpoints) {
  table::HostTierConfig host = cfg.host_tier;
  host.remote.endpoints = endpoints;
  auto client = table::make_host_tier(cfg.sparse, host);
  throw_if_error(client.status());
  auto* remote = dynamic_cast<table::server::RemoteHostTier*>(client->get());
  ASSERT_NE(remote, nullptr);
  std::vector<float> three(3, 0.0f);
  throw_if_error(remote->dense(table::server::DenseAction::kWrite, "ps_restart_votes", &three));
}

using ps_test::count;
using ps_test::PsModes;
using ps_test::run_trainers;
using ps_test::TrainerJob;

class PsRecoveryVotes : public PsModes {};

// Trainer 1 evaluated epoch 0 and waits at the meeting after it; server 1 restarts, and trainer
// 0's evaluation finds it. Its vote is refused by the first server, still there: trainer 0 goes
// back all the same, trainer 1 finds the restart after waiting out the meeting, and both reload
// pass 0's save and end well (before, trainer 0 failed on the refused vote).
TEST_F(PsRecoveryVotes, AVoteTheFirstServerDidNotTakeStillGoesBackWithTheOthers) {
  const TrainerConfig cfg =
      ps_test_config({"runner.train_data_dir=" + (root_ / "train").string(),
                      "runner.test_data_dir=" + (root_ / "test").string(), "runner.sync_mode=async",
                      "runner.save_mode=checkpoint",
                      "runner.model_save_path=" + (root_ / "votes_refused").string(),
                      "runner.epochs=2", "runner.print_interval=20"});
  Servers shards(cfg, 2);
  std::atomic<bool> restarted{false};
  ::testing::internal::CaptureStderr();
  const TrainerJob job = run_trainers(cfg, shards.endpoints(), 2, [&](PsTrainer& trainer, int w) {
    RunHooks hooks;
    if (w == 0) {
      hooks.on_pass = [&](const PassReport& report) {
        if (report.pass != 0 || restarted.exchange(true)) return;
        wait_for_a_barrier_waiter(shards);  // trainer 1, after its evaluation of epoch 0
        shards.restart(1);
        spoil_the_votes_table(cfg, shards.endpoints());
      };
    }
    trainer.train("", hooks);
  });
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(restarted.load());
  std::printf("trainer 0: %s\ntrainer 1: %s\n", job.errors[0].c_str(), job.errors[1].c_str());
  EXPECT_EQ(job.errors[0], "") << log;
  EXPECT_EQ(job.errors[1], "") << log;
  EXPECT_NE(log.find("voting that a server restarted in pass 1"), std::string::npos) << log;
  EXPECT_NE(log.find("(the vote was not cast); going back to the last save with the others"),
            std::string::npos)
      << log;
  EXPECT_EQ(count(log, "reloading the last complete save (pass 0, "), 1u) << log;
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
