// Issue 32: a recovery that a PS job of several trainers cannot make, when a server restarted
// within it (runner.resume off, no save yet, the run's recoveries spent), stops every trainer
// naming why and what running the job again does; in the sync mode both trainers leave the
// step's barriers for it. No trainer marks its failure for the others' watches, and each keeps
// its training threads. The recoveries made: ps_modes_recovery_jobs_test.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "common/status.hpp"
#include "table/server/ps_protocol.hpp"
#include "table/server/remote_host_tier.hpp"
#include "tests/trainer/ps_modes_fixture.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/ps_modes/ps_peer_watch.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/schedule/epoch_loop.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using ps_test::PsModes;

class PsJobRecoveryRefused : public PsModes {
 protected:
  static constexpr const char* kFault = "an injected device fault";

  // A job of 2 trainers of runner.sync_mode `mode` whose server 1 restarts at step 20 of pass
  // `restart_pass`, `restarts` times (each recovery trains that pass again), with `keys`: trainer
  // 0 refuses to go back to a save, the other trainer's error names `reason` and what running the
  // job again does (`rerun`), and each trainer keeps its training threads (the object stays
  // usable). Returns each trainer's error. `fault`: trainer 0's training thread also fails there,
  // beside the restart, with kFault.
  static std::vector<std::string> refused_recovery_is_named_by_every_trainer(
      const std::string& mode, const std::vector<std::string>& keys, const std::string& reason,
      const std::string& rerun = "", int64_t restart_pass = 1, int restarts = 1,
      bool fault = false) {
    std::vector<std::string> all = {"runner.train_data_dir=" + (root_ / "train").string(),
                                    "runner.test_data_dir=",
                                    "runner.sync_mode=" + mode,
                                    "runner.epochs=2",
                                    "runner.print_interval=20",
                                    "runner.collective_timeout_s=20"};
    all.insert(all.end(), keys.begin(), keys.end());
    const TrainerConfig cfg = ps_test_config(all);
    Servers shards(cfg, 2);
    std::atomic<int> restarted{0};
    std::vector<std::string> errors(2);
    const ps_test::TrainerJob job =
        ps_test::run_trainers(cfg, shards.endpoints(), 2, [&](PsTrainer& trainer, int w) {
          RunHooks hooks;
          if (w == 0) {
            hooks.steps.on_progress = [&](const StepProgress& progress) {
              if (progress.pass == restart_pass && progress.step == 20 &&
                  restarted.load() < restarts) {
                restarted.fetch_add(1);
                shards.restart(1);
                if (fault) throw Error(kFault);
              }
            };
          }
          try {
            trainer.train("", hooks);
          } catch (const std::exception& e) {
            errors[static_cast<std::size_t>(w)] = e.what();
          }
          (void)trainer.dense_values();  // thread 0's: throws when no thread is left
        });
    EXPECT_EQ(restarted.load(), restarts);
    for (std::size_t w = 0; w < 2; ++w) {
      EXPECT_NE(errors[w], "") << "trainer " << w;
      EXPECT_EQ(job.errors[w], "")
          << "trainer " << w << " after train() failed with: " << errors[w];
    }
    EXPECT_NE(errors[1].find("trainer 0 cannot go back to a save (" + reason +
                             "), so the job "
                             "stops; " +
                             rerun),
              std::string::npos)
        << errors[1];
    for (const std::string& error : errors) {
      EXPECT_EQ(error.find("died or is stuck"), std::string::npos) << error;
      // Nothing but the restart failed: a trainer that heard of it at a sync barrier, or whose
      // other threads stopped for it, failed no otherwise (FailureTold).
      if (!fault) {
        EXPECT_EQ(error.find("also failed"), std::string::npos) << error;
      }
    }
    // Trainer 0 marked its refusal for the meeting only; trainer 1, told of it (PeerFailed), marks
    // nothing in turn: no trainer's failed flag is set, so no watch reported a failure and armed
    // the forced end of its process.
    if (job.trainers[0]) {
      auto& servers = dynamic_cast<table::server::RemoteHostTier&>(job.trainers[0]->host_tier());
      std::vector<float> alive(PsPeerWatch::kAliveSections * 2, 0.0f);
      EXPECT_TRUE(
          servers.dense(table::server::DenseAction::kRead, PsPeerWatch::kAliveTable, &alive).ok());
      EXPECT_EQ(alive.size(), PsPeerWatch::kAliveSections * 2);
      for (std::size_t w = 0; w < 2 && alive.size() == PsPeerWatch::kAliveSections * 2; ++w) {
        EXPECT_EQ(alive[PsPeerWatch::kFailedSection * 2 + w], 0.0f)
            << "trainer " << w << " marked its failure for the watches";
      }
    }
    return errors;
  }
};

TEST_F(PsJobRecoveryRefused, ARecoveryRefusedWithResumeOffIsNamedByEveryTrainer) {
  refused_recovery_is_named_by_every_trainer(
      "async",
      {"runner.save_mode=checkpoint",
       "runner.model_save_path=" + (root_ / "job_recovery_refused").string(), "runner.resume=off"},
      "runner.resume is off");
}

TEST_F(PsJobRecoveryRefused, ARecoveryRefusedWithoutASaveIsNamedByEveryTrainer) {
  refused_recovery_is_named_by_every_trainer("async", {"runner.model_save_path="},
                                             "this run made or loaded no save yet");
}

// Sync: both trainers leave the step's barriers for the refusal, and each error says what running
// the job again does.
TEST_F(PsJobRecoveryRefused, ASyncRecoveryRefusedWithResumeOffIsNamedByEveryTrainer) {
  refused_recovery_is_named_by_every_trainer(
      "sync",
      {"runner.save_mode=checkpoint",
       "runner.model_save_path=" + (root_ / "job_recovery_refused_sync").string(),
       "runner.resume=off"},
      "runner.resume is off",
      "runner.resume is off: running the command again starts from scratch");
}

// Refused in the first pass, before trainer 0's first save, with runner.resume on: trainer 1,
// which writes no save and loaded none, names the folder of the job's saves (trainer 0 writes
// them), not "no save was made or loaded yet" (SaveLineage::rerun_outcome(false)).
TEST_F(PsJobRecoveryRefused, ASyncRecoveryRefusedBeforeTheFirstSaveNamesTheSavesFolderForARerun) {
  const std::string saves = (root_ / "job_recovery_refused_first_pass").string();
  refused_recovery_is_named_by_every_trainer(
      "sync", {"runner.save_mode=checkpoint", "runner.model_save_path=" + saves},
      "this run made or loaded no save yet",
      "running the command again resumes from the newest complete save under " + saves +
          " (trainer 0 writes them) if one was made, else starts from scratch",
      /*restart_pass=*/0);
}

// Every restart reloads pass 0's save and trains pass 1 again, where server 1 restarts again: the
// fourth recovery of the run is refused (SaveLineage: at most 3), and both trainers stop naming
// why.
TEST_F(PsJobRecoveryRefused, ARecoveryRefusedWithTheRecoveriesSpentIsNamedByEveryTrainer) {
  const std::vector<std::string> errors = refused_recovery_is_named_by_every_trainer(
      "async",
      {"runner.save_mode=checkpoint",
       "runner.model_save_path=" + (root_ / "job_recovery_spent").string()},
      "the servers restarted too often in this run", "", 1, 4);
  EXPECT_NE(errors[0].find("the servers restarted 3 times already in this run: giving up"),
            std::string::npos)
      << errors[0];
}

// Trainer 0's training thread fails in pass 1 as server 1 restarts (it finds the restart, asking
// every server who it is): the fault names no restarted server, so trainer 0's refusal
// (runner.resume off) names it beside the restarts, before why it stops, once, and trainer 1's
// error names trainer 0 and its log (told with trainer 0's vote) before the refusal (before,
// the fault was only logged).
TEST_F(PsJobRecoveryRefused, AFaultBesideARestartIsNamedWithTheRefusal) {
  const std::vector<std::string> errors = refused_recovery_is_named_by_every_trainer(
      "async",
      {"runner.save_mode=checkpoint",
       "runner.model_save_path=" + (root_ / "job_recovery_refused_fault").string(),
       "runner.resume=off"},
      "runner.resume is off", "", 1, 1, /*fault=*/true);
  const std::string& error = errors[0];
  EXPECT_EQ(error.rfind("pass 1: server ", 0), 0u) << error;
  EXPECT_NE(error.find(std::string("; this trainer also failed in pass 1: card 0: ") + kFault +
                       "; the trainer stops: runner.resume is off"),
            std::string::npos)
      << error;
  EXPECT_EQ(error.find(kFault), error.rfind(kFault)) << error;
  EXPECT_NE(errors[1].find("; trainer 0 also failed in pass 1 (its log, log/workerlog.0 under "
                           "scripts/launch.sh, names why); trainer 0 cannot go back to a save"),
            std::string::npos)
      << errors[1];
  EXPECT_EQ(errors[1].find(kFault), std::string::npos) << errors[1];
}

// Found after pass 0's vote: server 1 restarts after pass 0's save, once trainer 1 evaluated
// epoch 0 and waits at the meeting after it, and trainer 0's evaluation fails on its card with a
// fault before any call (no restart agreed: trainer 0 finds it asking every server, and votes
// for the pass after). Refused (runner.resume off): trainer 0 names its fault "after pass 0", not
// "in pass 0", and trainer 1, which heard of the restart at the meeting after the evaluation,
// names trainer 0 "after pass 0" too (told with trainer 0's vote; before, trainer 0's vote after
// the evaluation told nothing, and trainer 1 named nothing beside the restart).
TEST_F(PsJobRecoveryRefused, AFaultBesideARestartFoundAfterThePassIsNamedAfterIt) {
  const TrainerConfig cfg = ps_test_config(
      {"runner.train_data_dir=" + (root_ / "train").string(),
       "runner.test_data_dir=" + (root_ / "test").string(), "runner.sync_mode=async",
       "runner.epochs=1", "runner.print_interval=20", "runner.collective_timeout_s=20",
       "runner.save_mode=checkpoint",
       "runner.model_save_path=" + (root_ / "refused_after_pass").string(), "runner.resume=off"});
  Servers shards(cfg, 2);
  std::atomic<bool> restarted{false};
  std::atomic<bool> faulted{false};
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      // Trainer 0's card fails as its evaluation begins, once, after the restart.
      const PsTrainer::OrderHook hook = [&, w](const std::string& point) {
        if (w == 0 && point == "evaluate" && restarted.load() && !faulted.exchange(true)) {
          throw Error(kFault);
        }
      };
      RunHooks hooks;
      if (w == 0) {
        hooks.on_pass = [&](const PassReport& report) {
          if (report.pass != 0 || restarted.load()) return;
          // Trainer 1 evaluated epoch 0 and waits at the meeting after it (60 s at most).
          for (int i = 0; i < 60000 && shards.barrier_waiters(0) == 0; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          restarted = true;
          shards.restart(1);
        };
      }
      try {
        TrainerEnv env;
        env.servers = shards.endpoints();
        env.trainer_id = w;
        env.trainers = 2;
        PsTrainer trainer(cfg, env, hook);
        trainer.train("", hooks);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(w)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(restarted.load());
  EXPECT_TRUE(faulted.load());
  EXPECT_EQ(errors[0].rfind("pass 0: server ", 0), 0u) << errors[0];
  EXPECT_NE(errors[0].find(std::string("; this trainer also failed after pass 0: card 0: ") +
                           kFault + "; the trainer stops: runner.resume is off"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("; trainer 0 also failed after pass 0 (its log, log/workerlog.0 under "
                           "scripts/launch.sh, names why); trainer 0 cannot go back to a save"),
            std::string::npos)
      << errors[1];
  for (const std::string& error : errors) {
    EXPECT_EQ(error.find("also failed in pass"), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
