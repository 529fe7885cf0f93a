// Issue 32: a server of a PS job restarted (same port, empty) between passes or within one is
// repaired in the run, as the gpubox mode repairs one between passes (resume_binaries_test): the
// pass that found it is trained again from the last complete save, and the job ends where a job
// resumed from that save in a new process ends it, to the bit (1 trainer; the cpu backend's steps
// are deterministic): one server or both (a fleet restart, reloaded at once), between passes or
// within one, or found by an epoch's test evaluation (the epoch evaluated after the reload, its
// lines printed once), or found during a save (the pass trained again, its lines written once),
// or restarted during the reload (SaveLineage::recover_and_reload reloads again); an epoch's lines
// after a reload count its passes as a resume from the save does. Jobs of several trainers are
// repaired together (ps_modes_recovery_jobs_test.cpp).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "table/server/remote_host_tier.hpp"
#include "tests/trainer/forwarding_schedule.hpp"
#include "tests/trainer/ps_modes_fixture.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/metrics/metric_values.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/schedule/checkpoint.hpp"
#include "trainer/schedule/epoch_loop.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using ps_test::count;
using ps_test::PsModes;

struct Ran {
  std::vector<int64_t> passes;  // the reports train() returned
  std::vector<float> dense;     // thread 0's, after training
  double test_auc = 0;
  std::string log;                   // what the run logged
  int progress_at_pass1_step20 = 0;  // thread 0's progress reports of pass 1, step 20
  std::string restarted;             // the endpoints of the servers restarted, "a,b"
};

// Where a test restarts a server of 2 in pass 1 of 2: after pass 0's save, or after the first
// step of pass 1 whose progress thread 0 reports (step 20: runner.print_interval).
enum class RestartAt { kNever, kBetweenPasses, kWithinPass };
constexpr int kBothServers = -1;  // a fleet restart: both servers at once

// What `run` printed (stdout) and logged (stderr); when it throws, its log is reported as a
// failure and the exception thrown again.
struct Printed {
  std::string out;
  std::string log;
};
template <typename Run>
Printed captured(Run run) {
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  try {
    run();
  } catch (...) {
    (void)::testing::internal::GetCapturedStdout();
    ADD_FAILURE() << ::testing::internal::GetCapturedStderr();
    throw;
  }
  Printed printed;
  printed.out = ::testing::internal::GetCapturedStdout();
  printed.log = ::testing::internal::GetCapturedStderr();
  return printed;
}

// The PsModes suite's data and helpers, as a suite of its own.
class PsRecovery : public PsModes {
 protected:
  // One trainer of runner.sync_mode `mode` (and `keys`) against 2 fresh servers, `epochs` passes
  // over the training files, each saved (checkpoint) under `saves`, resuming the newest save there;
  // server `server` (or kBothServers) restarted at `restart`.
  static Ran run_restarting(const std::string& mode, const std::vector<std::string>& keys,
                            const std::string& saves, int epochs, RestartAt restart,
                            int server = 0) {
    std::vector<std::string> all = {"runner.train_data_dir=" + (root_ / "train").string(),
                                    "runner.test_data_dir=",
                                    "runner.sync_mode=" + mode,
                                    "runner.save_mode=checkpoint",
                                    "runner.model_save_path=" + saves,
                                    "runner.epochs=" + std::to_string(epochs),
                                    "runner.geo_step=4"};
    all.insert(all.end(), keys.begin(), keys.end());
    const TrainerConfig cfg = ps_test_config(all);
    Servers shards(cfg, 2);
    TrainerEnv env;
    env.servers = shards.endpoints();
    PsTrainer trainer(cfg, env);
    Ran ran;
    const std::string endpoints = shards.endpoints();
    const std::vector<std::string> endpoint = {endpoints.substr(0, endpoints.find(',')),
                                               endpoints.substr(endpoints.find(',') + 1)};
    bool restarted = false;
    const auto restart_now = [&] {
      for (int i = 0; i < 2; ++i) {
        if (server != kBothServers && server != i) continue;
        shards.restart(i);
        ran.restarted += (ran.restarted.empty() ? "" : ",") + endpoint.at(std::size_t(i));
      }
      restarted = true;
    };
    RunHooks hooks;
    if (restart == RestartAt::kBetweenPasses) {
      hooks.on_pass = [&](const PassReport& report) {
        if (report.pass == 0 && !restarted) restart_now();
      };
    }
    hooks.steps.on_progress = [&](const StepProgress& progress) {
      if (progress.pass == 1 && progress.step == 20) ++ran.progress_at_pass1_step20;
      if (restart != RestartAt::kWithinPass || progress.pass != 1 || restarted) return;
      restart_now();
    };
    ::testing::internal::CaptureStderr();
    try {
      for (const PassReport& report : trainer.train("", hooks)) ran.passes.push_back(report.pass);
    } catch (...) {
      ran.log = ::testing::internal::GetCapturedStderr();
      ADD_FAILURE() << ran.log;
      throw;
    }
    ran.log = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(restarted, restart != RestartAt::kNever);
    ran.dense = trainer.dense_values();
    ran.test_auc = test_auc(trainer);
    return ran;
  }

  // The oracle: pass 0 saved, then a new trainer on fresh servers resumes from that save for pass
  // 1; then the same job with server `server` restarted at `restart` (server 0 holds the job's
  // small tables: the sync mode's batch counts and barrier arrivals).
  static void ends_as_resumed_from_the_save(const std::string& mode,
                                            const std::vector<std::string>& network,
                                            RestartAt restart, int server) {
    const std::string tag = mode + (restart == RestartAt::kBetweenPasses ? "_between" : "_within") +
                            (server == kBothServers ? "_both" : "");
    std::vector<std::string> keys = network;
    keys.push_back("runner.print_interval=20");
    const std::string resumed_saves = (root_ / ("recovery_resumed_" + tag)).string();
    EXPECT_EQ(run_restarting(mode, keys, resumed_saves, 1, RestartAt::kNever).passes,
              (std::vector<int64_t>{0}));
    const Ran resumed = run_restarting(mode, keys, resumed_saves, 2, RestartAt::kNever);
    EXPECT_EQ(resumed.passes, (std::vector<int64_t>{1}));
    const Ran recovered = run_restarting(
        mode, keys, (root_ / ("recovery_restarted_" + tag)).string(), 2, restart, server);
    EXPECT_EQ(recovered.passes, (std::vector<int64_t>{0, 1}));
    // Every restarted server named, by its endpoint, in one warning: all are accepted and
    // reloaded together.
    const std::string named = recovered.restarted.substr(0, recovered.restarted.find(','));
    EXPECT_NE(recovered.log.find("pass 1: server " + named + " restarted (instance "),
              std::string::npos)
        << recovered.log;
    if (server == kBothServers) {
      const std::string second = recovered.restarted.substr(recovered.restarted.find(',') + 1);
      EXPECT_NE(recovered.log.find("; server " + second + " restarted (instance "),
                std::string::npos)
          << recovered.log;
    }
    EXPECT_NE(recovered.log.find("into the servers and training the passes after it again"),
              std::string::npos)
        << recovered.log;
    // The restart named without a failed call's rerun advice: the run goes on.
    EXPECT_EQ(recovered.log.find("rerun to resume"), std::string::npos) << recovered.log;
    EXPECT_NE(recovered.log.find("; training again from pass 1"), std::string::npos)
        << recovered.log;
    // One reload (one warning: a restart found during the reload would warn again), and the
    // retried pass trained from its start (thread 0 reports step 20 of pass 1 again); the old
    // threads' failed calls are dropped quietly.
    EXPECT_EQ(count(recovered.log, "reloading the last complete save"), 1) << recovered.log;
    EXPECT_EQ(recovered.log.find("training thread of card"), std::string::npos) << recovered.log;
    EXPECT_EQ(recovered.progress_at_pass1_step20, restart == RestartAt::kWithinPass ? 2 : 1);
    const auto warned = recovered.log.find("pass 1: server");
    std::printf("%s\n",
                recovered.log.substr(warned, recovered.log.find('\n', warned) - warned).c_str());
    std::printf("%s, server restarted %s: test auc %.6f, resumed from the save %.6f\n",
                mode.c_str(),
                restart == RestartAt::kBetweenPasses ? "between passes" : "within pass 1",
                recovered.test_auc, resumed.test_auc);
    EXPECT_EQ(recovered.dense, resumed.dense) << "the dense parameters differ";
    EXPECT_EQ(recovered.test_auc, resumed.test_auc);
  }
};

TEST_F(PsRecovery, AsyncServerRestartedBetweenPassesIsReloadedAndEndsAsResumedFromTheSave) {
  ends_as_resumed_from_the_save("async", {}, RestartAt::kBetweenPasses, 0);
}

// 2 threads: the job's merged pushes and averaged dense step are made again after the reload.
TEST_F(PsRecovery, SyncServerRestartedBetweenPassesIsReloadedAndEndsAsResumedFromTheSave) {
  ends_as_resumed_from_the_save("sync", {"runner.thread_num=2"}, RestartAt::kBetweenPasses, 0);
}

TEST_F(PsRecovery, GeoServerRestartedBetweenPassesIsReloadedAndEndsAsResumedFromTheSave) {
  ends_as_resumed_from_the_save("geo", {}, RestartAt::kBetweenPasses, 1);
}

// Both servers restarted together (a fleet restart): the call that finds the first stops
// there; every restarted server is found before any is accepted, and one reload restores both.
TEST_F(PsRecovery, AsyncBothServersRestartedBetweenPassesAreReloadedTogether) {
  ends_as_resumed_from_the_save("async", {}, RestartAt::kBetweenPasses, kBothServers);
}

TEST_F(PsRecovery, SyncBothServersRestartedBetweenPassesAreReloadedTogether) {
  ends_as_resumed_from_the_save("sync", {"runner.thread_num=2"}, RestartAt::kBetweenPasses,
                                kBothServers);
}

// Found within pass 1 (its updates partly on the servers): the pass is trained again from
// pass 0's save.
TEST_F(PsRecovery, AsyncServerRestartedWithinAPassRetriesItFromTheSave) {
  ends_as_resumed_from_the_save("async", {}, RestartAt::kWithinPass, 1);
}

TEST_F(PsRecovery, SyncServerRestartedWithinAPassRetriesItFromTheSave) {
  ends_as_resumed_from_the_save("sync", {"runner.thread_num=2"}, RestartAt::kWithinPass, 0);
}

// Geo's local rows and their deltas since the last exchange are dropped with the threads.
TEST_F(PsRecovery, GeoServerRestartedWithinAPassRetriesItFromTheSave) {
  ends_as_resumed_from_the_save("geo", {}, RestartAt::kWithinPass, 0);
}

// A restart found by an epoch's test evaluation (after the epoch's last pass was saved): the
// reload lands right after that pass, and the epoch's end runs again after it; every epoch (the
// job's last one too) is evaluated once, with what a run without the restart measures.
TEST_F(PsRecovery, ARestartFoundByAnEpochsEvaluationEvaluatesThatEpochAfterTheReload) {
  for (const int64_t restarted_after : {0, 1}) {
    SCOPED_TRACE("restarted after pass " + std::to_string(restarted_after));
    std::vector<std::pair<int64_t, double>> evaluated[2];  // without, with the restart
    for (const bool restart : {false, true}) {
      const std::string saves = "recovery_evaluation_" + std::to_string(restarted_after) +
                                (restart ? "_restarted" : "_plain");
      const TrainerConfig cfg =
          ps_test_config({"runner.train_data_dir=" + (root_ / "train").string(),
                          "runner.test_data_dir=" + (root_ / "test").string(),
                          "runner.sync_mode=async", "runner.save_mode=checkpoint",
                          "runner.model_save_path=" + (root_ / saves).string(), "runner.epochs=2"});
      Servers shards(cfg, 2);
      TrainerEnv env;
      env.servers = shards.endpoints();
      PsTrainer trainer(cfg, env);
      RunHooks hooks;
      bool restarted = false;
      hooks.on_pass = [&](const PassReport& report) {
        // on_pass runs after the pass's save, before its epoch's evaluation.
        if (restart && report.pass == restarted_after && !restarted) {
          shards.restart(1);
          restarted = true;
        }
      };
      hooks.on_epoch = [&](int64_t epoch, const MetricValues&, const MetricValues* test) {
        ASSERT_NE(test, nullptr);
        evaluated[restart].emplace_back(epoch, test->auc);
      };
      std::vector<PassReport> reports;
      const auto [out, log] = captured([&] { reports = trainer.train("", hooks); });
      EXPECT_EQ(reports.size(), 2u);
      // Each epoch's PaddleRec lines and test line printed once: the evaluation run again after
      // the reload does not print the epoch's lines again.
      for (const int64_t epoch : {0, 1}) {
        const std::string n = std::to_string(epoch);
        EXPECT_EQ(count(out, "Epoch: " + n + ", using time"), 1u) << out;
        EXPECT_EQ(count(out, "epoch: " + n + " done"), 1u) << out;
        EXPECT_EQ(count(out, "epoch: " + n + ", test auc"), 1u) << out;
      }
      EXPECT_EQ(restarted, restart);
      if (restart) {
        EXPECT_NE(log.find("reloaded "), std::string::npos) << log;
        EXPECT_NE(log.find("training again from pass " + std::to_string(restarted_after + 1)),
                  std::string::npos)
            << log;
      }
    }
    EXPECT_EQ(evaluated[0], (std::vector<std::pair<int64_t, double>>{
                                {0, evaluated[0].at(0).second}, {1, evaluated[0].at(1).second}}));
    EXPECT_EQ(evaluated[1], evaluated[0]);
  }
}

// A PsTrainer whose server `server` restarts as the save of pass `pass` begins (the first time):
// the save's first call finds the restart. The loop and the trainer are the real ones.
class RestartAtSave final : public testing::ForwardingSchedule {
 public:
  RestartAtSave(PsTrainer& trainer, Servers& shards, int64_t pass, int server)
      : ForwardingSchedule(trainer), shards_(shards), pass_(pass), server_(server) {}
  void save(const std::string& dir) override {
    if (!restarted_ && passes_done() == pass_ + 1) {
      shards_.restart(server_);
      restarted_ = true;
    }
    ForwardingSchedule::save(dir);
  }
  bool restarted() const { return restarted_; }

 private:
  Servers& shards_;
  int64_t pass_;
  int server_;
  bool restarted_ = false;
};

// A restart found during pass 1's save: the save fails, pass 0's save is reloaded and pass 1
// trained and saved again. The pass's line (printed) and JSON line (runner.metrics_path) are
// written once per completed pass, not once for the attempt whose save failed too.
TEST_F(PsRecovery, ARestartFoundDuringASaveRecordsEachPassOnce) {
  const std::filesystem::path metrics_path = root_ / "recovery_during_save_metrics.jsonl";
  std::filesystem::remove(metrics_path);
  const TrainerConfig cfg = ps_test_config(
      {"runner.train_data_dir=" + (root_ / "train").string(),
       "runner.test_data_dir=", "runner.sync_mode=async", "runner.save_mode=checkpoint",
       "runner.model_save_path=" + (root_ / "recovery_during_save").string(),
       "runner.metrics_path=" + metrics_path.string(), "runner.epochs=2"});
  Servers shards(cfg, 2);
  TrainerEnv env;
  env.servers = shards.endpoints();
  PsTrainer trainer(cfg, env);
  RestartAtSave restarting(trainer, shards, 1, 1);
  std::vector<PassReport> reports;
  const auto [out, log] = captured([&] { reports = run_epochs(restarting, cfg, "", false); });
  ASSERT_TRUE(restarting.restarted());
  EXPECT_NE(log.find("; training again from pass 1"), std::string::npos) << log;
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[1].pass, 1);
  std::ifstream file(metrics_path);
  const std::string recorded((std::istreambuf_iterator<char>(file)),
                             std::istreambuf_iterator<char>());
  EXPECT_EQ(count(recorded, "\n"), 2u) << recorded;
  for (const std::string pass : {"0", "1"}) {
    EXPECT_EQ(count(recorded, "{\"pass\": " + pass + ","), 1u) << recorded;
    EXPECT_EQ(count(out, "pass: " + pass + ", using time"), 1u) << out;
  }
}

// An epoch of 2 passes (pass_dirs) whose pass 1 is trained again after a restart found at its
// save: the epoch's lines (on_epoch's training metrics, merged over its passes) count the passes
// from the reloaded save on, as the oracle does: pass 0 trained and saved, the run stopped, and a
// new trainer on fresh servers resuming from that save for pass 1.
TEST_F(PsRecovery, AnEpochsLinesAfterAReloadCountItsPassesAsAResumeFromTheSave) {
  const std::string train = (root_ / "train").string();
  const auto config_into = [&](const std::string& saves) {
    return ps_test_config({"runner.pass_dirs=[" + train + "," + train + "]",
                           "runner.test_data_dir=", "runner.sync_mode=async",
                           "runner.save_mode=checkpoint",
                           "runner.model_save_path=" + (root_ / saves).string()});
  };
  std::vector<MetricValues> resumed;
  std::vector<MetricValues> recovered;
  const auto epochs_into = [](std::vector<MetricValues>* into) {
    return
        [into](int64_t, const MetricValues& train, const MetricValues*) { into->push_back(train); };
  };
  const TrainerConfig oracle = config_into("epoch_lines_resumed");
  for (const bool resuming : {false, true}) {
    Servers shards(oracle, 2);
    TrainerEnv env;
    env.servers = shards.endpoints();
    PsTrainer trainer(oracle, env);
    RunHooks hooks;
    if (!resuming) hooks.stop_requested = [] { return true; };  // before pass 1
    hooks.on_epoch = epochs_into(&resumed);
    std::vector<PassReport> reports;
    (void)captured([&] { reports = trainer.train("", hooks); });
    ASSERT_EQ(reports.size(), 1u);
    EXPECT_EQ(reports[0].pass, resuming ? 1 : 0);
  }
  const TrainerConfig cfg = config_into("epoch_lines_recovered");
  Servers shards(cfg, 2);
  TrainerEnv env;
  env.servers = shards.endpoints();
  PsTrainer trainer(cfg, env);
  RestartAtSave restarting(trainer, shards, 1, 1);
  RunHooks hooks;
  hooks.on_epoch = epochs_into(&recovered);
  const auto printed = captured([&] { run_epochs(restarting, cfg, "", false, hooks); });
  ASSERT_TRUE(restarting.restarted());
  EXPECT_NE(printed.log.find("; training again from pass 1"), std::string::npos) << printed.log;
  ASSERT_EQ(resumed.size(), 1u);
  ASSERT_EQ(recovered.size(), 1u);
  EXPECT_EQ(recovered[0].examples, resumed[0].examples);
  EXPECT_EQ(recovered[0].auc, resumed[0].auc);
  EXPECT_EQ(recovered[0].logloss, resumed[0].logloss);
}

// A server that stays down is no restart: the pass fails naming it, as before, with no reload
// (nor a pass that fails for its data or a NaN: ps_modes_failures_test).
TEST_F(PsRecovery, AServerThatStaysDownFailsThePassNamingIt) {
  const TrainerConfig cfg = ps_test_config(
      {"runner.train_data_dir=" + (root_ / "train").string(), "runner.test_data_dir=",
       "runner.sync_mode=async", "runner.save_mode=checkpoint", "runner.server_timeout_s=1",
       "runner.model_save_path=" + (root_ / "recovery_down").string(), "runner.epochs=2"});
  Servers shards(cfg, 2);
  TrainerEnv env;
  env.servers = shards.endpoints();
  PsTrainer trainer(cfg, env);
  RunHooks hooks;
  hooks.on_pass = [&](const PassReport& report) {
    if (report.pass == 0) shards.stop(1);
  };
  ::testing::internal::CaptureStderr();
  try {
    trainer.train("", hooks);
    ADD_FAILURE() << "a job whose server died ended well";
  } catch (const Error& e) {
    const std::string dead = shards.endpoints().substr(shards.endpoints().find(',') + 1);
    EXPECT_NE(std::string(e.what()).find(dead), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("restarted"), std::string::npos) << e.what();
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(log.find("reloading"), std::string::npos) << log;
}

// One trainer's training thread fails in pass 1 as server 1 restarts, found at once (every
// server asked who it is, as a call under way finds it): the fault names no restarted server, so
// the refusal (runner.resume off) names it after the restart, before why the trainer stops (before,
// the restart alone).
TEST_F(PsRecovery, AFaultBesideARestartIsNamedWithTheRefusal) {
  constexpr const char* kFault = "an injected device fault";
  const TrainerConfig cfg = ps_test_config(
      {"runner.train_data_dir=" + (root_ / "train").string(),
       "runner.test_data_dir=", "runner.sync_mode=async", "runner.save_mode=checkpoint",
       "runner.resume=off", "runner.model_save_path=" + (root_ / "recovery_fault").string(),
       "runner.epochs=2", "runner.print_interval=20"});
  Servers shards(cfg, 2);
  TrainerEnv env;
  env.servers = shards.endpoints();
  PsTrainer trainer(cfg, env);
  RunHooks hooks;
  bool restarted = false;
  hooks.steps.on_progress = [&](const StepProgress& progress) {
    if (progress.pass != 1 || progress.step != 20 || restarted) return;
    restarted = true;
    shards.restart(1);
    SaveLineage::find_restarts(trainer.host_tier(), 3.0);
    throw Error(kFault);
  };
  ::testing::internal::CaptureStderr();
  std::string error;
  try {
    trainer.train("", hooks);
  } catch (const Error& e) {
    error = e.message();
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(restarted);
  EXPECT_EQ(error.rfind("pass 1: server ", 0), 0u) << error << log;
  EXPECT_NE(error.find(std::string("; this trainer also failed in pass 1: card 0: ") + kFault +
                       "; the trainer stops: runner.resume is off"),
            std::string::npos)
      << error;
}

// Two servers, a client of them with short bounds, and a lineage whose pass 0 save is `dir`:
// the reload tests' start.
struct ReloadStart {
  ReloadStart(const TrainerConfig& config, const std::string& saves)
      : cfg(config),
        shards(cfg, 2),
        host(connect_client(shards, cfg, /*deadline_s=*/2.0, /*connect_timeout_s=*/1.0)),
        lineage(cfg),
        dir(saves + "/0") {
    std::filesystem::create_directories(dir);
    lineage.commit_save(dir, 1, table::SaveKind::kCheckpoint, {}, 0, config::DensePrecision::kFp32);
  }
  const TrainerConfig cfg;
  Servers shards;
  std::unique_ptr<table::server::RemoteHostTier> host;
  SaveLineage lineage;
  const std::string dir;
};

// A server that restarts while the save is reloaded (a staggered fleet restart: it answered the
// ping that looked for restarts, then restarted) is accepted and the save reloaded again, by the
// helper both trainers recover through (SaveLineage::recover_and_reload), not thrown.
TEST_F(PsRecovery, ARestartFoundDuringTheReloadIsAcceptedAndTheSaveReloadedAgain) {
  ReloadStart start(
      ps_test_config({"runner.train_data_dir=" + (root_ / "train").string(),
                      "runner.save_mode=checkpoint",
                      "runner.model_save_path=" + (root_ / "recovery_during_reload").string()}),
      (root_ / "recovery_during_reload").string());
  Servers& shards = start.shards;
  auto* host = &start.host;
  SaveLineage& lineage = start.lineage;
  const std::string& dir = start.dir;
  // Both servers known and written to since (a restart that loses nothing is adopted quietly).
  throw_if_error((*host)->shrink().status());
  shards.restart(0);
  std::vector<std::string> reloads;
  ::testing::internal::CaptureStderr();
  try {
    throw_if_error((*host)->stats().status());
    ADD_FAILURE() << "a restarted server answered as before";
  } catch (const Error& found) {
    try {
      const SaveLineage::Recovery recovery = lineage.recover_and_reload(
          found, **host, SaveLineage::OpenPass::kNone, 1, [&](const SaveLineage::Recovery& r) {
            reloads.push_back(r.dir);
            if (reloads.size() == 1) shards.restart(1);  // during the first reload
            throw_if_error((*host)->stats().status());   // the reload's calls
          });
      EXPECT_EQ(recovery.run_pass, 1);
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
    }
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(reloads, (std::vector<std::string>{dir, dir}));
  // Both restarts named, each in the warning of the reload it led to.
  EXPECT_EQ(count(log, "reloading the last complete save (pass 0, " + dir + ")"), 2u) << log;
  const std::string endpoints = shards.endpoints();
  EXPECT_NE(log.find("server " + endpoints.substr(0, endpoints.find(',')) + " restarted"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("server " + endpoints.substr(endpoints.find(',') + 1) + " restarted"),
            std::string::npos)
      << log;
}

// A server that restarts at every reload: the fourth recovery is refused (the restarts spent),
// and the refusal still names what else failed in the pass (`beside`), once, as the first
// round's would (before, rounds after the first named the reload's failure alone).
TEST_F(PsRecovery, ARefusalAfterRestartsDuringTheReloadNamesThePassFailure) {
  constexpr const char* kBeside = "this trainer also failed in pass 1: card 0: a device fault";
  ReloadStart start(
      ps_test_config({"runner.train_data_dir=" + (root_ / "train").string(),
                      "runner.save_mode=checkpoint",
                      "runner.model_save_path=" + (root_ / "recovery_beside_reload").string()}),
      (root_ / "recovery_beside_reload").string());
  Servers& shards = start.shards;
  auto* host = &start.host;
  SaveLineage& lineage = start.lineage;
  throw_if_error((*host)->shrink().status());
  shards.restart(0);
  std::string error;
  ::testing::internal::CaptureStderr();
  try {
    throw_if_error((*host)->stats().status());
  } catch (const Error& found) {
    try {
      lineage.recover_and_reload(
          found, **host, SaveLineage::OpenPass::kNone, 1,
          [&](const SaveLineage::Recovery&) {
            throw_if_error((*host)->shrink().status());  // written to: its restart is not adopted
            shards.restart(1);
            throw_if_error((*host)->stats().status());
          },
          {}, kBeside);
      ADD_FAILURE() << "a server restarting at every reload was reloaded for good";
    } catch (const Error& e) {
      error = e.message();
    }
  }
  (void)::testing::internal::GetCapturedStderr();
  EXPECT_NE(error.find("restarted 3 times already in this run"), std::string::npos) << error;
  EXPECT_NE(error.find(kBeside), std::string::npos) << error;
  EXPECT_EQ(error.find(kBeside), error.rfind(kBeside)) << error;
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
