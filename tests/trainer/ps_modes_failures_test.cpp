// How a parameter-server job ends when something fails: a dead server or trainer (also one dead
// within a sync step) ends it with an error naming it within its timeout, a failed dense exchange
// left at the end is logged naming the server, data without a valid instance is an error in every
// mode, a save that fails and is not repaired ends the job with its pass line logged, and a
// meeting waited out says a trainer died or is stuck. Jobs stopped on every trainer (diverged, a
// dead output) are ps_modes_failures_stops_test.cpp; a trainer's failure told to the others,
// ps_modes_failures_told_test.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>

#include "common/error.hpp"
#include "table/server/remote_host_tier.hpp"
#include "tests/trainer/forwarding_schedule.hpp"
#include "tests/trainer/ps_modes_fixture.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/ps_modes/ps_worker.hpp"
#include "trainer/schedule/epoch_loop.hpp"
#include "trainer/schedule/schedule.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

namespace fs = std::filesystem;

using ps_test::PsModes;

// A server that dies mid-job: the trainer's next call fails after runner.server_timeout_s,
// naming the server, never a hang.
TEST_F(PsModes, ADeadServerEndsTheJobWithAnErrorNamingIt) {
  const TrainerConfig cfg = config({"runner.sync_mode=async", "runner.server_timeout_s=1"});
  Servers shards(cfg, 2);
  TrainerEnv env;
  env.servers = shards.endpoints();
  PsTrainer trainer(cfg, env);
  const auto train = data_files((root_ / "train").string());
  trainer.train_pass(train);
  shards.stop(1);
  const auto started = std::chrono::steady_clock::now();
  try {
    trainer.train_pass(train);
    ADD_FAILURE() << "a pass against a dead server succeeded";
  } catch (const Error& e) {
    const std::string what = e.what();
    const std::string dead = shards.endpoints().substr(shards.endpoints().find(',') + 1);
    EXPECT_NE(what.find(dead), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(30));
}

// An async dense exchange still under way when its worker is destroyed (a step threw before the
// pass's last sync_dense took it) that then fails is logged naming the server, not dropped.
TEST_F(PsModes, AFailedDenseExchangeLeftAtTheEndIsLoggedNamingTheServer) {
  const TrainerConfig cfg = config({"runner.sync_mode=async"});
  Servers shards(cfg, 1);
  auto servers = connect_client(shards, cfg, /*deadline_s=*/1.0, /*connect_timeout_s=*/0.5);
  device::Card card(0, 0, 0, 1);
  auto worker = std::make_unique<PsWorker>(card, *servers, cfg);
  worker->sync_dense(0.0f);  // the servers' dense table
  shards.stop(0);
  worker->exchange_dense();  // fails on its own thread: nothing takes its status
  ::testing::internal::CaptureStderr();
  worker.reset();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("the dense exchange under way when the thread stopped failed"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find(shards.endpoints()), std::string::npos) << log;
}

// The PS modes rank a trainer's threads' cards 0.. on every trainer: the worker of trainer 1 of 2
// on its first card draws other dropout masks than trainer 0's, whose are the gpubox mode's
// DenseModel's on that card.
TEST_F(PsModes, EveryTrainersWorkersDrawTheirOwnDropoutMasks) {
  const TrainerConfig cfg = config({"runner.sync_mode=async", "hyper_parameters.dnn_dropout=0.5"});
  Servers shards(cfg, 1);
  auto servers = connect_client(shards, cfg);
  device::Card card(0, 0, 0, 1);
  PsWorker zero(card, *servers, cfg, 0);
  PsWorker one(card, *servers, cfg, 1);
  const DenseModel gpubox(card, cfg.dense_model_config());
  ASSERT_TRUE(zero.model().dropout().on());
  for (std::size_t l = 0; l <= cfg.hyper.fc_sizes.size(); ++l) {  // the hidden layers, the output
    EXPECT_EQ(zero.model().dropout().mask(l).layer_key, gpubox.dropout().mask(l).layer_key) << l;
    EXPECT_NE(one.model().dropout().mask(l).layer_key, zero.model().dropout().mask(l).layer_key)
        << l;
  }
}

// In sync mode a trainer that stops coming ends the others' job at the next barrier, after
// runner.collective_timeout_s, with an error naming it.
TEST_F(PsModes, ADeadTrainerEndsASyncJobWithAnErrorNamingIt) {
  const TrainerConfig cfg = config({"runner.sync_mode=sync", "runner.collective_timeout_s=1"});
  Servers shards(cfg, 1);
  const auto train = data_files((root_ / "train").string());
  std::string error;
  std::thread survivor([&] {
    try {
      TrainerEnv env;
      env.servers = shards.endpoints();
      env.trainers = 2;
      PsTrainer trainer(cfg, env);
      trainer.train_pass(train);
      trainer.train_pass(train);  // trainer 1 is gone by now
    } catch (const Error& e) {
      error = e.what();
    }
  });
  {
    TrainerEnv env;
    env.servers = shards.endpoints();
    env.trainers = 2;
    env.trainer_id = 1;
    PsTrainer trainer(cfg, env);
    trainer.train_pass(train);
  }  // trainer 1 dies after its first pass
  const auto started = std::chrono::steady_clock::now();
  survivor.join();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(30));
  EXPECT_NE(error.find("missing: trainer 1"), std::string::npos) << error;
  EXPECT_NE(error.find("runner.collective_timeout_s"), std::string::npos) << error;
}

// A sync trainer that dies between a step's pull barrier and its step barrier (its push made,
// here thrown by its progress callback, which runs on trainer 0 between the two) ends the
// other's job at that step's barrier after runner.collective_timeout_s, naming it and the step.
TEST_F(PsModes, ATrainerDeadWithinASyncStepEndsTheJobNamingItAndTheStep) {
  constexpr std::size_t kDeathStep = 3;  // from 0
  const TrainerConfig cfg = config({"runner.sync_mode=sync", "runner.collective_timeout_s=1",
                                    "runner.thread_num=2", "runner.print_interval=1"});
  Servers shards(cfg, 1);
  const auto train = data_files((root_ / "train").string());
  std::string error;
  std::thread survivor([&] {
    try {
      TrainerEnv env;
      env.servers = shards.endpoints();
      env.trainers = 2;
      env.trainer_id = 1;
      PsTrainer trainer(cfg, env);
      trainer.train_pass(train);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  std::string death;
  {
    TrainerEnv env;
    env.servers = shards.endpoints();
    env.trainers = 2;
    PsTrainer trainer(cfg, env);
    StepHooks hooks;
    hooks.on_progress = [&](const StepProgress& progress) {
      if (progress.step == kDeathStep + 1) GPUBOX_FAIL("trainer 0 dies after step ", kDeathStep);
    };
    trainer.set_step_hooks(hooks);
    try {
      trainer.train_pass(train);
    } catch (const Error& e) {
      death = e.what();
    }
  }
  const auto started = std::chrono::steady_clock::now();
  survivor.join();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(30));
  EXPECT_NE(death.find("trainer 0 dies after step 3"), std::string::npos) << death;
  EXPECT_NE(error.find("pass 0, step 3:"), std::string::npos) << error;
  EXPECT_NE(error.find("missing: trainer 0"), std::string::npos) << error;
  EXPECT_NE(error.find("runner.collective_timeout_s=1"), std::string::npos) << error;
}

// Data whose every line is malformed (here PaddleRec's slot_dnn lines, which start with a show
// field the config does not name) trains nothing: every PS mode and both readers end with the
// same error naming the file and why its lines were skipped, and write no save.
TEST_F(PsModes, DataWithoutAValidInstanceIsAnErrorInEveryMode) {
  const fs::path bad = root_ / "all_malformed";
  fs::create_directories(bad);
  {
    std::ofstream out(bad / "part-0");
    for (int i = 0; i < 10; ++i) out << "1 0 1:" << 100 + i << " 2:" << 200 + i << "\n";
  }
  for (const char* mode : {"async", "sync", "geo"}) {
    for (const char* reader : {"InmemoryDataset", "QueueDataset"}) {
      const fs::path saves = root_ / (std::string("malformed_saves_") + mode + reader);
      const TrainerConfig cfg =
          config({"runner.train_data_dir=" + bad.string(),
                  "runner.test_data_dir=", std::string("runner.sync_mode=") + mode,
                  std::string("runner.reader_type=") + reader, "runner.save_mode=base",
                  "runner.model_save_path=" + saves.string()});
      Servers shards(cfg, 1);
      TrainerEnv env;
      env.servers = shards.endpoints();
      PsTrainer trainer(cfg, env);
      try {
        trainer.train();
        ADD_FAILURE() << mode << " " << reader << " trained on nothing";
      } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("pass 0: no valid instance in 1 file(s) (10 lines, 10 malformed): " +
                            (bad / "part-0").string()),
                  std::string::npos)
            << mode << " " << reader << ": " << what;
      }
      EXPECT_FALSE(fs::exists(saves / "0")) << mode << " " << reader;
    }
  }
}

// A schedule whose save of pass `pass` fails as on a full disk: no server restarted, so nothing
// repairs it. The loop and the trainer are the real ones.
class FailingSave final : public testing::ForwardingSchedule {
 public:
  FailingSave(Schedule& inner, int64_t pass) : ForwardingSchedule(inner), pass_(pass) {}
  void save(const std::string& dir) override {
    if (passes_done() == pass_ + 1) GPUBOX_FAIL("writing ", dir, ": No space left on device");
    ForwardingSchedule::save(dir);
  }

 private:
  int64_t pass_;
};

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Pass 1's save fails and ends the job: the pass is not recorded (no line printed, none in
// runner.metrics_path: a repaired failure would train it again and record it then), but its
// line is logged, so that the pass the job ended in leaves its figures.
TEST_F(PsModes, ASaveThatFailsUnrepairedEndsTheJobWithItsPassLineLogged) {
  const fs::path metrics_path = root_ / "failed_save_metrics.jsonl";
  fs::remove(metrics_path);
  const TrainerConfig cfg =
      config({"runner.train_data_dir=" + (root_ / "train").string(),
              "runner.test_data_dir=", "runner.sync_mode=async", "runner.save_mode=checkpoint",
              "runner.model_save_path=" + (root_ / "failed_save").string(),
              "runner.metrics_path=" + metrics_path.string(), "runner.epochs=2"});
  Servers shards(cfg, 2);
  TrainerEnv env;
  env.servers = shards.endpoints();
  PsTrainer trainer(cfg, env);
  FailingSave failing(trainer, 1);
  std::string error;
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  try {
    run_epochs(failing, cfg, "", false);
  } catch (const Error& e) {
    error = e.what();
  }
  const std::string out = ::testing::internal::GetCapturedStdout();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(error.find("No space left on device"), std::string::npos) << error;
  EXPECT_EQ(count(out, "pass: 0, using time"), 1u) << out;
  EXPECT_EQ(count(out, "pass: 1, using time"), 0u) << out;
  const auto logged = log.find("pass: 1, using time");
  ASSERT_NE(logged, std::string::npos) << log;
  const std::string line = log.substr(logged, log.find('\n', logged) - logged);
  EXPECT_NE(line.find("(its shrink or save failed: not recorded)"), std::string::npos) << log;
  std::ifstream file(metrics_path);
  const std::string recorded((std::istreambuf_iterator<char>(file)),
                             std::istreambuf_iterator<char>());
  EXPECT_EQ(count(recorded, "\n"), 1u) << recorded;
  EXPECT_EQ(count(recorded, "{\"pass\": 0,"), 1u) << recorded;
}

// A trainer alone at a meeting of 2 waits runner.collective_timeout_s out: its error says a
// trainer died or is stuck (the barrier's wait ran out: DeadlineExceeded), not that the first
// server, which holds the barrier, was lost.
TEST_F(PsModes, AMeetingWaitedOutSaysATrainerDiedOrIsStuck) {
  const TrainerConfig cfg = config({"runner.sync_mode=async", "runner.collective_timeout_s=1"});
  Servers shards(cfg, 1);
  TrainerEnv env;
  env.servers = shards.endpoints();
  env.trainers = 2;
  std::string error;
  try {
    PsTrainer alone(cfg, env);
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("trainer 0: waiting for all 2 trainers to start the job"), std::string::npos)
      << error;
  EXPECT_NE(error.find("a trainer died or is stuck"), std::string::npos) << error;
  EXPECT_NE(error.find("DeadlineExceeded"), std::string::npos) << error;
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
