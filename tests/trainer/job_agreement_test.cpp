// agree_on_job (trainer/engine/job_agreement.hpp): the trainers of one job, each on its own thread
// over one file rendezvous store, compare what they were started with before they connect. The
// same config agrees (and keys set per machine may differ); a learning rate, a row width, a trainer
// count or a card count that differs is refused on both sides naming the key and both values; a
// trainer that never comes is named; an entry of this trainer's id already in the folder (an
// earlier job's, or two trainers with one id) is refused naming the folder; a trainer that said it
// failed (tell_job_failed) is named at once with its message. agree_on_servers:
// trainers on the same servers agree, one on other servers (or on an in-process table) is
// refused on both sides naming both trainers' servers.
#include "trainer/engine/job_agreement.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "table/sparse_table.hpp"
#include "tests/common/test_data_config.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/schedule/trainer_env.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

class JobAgreementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("gpubox_job_agreement_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  static TrainerConfig config(const std::vector<std::string>& extra = {}) {
    return testing::load_test_config({"runner.metrics_path=", "runner.model_save_path="}, extra);
  }

  // Trainer t of `trainers` (its own count: counts[t]) with configs[t] and cards[t], each on its
  // own thread; their errors ("" when it agreed).
  std::vector<std::string> run(const std::vector<TrainerConfig>& configs,
                               const std::vector<int>& counts, const std::vector<int>& cards,
                               double timeout_s = 20.0) {
    const auto store = comm::open_rendezvous_store("file://" + (root_ / "rendezvous").string());
    std::vector<std::string> errors(configs.size());
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < configs.size(); ++t) {
      threads.emplace_back([&, t] {
        TrainerEnv env;
        env.trainer_id = static_cast<int>(t);
        env.trainers = counts[t];
        try {
          agree_on_job(*store, configs[t], env, cards[t],
                       std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
        } catch (const Error& e) {
          errors[t] = e.what();
        }
      });
    }
    for (auto& thread : threads) thread.join();
    return errors;
  }

  // A folder under root_ holding a file part-0000<i> of each text; its path.
  std::string folder(const std::string& path, const std::vector<std::string>& texts) const {
    fs::create_directories(root_ / path);
    for (std::size_t i = 0; i < texts.size(); ++i) {
      std::ofstream(root_ / path / ("part-0000" + std::to_string(i))) << texts[i];
    }
    return (root_ / path).string();
  }

  fs::path root_;
};

TEST_F(JobAgreementTest, TheSameConfigAgreesAndKeysSetPerMachineMayDiffer) {
  const TrainerConfig a = config();
  const TrainerConfig b = config({"runner.thread_num=3", "runner.host_memory_mb=512"});
  EXPECT_EQ(run({a, b, a}, {3, 3, 3}, {2, 2, 2}), std::vector<std::string>(3, ""));
}

TEST_F(JobAgreementTest, AnotherLearningRateIsRefusedOnBothSidesNamingTheKey) {
  const auto errors =
      run({config(), config({"hyper_parameters.optimizer.learning_rate=0.5"})}, {2, 2}, {1, 1});
  EXPECT_THAT(errors[0], HasSubstr("were started with different settings: "
                                   "hyper_parameters.optimizer.learning_rate: trainer 1 has 0.5, "
                                   "trainer 0 (this one) 0.001"));
  EXPECT_THAT(errors[1], HasSubstr("hyper_parameters.optimizer.learning_rate: trainer 0 has 0.001, "
                                   "trainer 1 (this one) 0.5"));
}

TEST_F(JobAgreementTest, AnotherRowWidthEpochCountOrBatchIsRefused) {
  const auto errors = run({config(), config({"hyper_parameters.sparse_feature_dim=5",
                                             "runner.epochs=2", "runner.train_batch_size=7"})},
                          {2, 2}, {1, 1});
  for (const std::string& error : errors) {
    EXPECT_THAT(error, HasSubstr("hyper_parameters.sparse_feature_dim: trainer"));
    EXPECT_THAT(error, HasSubstr("runner.epochs: trainer"));
    EXPECT_THAT(error, HasSubstr("runner.train_batch_size: trainer"));
  }
}

TEST_F(JobAgreementTest, AnotherTrainerCountOrCardCountIsRefused) {
  const auto counts = run({config(), config()}, {2, 3}, {1, 1}, 2.0);
  EXPECT_THAT(counts[0], HasSubstr("trainers in the job (PADDLE_TRAINERS_NUM): trainer 1 has 3, "
                                   "trainer 0 (this one) 2"));
  EXPECT_THAT(counts[1], HasSubstr("trainers in the job (PADDLE_TRAINERS_NUM): trainer 0 has 2"));
  fs::remove_all(root_);
  const auto cards = run({config(), config()}, {2, 2}, {2, 1});
  EXPECT_THAT(cards[1], HasSubstr("cards per trainer (FLAGS_selected_gpus): trainer 0 has 2, "
                                  "trainer 1 (this one) 1"));
}

// The data files each trainer lists and takes its share of: other files (or sizes) are refused
// (each took its block of its own list: a file trained twice and one never, exit 0); the same
// files in another folder (another mount point or name) agree, and so do other files where each
// reads its own whole.
TEST_F(JobAgreementTest, OtherDataFilesAreRefusedTheSameUnderAnotherMountAgree) {
  const std::string a = folder("here/train", {"1 2\n", "3 4 5\n"});
  const std::string copy = folder("there/data_copy", {"1 2\n", "3 4 5\n"});
  const std::string other = folder("other/train", {"1 2\n", "3 4 5 6\n"});
  EXPECT_EQ(run({config({"runner.train_data_dir=" + a}), config({"runner.train_data_dir=" + copy})},
                {2, 2}, {1, 1}),
            std::vector<std::string>(2, ""));
  fs::remove_all(root_ / "rendezvous");
  const auto errors =
      run({config({"runner.train_data_dir=" + a}), config({"runner.train_data_dir=" + other})},
          {2, 2}, {1, 1});
  EXPECT_THAT(errors[0], HasSubstr("training data files (their name and size): trainer 1 has 2 "
                                   "files, 12 bytes, digest "));
  EXPECT_THAT(errors[0], HasSubstr("trainer 0 (this one) 2 files, 10 bytes, digest "));
  EXPECT_THAT(errors[1], HasSubstr("(first: part-00000)"));
  // The test data each trainer evaluates its share of, alike.
  fs::remove_all(root_ / "rendezvous");
  const auto tests = run({config({"runner.train_data_dir=" + a, "runner.test_data_dir=" + a}),
                          config({"runner.train_data_dir=" + a, "runner.test_data_dir=" + other})},
                         {2, 2}, {1, 1});
  EXPECT_THAT(tests[1], HasSubstr("test data files (their name and size): trainer 0 has 2 files, "
                                  "10 bytes"));
  EXPECT_THAT(tests[1], Not(HasSubstr("training data files")));
  // The PS modes without runner.split_file_list: each trainer reads its own files whole (and
  // evaluates every test file, gathering no AUC buckets).
  fs::remove_all(root_ / "rendezvous");
  EXPECT_EQ(run({config({"runner.train_data_dir=" + a, "runner.test_data_dir=" + a,
                         "runner.sync_mode=async"}),
                 config({"runner.train_data_dir=" + other, "runner.test_data_dir=" + other,
                         "runner.auc_buckets_log2=21", "runner.sync_mode=async"})},
                {2, 2}, {1, 1}),
            std::vector<std::string>(2, ""));
}

// A job that only evaluates (--mode infer, gpubox.evaluate) compares the files it evaluates, not
// the training data (which one machine may lack), and refuses others.
TEST_F(JobAgreementTest, AnEvaluatingJobComparesTheFilesItEvaluates) {
  const std::string a = folder("here/test", {"1 2\n", "3 4 5\n"});
  const std::string other = folder("other/test", {"1 2\n", "3 4 5 6\n"});
  const auto evaluating = [&](const std::string& train, const std::string& data) {
    TrainerConfig c = config({"runner.train_data_dir=" + train});
    c.evaluated_files = data_files(data);
    return c;
  };
  EXPECT_EQ(run({evaluating(a, a), evaluating((root_ / "absent").string(), a)}, {2, 2}, {1, 1}),
            std::vector<std::string>(2, ""));
  fs::remove_all(root_ / "rendezvous");
  const auto errors = run({evaluating(a, a), evaluating(a, other)}, {2, 2}, {1, 1});
  EXPECT_THAT(errors[0], HasSubstr("evaluated data files (their name and size): trainer 1 has 2 "
                                   "files, 12 bytes"));
  EXPECT_THAT(errors[0], Not(HasSubstr("training data files")));
}

// What shapes the job's meetings though no result: how many passes an epoch, whether it
// evaluates and saves, the AUC's buckets (one trainer waited alone at a meeting, or a gather of
// another size aborted the job): refused at the start naming them.
TEST_F(JobAgreementTest, OtherPassesEvaluationSavesOrAucBucketsAreRefused) {
  const std::string train =
      (fs::path(GPUBOX_SOURCE_DIR) / "configs/data/sample_data/train").string();
  const auto errors =
      run({config({"runner.test_data_dir=" + train}),
           config({"runner.pass_dirs=[" + train + ", " + train + "]", "runner.auc_buckets_log2=21",
                   "runner.model_save_path=" + (root_ / "saves").string()})},
          {2, 2}, {1, 1});
  EXPECT_THAT(errors[1], HasSubstr("passes an epoch (runner.pass_dirs): trainer 0 has 1, trainer "
                                   "1 (this one) 2"));
  EXPECT_THAT(errors[1], HasSubstr("evaluates each epoch (runner.test_data_dir): trainer 0 has "
                                   "yes, trainer 1 (this one) no"));
  EXPECT_THAT(errors[1], HasSubstr("runner.auc_buckets_log2: trainer 0 has 20"));
  EXPECT_THAT(errors[1], HasSubstr("saves (runner.model_save_path, runner.save_mode): trainer 0 "
                                   "has no, trainer 1 (this one) base"));
}

TEST_F(JobAgreementTest, ATrainerThatNeverComesIsNamed) {
  const auto errors = run({config()}, {2}, {1}, 0.2);
  EXPECT_THAT(errors[0], HasSubstr("trainer 1 of the job (PADDLE_TRAINERS_NUM=2) did not arrive "
                                   "within runner.collective_timeout_s (0.2 s)"));
}

// A trainer that failed (tell_job_failed, from the launcher's environment: its config refused,
// say) is named with its message at once, not after the timeout; the environment of a job of one
// trainer, or without a rendezvous folder, tells nothing.
TEST_F(JobAgreementTest, ATrainerThatSaidItFailedIsNamedAtOnce) {
  const std::string folder = "file://" + (root_ / "rendezvous").string();
  setenv("PADDLE_TRAINER_ID", "1", 1);
  setenv("PADDLE_TRAINERS_NUM", "2", 1);
  setenv("GPUBOX_RENDEZVOUS", folder.c_str(), 1);
  tell_job_failed("/cfg.yaml:3: unknown key runner.epoch (did you mean runner.epochs?)");
  setenv("PADDLE_TRAINERS_NUM", "1", 1);
  tell_job_failed("a job of one trainer tells nobody");
  unsetenv("PADDLE_TRAINER_ID");
  unsetenv("PADDLE_TRAINERS_NUM");
  unsetenv("GPUBOX_RENDEZVOUS");
  const auto started = std::chrono::steady_clock::now();
  const auto errors = run({config()}, {2}, {1}, 20.0);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
  EXPECT_THAT(errors[0], HasSubstr("trainer 1 of the job failed: /cfg.yaml:3: unknown key "
                                   "runner.epoch (did you mean runner.epochs?)"));
  const auto store = comm::open_rendezvous_store(folder);
  EXPECT_THROW(store->get("job/failed/0", std::chrono::milliseconds(0)), Error);
}

TEST_F(JobAgreementTest, AFolderHoldingThisTrainersEntryIsRefused) {
  ASSERT_EQ(run({config(), config()}, {2, 2}, {1, 1}), std::vector<std::string>(2, ""));
  // The same job again in the same folder: each trainer finds its own entry there.
  for (const std::string& error : run({config(), config()}, {2, 2}, {1, 1}, 0.5)) {
    EXPECT_THAT(error, HasSubstr("already holds trainer "));
    EXPECT_THAT(error, HasSubstr("the folder of an earlier job (give each job a fresh, empty "
                                 "folder), or two trainers started with PADDLE_TRAINER_ID="));
  }
}

// Two trainers started with one id at once: both found the id's entry unset before either wrote
// it, and both waited out runner.collective_timeout_s for the id nobody had. The entry is made
// once (RendezvousStore::set_once): one trainer is refused, and once it tells its failure (as
// gpubox_train does, job/failed/<its id>) the other ends at once, naming it. Rounds of both at
// once, a thread each.
TEST_F(JobAgreementTest, TwoTrainersWithOneIdEndAtOnceWhicheverWins) {
  for (int round = 0; round < 5; ++round) {
    const auto store = comm::open_rendezvous_store(
        "file://" + (root_ / ("one_id_" + std::to_string(round))).string());
    std::vector<std::string> errors(2);
    std::vector<std::thread> threads;
    const auto started = std::chrono::steady_clock::now();
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&, t] {
        TrainerEnv env;
        env.trainer_id = 0;
        env.trainers = 2;
        try {
          agree_on_job(*store, config(), env, 1, std::chrono::milliseconds(20000));
        } catch (const Error& e) {
          errors[t] = e.what();
          if (errors[t].find("already holds trainer 0's entry") != std::string::npos) {
            store->set("job/failed/0", std::vector<char>(errors[t].begin(), errors[t].end()));
          }
        }
      });
    }
    for (auto& thread : threads) thread.join();
    EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
    const auto refused_itself = [](const std::string& e) {  // not the other's, quoted
      return e.rfind("GPUBOX_RENDEZVOUS=", 0) == 0 &&
             e.find("already holds trainer 0's entry") != std::string::npos;
    };
    EXPECT_EQ(std::count_if(errors.begin(), errors.end(), refused_itself), 1) << errors[0] << "\n"
                                                                              << errors[1];
    for (const std::string& error : errors) {
      if (refused_itself(error)) continue;
      EXPECT_THAT(error, HasSubstr("another trainer started with this one's PADDLE_TRAINER_ID=0 "
                                   "failed"));
    }
  }
}

// The agreement lists the data folders quietly: what a folder holds that is not data (here a
// folder inside it) is warned of once, by the run's own listing, not again by the agreement's.
TEST_F(JobAgreementTest, TheAgreementListsTheDataWithoutWarningAgain) {
  const std::string data = folder("train", {"1 2\n", "3 4 5\n"});
  fs::create_directories(root_ / "train" / "not_data");
  const std::string warning = "skipped 1 entry of " + data;
  ::testing::internal::CaptureStderr();
  const std::vector<std::string> errors =
      run({config({"runner.train_data_dir=" + data}), config({"runner.train_data_dir=" + data})},
          {2, 2}, {1, 1});
  const std::string agreed = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
  EXPECT_THAT(agreed, Not(HasSubstr(warning)));
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(data_files(data).size(), 2u);
  EXPECT_THAT(::testing::internal::GetCapturedStderr(), HasSubstr(warning));
}

// Two trainers, each with its own host tier: the same servers agree (clients of their own, as
// each trainer's is), other servers (the same count, another instance) or an in-process table
// are refused on both sides, naming both trainers' servers.
TEST_F(JobAgreementTest, TrainersOnOtherServersAreRefusedOnBothSides) {
  const TrainerConfig cfg = ps_modes::ps_test_config({});
  ps_modes::Servers job(cfg, 2);
  ps_modes::Servers other(cfg, 2);
  auto in_process = table::SparseTable::open(cfg.sparse, cfg.host_tier.table);
  throw_if_error(in_process.status());
  struct Case {
    std::string name;
    std::unique_ptr<table::HostTier> second;
    bool agree;
  };
  std::vector<Case> cases;
  cases.push_back({"same", ps_modes::connect_client(job, cfg), true});
  cases.push_back({"other", ps_modes::connect_client(other, cfg), false});
  cases.push_back({"in_process", std::move(in_process).value(), false});
  for (Case& c : cases) {
    SCOPED_TRACE(c.name);
    const auto store = comm::open_rendezvous_store("file://" + (root_ / c.name).string());
    const auto first = ps_modes::connect_client(job, cfg);
    const table::HostTier* tiers[2] = {first.get(), c.second.get()};
    std::string errors[2];
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&, t] {
        TrainerEnv env;
        env.trainer_id = t;
        env.trainers = 2;
        try {
          agree_on_servers(*store, env, *tiers[t], std::chrono::milliseconds(20000));
        } catch (const Error& e) {
          errors[t] = e.what();
        }
      });
    }
    for (auto& thread : threads) thread.join();
    for (int t = 0; t < 2; ++t) {
      if (c.agree) {
        EXPECT_EQ(errors[t], "") << t;
        continue;
      }
      EXPECT_THAT(errors[t], HasSubstr("reach different servers")) << t;
      // Both trainers' servers named, the job's by its endpoints.
      EXPECT_THAT(errors[t], HasSubstr(job.endpoints().substr(0, job.endpoints().find(','))));
      EXPECT_THAT(errors[t], HasSubstr(c.name == "other" ? other.endpoints().substr(
                                                               0, other.endpoints().find(','))
                                                         : std::string("an in-process table")));
    }
  }
}

}  // namespace
}  // namespace gpubox::trainer
