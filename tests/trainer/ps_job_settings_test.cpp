// The trainers of a PS job compare their settings at its start through the first server
// (trainer/ps_modes/ps_job_settings.hpp): trainers of another mode, slot order or learning rate
// are refused on every side (the one that differs names the key and both values, the others
// name it); two trainers started with one PADDLE_TRAINER_ID are refused naming the id (one share
// of the files trained twice, another never); settings a trainer keeps for itself (async's
// Hogwild threads) are not compared; a server restarted within the job under another rule is
// refused when adopted. Each trainer its own thread of this process.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "tests/trainer/ps_modes_fixture.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using ps_test::PsModes;

// Trainers with ids `ids` of a job of ids.size() trainers, each its own config, started at
// once against one server; each one's error ("" when it started).
std::vector<std::string> start(const std::vector<TrainerConfig>& configs,
                               const std::vector<int>& ids) {
  Servers shards(configs[0], 1);
  std::vector<std::string> errors(configs.size());
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < configs.size(); ++t) {
    threads.emplace_back([&, t] {
      TrainerEnv env;
      env.servers = shards.endpoints();
      env.trainers = static_cast<int>(configs.size());
      env.trainer_id = ids[t];
      try {
        PsTrainer trainer(configs[t], env);
      } catch (const Error& e) {
        errors[t] = e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return errors;
}

const std::string kDiffer = "the trainers of this job were started with different settings: ";

TEST_F(PsModes, TrainersOfAnotherModeAreRefusedOnEverySide) {
  const TrainerConfig async = config({"runner.sync_mode=async", "runner.collective_timeout_s=20"});
  const TrainerConfig geo = config({"runner.sync_mode=geo", "runner.collective_timeout_s=20"});
  const auto errors = start({async, geo, async}, {0, 1, 2});
  EXPECT_NE(errors[1].find(kDiffer + "runner.sync_mode: trainer 0 has async, trainer 1 (this "
                                     "one) geo"),
            std::string::npos)
      << errors[1];
  for (const std::size_t t : {0u, 2u}) {
    EXPECT_NE(errors[t].find(kDiffer + "trainer(s) 1 differ from trainer 0"), std::string::npos)
        << t << ": " << errors[t];
  }
}

TEST_F(PsModes, TrainersWithAnotherSlotOrderOrLearningRateAreRefused) {
  const TrainerConfig cfg = config({"runner.sync_mode=async"});
  std::string reversed = "[";
  for (int s = cfg.num_sparse_slots(); s >= 1; --s) {
    reversed += std::to_string(s) + (s > 1 ? ", " : "]");
  }
  const TrainerConfig other =
      config({"runner.sync_mode=async", "hyper_parameters.slot_names=" + reversed,
              "hyper_parameters.optimizer.learning_rate=0.5"});
  const auto errors = start({cfg, other}, {0, 1});
  EXPECT_NE(errors[1].find("hyper_parameters.slot_names: trainer 0 has"), std::string::npos)
      << errors[1];
  EXPECT_NE(errors[1].find("hyper_parameters.optimizer.learning_rate: trainer 0 has"),
            std::string::npos)
      << errors[1];
  EXPECT_NE(errors[0].find("trainer(s) 1 differ from trainer 0"), std::string::npos) << errors[0];
}

TEST_F(PsModes, TwoTrainersWithOneIdAreRefusedNamingIt) {
  const TrainerConfig cfg = config({"runner.sync_mode=async"});
  for (const std::string& error : start({cfg, cfg}, {0, 0})) {
    EXPECT_NE(error.find("the trainers of this job do not hold one id each: PADDLE_TRAINER_ID=0 "
                         "was given to 2 trainers; PADDLE_TRAINER_ID=1 was given to no trainer"),
              std::string::npos)
        << error;
  }
}

TEST_F(PsModes, AsyncTrainersMayRunOtherThreadCountsButGeoTrainersMayNot) {
  const auto agreed = start({config({"runner.sync_mode=async", "runner.thread_num=1"}),
                             config({"runner.sync_mode=async", "runner.thread_num=2"})},
                            {0, 1});
  EXPECT_EQ(agreed, std::vector<std::string>(2, ""));
  const auto geo = start({config({"runner.sync_mode=geo", "runner.thread_num=1"}),
                          config({"runner.sync_mode=geo", "runner.thread_num=2"})},
                         {0, 1});
  EXPECT_NE(geo[1].find("runner.thread_num: trainer 0 has 1, trainer 1 (this one) 2"),
            std::string::npos)
      << geo[1];
}

// A server restarted within the job with another sparse rule: adopting it (what a recovery does
// before it reloads the last save) is refused naming the key, as connecting to it is; it was
// adopted, and the job trained on under its rule.
TEST_F(PsModes, AServerRestartedWithAnotherRuleIsRefusedWhenAdopted) {
  const TrainerConfig cfg = config({"runner.sync_mode=async"});
  Servers shards(cfg, 1);
  auto client = connect_client(shards, cfg, /*deadline_s=*/2.0, /*connect_timeout_s=*/0.5);
  const TrainerConfig other =
      config({"runner.sync_mode=async", "hyper_parameters.sparse_optimizer.learning_rate=0.5"});
  shards.restart(0, nullptr, &other);
  std::vector<float> values(3, 0.0f);
  const Status found =
      client->dense(table::server::DenseAction::kWrite, "probe", &values);  // finds the restart
  EXPECT_FALSE(found.ok());
  ASSERT_TRUE(client->restart_pending(0)) << found.to_string();
  try {
    client->accept_restarts();
    ADD_FAILURE() << "a server restarted under another rule was adopted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("a server restarted within the job"), std::string::npos) << what;
    EXPECT_NE(what.find("hyper_parameters.sparse_optimizer.learning_rate"), std::string::npos)
        << what;
  }
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
