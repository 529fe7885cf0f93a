// Issue 32, a PS job of 2 trainers: the vote for a restart found in an epoch's evaluation
// (PsTrainer::vote_after_evaluation). The restart is known when the vote is cast, so a vote the
// first server does not take (it is still there, not restarted) does not stop the trainer that
// found the restart: it goes back, and the other, waiting at the meeting after the evaluation,
// waits it out, finds the restart by asking every server who it is and goes back too; both
// reload the save and finish the run. The vote is refused here by the servers' votes table of
// another size (written by the test as the restart happens): an add refused whole, as a vote
// lost before the server applied it. Its own binary: before, the trainer that found the restart
// threw, and the other's peer watch ended the whole process (std::_Exit) once it saw that.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
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

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

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

class PsRecoveryVotes : public PsModes {};

// Trainer 1 evaluated epoch 0 and waits at the meeting after it; server 1 restarts, and trainer
// 0's evaluation finds it. Its vote is refused by the first server, still there: trainer 0 goes
// back all the same, trainer 1 finds the restart after waiting out the meeting, and both reload
// pass 0's save and end well (before, trainer 0 failed on the refused vote).
TEST_F(PsRecoveryVotes, AVoteTheFirstServerDidNotTakeStillGoesBackWithTheOthers) {
  // A death test, its log in a file: a trainer's peer watch that ends the process (std::_Exit)
  // fails the test by its exit status, and the log, which names why, is printed here (a capture
  // of stderr would go with the process). "fast": the child is forked, root_ is the same.
  GTEST_FLAG_SET(death_test_style, "fast");
  const std::string log_path = (root_ / "votes_refused.log").string();
  const auto job = [&] {
    const TrainerConfig cfg =
        ps_test_config({"runner.train_data_dir=" + (root_ / "train").string(),
                        "runner.test_data_dir=" + (root_ / "test").string(),
                        "runner.sync_mode=async", "runner.save_mode=checkpoint",
                        "runner.model_save_path=" + (root_ / "votes_refused").string(),
                        "runner.epochs=2", "runner.print_interval=20"});
    std::fflush(stderr);
    const int to_file = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(to_file, 0) << log_path;
    const int saved = ::dup(2);
    ::dup2(to_file, 2);
    ::close(to_file);
    std::vector<std::string> errors;
    bool restarted = false;
    {
      Servers shards(cfg, 2);
      std::atomic<bool> restart{false};
      errors =
          run_trainers(cfg, shards.endpoints(), 2, [&](PsTrainer& trainer, int w) {
            RunHooks hooks;
            if (w == 0) {
              hooks.on_pass = [&](const PassReport& report) {
                if (report.pass != 0 || restart.exchange(true)) return;
                wait_for_a_barrier_waiter(shards);  // trainer 1, after its evaluation of epoch 0
                shards.restart(1);
                spoil_the_votes_table(cfg, shards.endpoints());
              };
            }
            trainer.train("", hooks);
          }).errors;
      restarted = restart.load();
    }
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
    const std::string log = read_file(log_path);
    EXPECT_TRUE(restarted);
    std::printf("trainer 0: %s\ntrainer 1: %s\n", errors[0].c_str(), errors[1].c_str());
    EXPECT_EQ(errors[0], "");
    EXPECT_EQ(errors[1], "");
    EXPECT_NE(log.find("voting that a server restarted in pass 1"), std::string::npos);
    EXPECT_NE(log.find("(the vote was not cast); going back to the last save with the others"),
              std::string::npos);
    EXPECT_EQ(count(log, "reloading the last complete save (pass 0, "), 1u);
    std::fflush(stdout);
    std::_Exit(::testing::Test::HasFailure() ? 1 : 0);
  };
  EXPECT_EXIT(job(), ::testing::ExitedWithCode(0), "");
  if (::testing::Test::HasFailure())
    std::printf("the job's log:\n%s\n", read_file(log_path).c_str());
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
