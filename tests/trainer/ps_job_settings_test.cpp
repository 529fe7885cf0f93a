// The trainers of a PS job compare their settings at its start through the first server
// (trainer/ps_modes/ps_job_settings.hpp): trainers of another mode, slot order or learning rate
// are refused on every side (the one that differs names the key and both values, the others
// name it); two trainers started with one PADDLE_TRAINER_ID are refused naming the id (one share
// of the files trained twice, another never); settings a trainer keeps for itself (async's
// Hogwild threads) are not compared; a server restarted within the job under another rule is
// refused when adopted; the servers serve one running job at a time, and a job whose claim was
// erased claims them again. Each trainer its own thread of this process.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "tests/trainer/ps_modes_fixture.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/schedule/servers_owner.hpp"

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
  const TrainerConfig cfg = config(
      {"runner.sync_mode=async", "runner.collective_timeout_s=3", "runner.peer_timeout_s=1"});
  for (const std::string& error : start({cfg, cfg, cfg}, {0, 1, 1})) {
    EXPECT_NE(error.find("the trainers of this job do not hold one id each: PADDLE_TRAINER_ID=1 "
                         "was given to 2 trainers; PADDLE_TRAINER_ID=2 was given to no trainer"),
              std::string::npos)
        << error;
  }
  // Two trainers 0: the second's claim of the servers finds the first's
  // (trainer/schedule/servers_owner.hpp), or, when both claimed at once, their claims in the
  // settings' table are counted.
  const auto zeros = start({cfg, cfg}, {0, 0});
  const auto named = [](const std::string& error) {
    return error.find("its PADDLE_TRAINER_ID is 0 twice") != std::string::npos ||
           error.find("PADDLE_TRAINER_ID=0 was given to 2 trainers") != std::string::npos;
  };
  EXPECT_TRUE(named(zeros[0]) || named(zeros[1])) << zeros[0] << "\n" << zeros[1];
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

// One job at a time on a set of servers (trainer/schedule/servers_owner.hpp): a claim that beats
// refuses another job's start, naming it; a released claim is taken at once; a claim that stopped
// beating is taken over after its wait; a job whose claim another took over is told so at its next
// beat.
TEST_F(PsModes, TheServersServeOneRunningJobAtATime) {
  const TrainerConfig cfg = config({"runner.sync_mode=async"});
  Servers shards(cfg, 1);
  auto first = connect_client(shards, cfg, /*deadline_s=*/2.0, /*connect_timeout_s=*/0.5);
  auto second = connect_client(shards, cfg, /*deadline_s=*/2.0, /*connect_timeout_s=*/0.5);
  constexpr double kInterval = 0.2;  // a claim that waits for another waits 0.5 s
  {
    ServersOwner running(*first, kInterval);
    try {
      ServersOwner other(*second, kInterval);
      ADD_FAILURE() << "a second job claimed the servers of a running one";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("serve another job that is running: its trainer 0 "
                                           "beats in the first server's table ps_job_owner"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(running.taken_over(), "");
  }
  // Released as it ended: the next claim does not wait for its beats.
  const auto started = std::chrono::steady_clock::now();
  auto next = std::make_unique<ServersOwner>(*second, kInterval);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::duration<double>(0.4));
  // Another claim written over this one (a start that did not see its beats): told at a beat.
  std::vector<float> stale = {7.0f, 0.0f, 0.0f, 0.0f, 50.0f};
  ASSERT_TRUE(first->dense(table::server::DenseAction::kWrite, kOwnerTable, &stale).ok());
  for (int i = 0; i < 300 && next->taken_over().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_NE(next->taken_over().find("another job took the servers over"), std::string::npos);
  next.reset();  // not its claim any more: left as it is
  std::vector<float> table(5, 0.0f);
  ASSERT_TRUE(first->dense(table::server::DenseAction::kRead, kOwnerTable, &table).ok());
  EXPECT_EQ(table[0], 7.0f);
  // That claim does not beat: taken over after 2.5 of its intervals (50 ms), not sooner and not
  // much later, and the table holds the new claim.
  const auto waited_from = std::chrono::steady_clock::now();
  ServersOwner after(*second, kInterval);
  const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - waited_from;
  EXPECT_GE(waited.count(), 0.125);
  EXPECT_LT(waited.count(), 1.0);
  EXPECT_EQ(after.taken_over(), "");
  ASSERT_TRUE(first->dense(table::server::DenseAction::kRead, kOwnerTable, &table).ok());
  EXPECT_FALSE(table[0] == 7.0f && table[1] == 0.0f && table[2] == 0.0f);
  EXPECT_FALSE(table[0] == 0.0f && table[1] == 0.0f && table[2] == 0.0f);
  EXPECT_EQ(table[4], 200.0f);  // its interval in ms
}

// An ending job's release reads its claim, then zeroes the table: a job that took the servers over
// between the two has its claim erased (zeroed here by hand), and claims them again at its next
// beat, so that another start is still refused while it runs.
TEST_F(PsModes, AClaimErasedWhileItsJobRunsIsClaimedAgainAtItsNextBeat) {
  const TrainerConfig cfg = config({"runner.sync_mode=async"});
  Servers shards(cfg, 1);
  auto first = connect_client(shards, cfg, /*deadline_s=*/2.0, /*connect_timeout_s=*/0.5);
  auto second = connect_client(shards, cfg, /*deadline_s=*/2.0, /*connect_timeout_s=*/0.5);
  constexpr double kInterval = 0.1;
  ServersOwner running(*first, kInterval);
  std::vector<float> claim(5, 0.0f);
  ASSERT_TRUE(second->dense(table::server::DenseAction::kRead, kOwnerTable, &claim).ok());
  ASSERT_FALSE(claim[0] == 0.0f && claim[1] == 0.0f && claim[2] == 0.0f);
  std::vector<float> zeros(5, 0.0f);
  ASSERT_TRUE(second->dense(table::server::DenseAction::kWrite, kOwnerTable, &zeros).ok());
  std::vector<float> table(5, 0.0f);
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(second->dense(table::server::DenseAction::kRead, kOwnerTable, &table).ok());
    if (table[0] != 0.0f || table[1] != 0.0f || table[2] != 0.0f) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(table[0], claim[0]);
  EXPECT_EQ(table[1], claim[1]);
  EXPECT_EQ(table[2], claim[2]);
  EXPECT_EQ(running.taken_over(), "");
  EXPECT_THROW(ServersOwner other(*second, kInterval), Error);
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
