// Several trainer processes (the real gpubox_train binaries, simulated cards, Gloo over
// loopback, a file rendezvous store), small generated data:
//  - 2 trainers x 2 cards train what 1 trainer x 4 cards trains: the same files, named so that
//    each global card reads the same batch at every step in both layouts (files of one batch
//    each; the 2 x 2 folder orders them so that the split by trainer id and then by card meets
//    the 1 x 4 split by card), so only the dense all-reduce's order of summation differs
//    (Gloo's ring against rank order): the test AUC and logloss agree within 0.001;
//  - 3 trainers x 1 card with uneven shares (7, 7, 6 files; and 1, 1, 0 files: trainer 2 gets
//    none and still joins every step): the job trains and evaluates all the data (examples
//    counted over every trainer), and every trainer appends its own metrics lines;
//  - a trainer killed mid-run ends the other within the collective timeout, with an error
//    naming the dead trainer; a server that stops answering ends every trainer within seconds
//    (runner.peer_timeout_s), naming it;
//  - Collective mode: 1 trainer x 2 cards = 2 trainers x 1 card (saves with no server), and a
//    killed trainer ends the other.
// Saves with gpubox_server: multi_trainer_saves_test.cpp (the same binary and fixture,
// multi_trainer_fixture.hpp).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "tests/integration/child_process.hpp"
#include "tests/integration/multi_trainer_fixture.hpp"

namespace gpubox {
namespace {

namespace fs = std::filesystem;
using multi_trainer_test::kLinesPerFile;
using multi_trainer_test::kRunSeconds;
using multi_trainer_test::kSteps;
using multi_trainer_test::MultiTrainer;
using testing::ChildProcess;

TEST_F(MultiTrainer, TwoTrainersOfTwoCardsTrainAsOneOfFour) {
  const std::string one = run_job("one_by_four", 1, "0,1,2,3", "train_1x4");
  const std::string two = run_job("two_by_two", 2, "0,1", "train_2x2");
  const double auc_one = last_value(one, "epoch: 2, test auc: ");
  const double auc_two = last_value(two, "epoch: 2, test auc: ");
  const double loss_one = last_value(one, "test logloss: ");
  const double loss_two = last_value(two, "test logloss: ");
  ASSERT_FALSE(std::isnan(auc_one)) << one;
  ASSERT_FALSE(std::isnan(auc_two)) << two;
  EXPECT_GT(auc_one, 0.52) << one;  // it learned something: the comparison means something
  std::printf("test auc 1 x 4: %.6f, 2 x 2: %.6f; logloss %.6f, %.6f\n", auc_one, auc_two,
              last_value(one, "test logloss: "), last_value(two, "test logloss: "));
  EXPECT_NEAR(auc_two, auc_one, 0.001) << "1 x 4:\n" << one << "\n2 x 2:\n" << two;
  EXPECT_NEAR(loss_two, loss_one, 0.001);
  // Every instance is counted once, over both trainers.
  EXPECT_EQ(last_value(two, "test examples: "), 2.0 * kSteps * kLinesPerFile);
  // Trainer 0 prints the job's lines; each trainer appends its own metrics lines.
  const auto lines0 = lines_of(root_ / "two_by_two.jsonl");
  const auto lines1 = lines_of(root_ / "two_by_two.trainer1.jsonl");
  EXPECT_EQ(lines0.size(), 6u);  // 3 passes + 3 test lines
  ASSERT_EQ(lines1.size(), lines0.size());
  EXPECT_NE(lines1[0].find("\"trainer\": 1"), std::string::npos) << lines1[0];
  EXPECT_NE(lines1[0].find("\"interprocess_bytes_per_step\": "), std::string::npos) << lines1[0];
}

TEST_F(MultiTrainer, ThreeTrainersWithUnevenShares) {
  // 2 x kSteps files over 3 trainers: 7, 7 and 6 files.
  const std::string out = run_job("three_by_one", 3, "0", "train2");
  ASSERT_NE(out.find("epoch: 2, test auc: "), std::string::npos) << out;
  EXPECT_EQ(last_value(out, "test examples: "), 2.0 * kSteps * kLinesPerFile);
  // Every trainer's metrics lines carry the job's examples.
  for (int t = 1; t < 3; ++t) {
    const auto lines = lines_of(root_ / ("three_by_one.trainer" + std::to_string(t) + ".jsonl"));
    ASSERT_EQ(lines.size(), 6u) << "trainer " << t;
    EXPECT_NE(lines[0].find("\"examples\": 2000"), std::string::npos) << lines[0];
  }
}

TEST_F(MultiTrainer, TrainerWithoutAFileStillJoinsEveryStep) {
  // 2 files over 3 trainers: trainer 2 has none.
  const std::string out = run_job("one_empty", 3, "0", "train_one_file_each");
  EXPECT_EQ(last_value(out, "test examples: "), 2.0 * kSteps * kLinesPerFile);
  EXPECT_NE(out.find("pass: 2,"), std::string::npos) << out;
}

// QueueDataset passes in a job: each trainer sizes its steps from its own stream (PassStepSizer)
// and the job agrees on them; with uneven shares and a trainer without a file, every trainer
// trains every pass and no step of any trainer allocates or regrows pinned memory.
TEST_F(MultiTrainer, StreamedPassesOfUnevenSharesAllocateInNoStep) {
  const std::vector<std::string> outs = run_job_outputs("streamed", 3, "0", "train_one_file_each",
                                                        {"-o", "runner.reader_type=QueueDataset"});
  EXPECT_EQ(last_value(outs[0], "test examples: "), 2.0 * kSteps * kLinesPerFile) << outs[0];
  for (int t = 0; t < 3; ++t) {
    const auto lines = lines_of(
        root_ / (t == 0 ? "streamed.jsonl" : "streamed.trainer" + std::to_string(t) + ".jsonl"));
    int passes = 0;
    for (const std::string& line : lines) {
      if (line.find("\"pass\": ") == std::string::npos) continue;
      ++passes;
      for (const char* key : {"pass_step_allocations", "pass_step_pinned_allocations"}) {
        const std::string field = std::string("\"") + key + "\": ";
        const auto at = line.find(field);
        ASSERT_NE(at, std::string::npos) << "trainer " << t << ": " << line;
        EXPECT_EQ(std::stod(line.substr(at + field.size())), 0.0) << "trainer " << t << ": " << key;
      }
    }
    EXPECT_EQ(passes, 3) << "trainer " << t;
  }
}

TEST_F(MultiTrainer, KilledTrainerEndsTheOtherWithAnErrorNamingIt) {
  auto trainer0 = start_trainer("killed", 0, 2, "0", "train2", {"-o", "runner.epochs=200"});
  auto trainer1 = start_trainer("killed", 1, 2, "0", "train2", {"-o", "runner.epochs=200"});
  ASSERT_TRUE(trainer0->wait_for("pass: 2,", kRunSeconds)) << trainer0->output();
  const pid_t pid1 = trainer1->pid();
  trainer1->signal(SIGKILL);
  EXPECT_EQ(trainer1->wait(10), 128 + SIGKILL);
  // Within the collective timeout (10 s) and then some for the process to wind down.
  const int rc = trainer0->wait(30);
  EXPECT_NE(rc, -1) << "trainer 0 still runs after its peer died:\n" << trainer0->output();
  EXPECT_NE(rc, 0) << trainer0->output();
  EXPECT_NE(trainer0->output().find("trainer 1 (pid " + std::to_string(pid1)), std::string::npos)
      << trainer0->output();
}

// A server that stops answering mid-pass (SIGSTOP: its port still accepts, nothing replies; as a
// partition from it) ends every trainer within seconds, naming it: the trainers' pings find it
// silent for runner.peer_timeout_s. Before, nothing noticed until the pass's end, whose push
// then retried for runner.server_timeout_s (30 s).
TEST_F(MultiTrainer, SilentServerEndsEveryTrainerWithinSecondsNamingIt) {
  std::string endpoint;
  auto server = start_server(&endpoint);
  // 3 s: a server busy with both trainers' pushes on a loaded machine still answers a ping
  // within it (with 1 s a trainer once could find it "silent" before the stop).
  const std::vector<std::string> args = {"-o", "runner.epochs=200", "-o",
                                         "runner.peer_timeout_s=3"};
  auto trainer0 = start_trainer("silent_server", 0, 2, "0", "train2", args, endpoint);
  auto trainer1 = start_trainer("silent_server", 1, 2, "0", "train2", args, endpoint);
  ASSERT_TRUE(trainer0->wait_for("pass: 2,", kRunSeconds)) << trainer0->output();
  server->signal(SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  for (auto* trainer : {trainer0.get(), trainer1.get()}) {
    // 3 s of silence, at most 5 s more for a trainer blocked in a call to the server.
    const int rc = trainer->wait(25);
    EXPECT_NE(rc, -1) << "a trainer still runs 25 s after its server stopped:\n"
                      << trainer->output();
    EXPECT_NE(rc, 0) << trainer->output();
    EXPECT_NE(trainer->output().find("lost server " + endpoint + " (shard 0 of 1): no answer"),
              std::string::npos)
        << trainer->output();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - stopped, std::chrono::seconds(20));
  server->signal(SIGCONT);
}

// Collective mode (issue 16) with several trainers, no server (each trainer's in-process host
// tier holds the whole table): 1 trainer x 2 cards and 2 trainers x 1 card read the same batch
// on each global card at every step (train_2x1 is train2 reordered for the split by trainer),
// and every card merges the job's sparse gradients in rank order in both, so only the dense
// all-reduce could differ (Gloo's ring against rank order); with two cards it adds two terms,
// and a + b == b + a in floats, so the saves are equal exactly (largest difference 0).
TEST_F(MultiTrainer, CollectiveOneByTwoEqualsTwoByOne) {
  // 1 x 2: card c reads sorted file 2b + c at step b; 2 x 1: trainer t reads the files
  // [kSteps t, kSteps (t + 1)), file kSteps t + b at step b: a copy of 2b + t.
  fs::create_directories(root_ / "train_2x1");
  for (int t = 0; t < 2; ++t) {
    for (int b = 0; b < kSteps; ++b) {
      char from[32], to[32];
      std::snprintf(from, sizeof(from), "part-%05d", 2 * b + t);
      std::snprintf(to, sizeof(to), "part-%05d", kSteps * t + b);
      fs::copy_file(root_ / "train2" / from, root_ / "train_2x1" / to,
                    fs::copy_options::overwrite_existing);
    }
  }
  auto args = [&](const std::string& save) {
    return std::vector<std::string>{"-o", "runner.use_fleet=true",
                                    "-o", "runner.epochs=2",
                                    "-o", "runner.save_mode=checkpoint",
                                    "-o", "runner.model_save_path=" + (root_ / save).string()};
  };
  const std::string one =
      run_job_outputs("collective_one", 1, "0,1", "train2", args("collective_1x2")).front();
  const auto two = run_job_outputs("collective_two", 2, "0", "train_2x1", args("collective_2x1"));
  ASSERT_EQ(two.size(), 2u);
  for (const std::string* out : {&one, &two[0], &two[1]}) {
    EXPECT_NE(out->find("Collective mode"), std::string::npos) << *out;
  }
  const double auc_one = last_value(one, "epoch: 1, test auc: ");
  const double auc_two = last_value(two[0], "epoch: 1, test auc: ");
  ASSERT_FALSE(std::isnan(auc_one)) << one;
  EXPECT_GT(auc_one, 0.52) << one;
  EXPECT_NEAR(auc_two, auc_one, 0.001) << "1 x 2:\n" << one << "\n2 x 1:\n" << two[0];
  for (int pass : {0, 1}) {
    const fs::path two_dir = root_ / "collective_2x1" / std::to_string(pass);
    ASSERT_TRUE(fs::exists(two_dir / "MODEL_MANIFEST")) << two[0] << "\n" << two[1];
    const SavedModel saved_one = read_save(root_ / "collective_1x2" / std::to_string(pass));
    const SavedModel saved_two = read_save(two_dir);
    EXPECT_GT(saved_one.rows.size(), 100u);
    const double worst = max_difference(saved_one, saved_two);
    std::printf("Collective pass %d: %zu rows; largest difference 2 x 1 vs 1 x 2: %.3g\n", pass,
                saved_one.rows.size(), worst);
    EXPECT_EQ(worst, 0.0) << "pass " << pass;
  }
  // The 2 x 1 save loaded by 2 trainers (each its own host tier) trains on.
  const auto resumed = run_job_outputs("collective_resumed", 2, "0", "train_2x1",
                                       {"-o", "runner.use_fleet=true", "-o", "runner.epochs=1",
                                        "--load", (root_ / "collective_2x1" / "1").string()});
  EXPECT_NE(resumed[0].find("pass: 0,"), std::string::npos) << resumed[0];
}

TEST_F(MultiTrainer, KilledCollectiveTrainerEndsTheOtherWithAnErrorNamingIt) {
  const std::vector<std::string> args = {"-o", "runner.use_fleet=true", "-o", "runner.epochs=200"};
  auto trainer0 = start_trainer("collective_killed", 0, 2, "0", "train2", args);
  auto trainer1 = start_trainer("collective_killed", 1, 2, "0", "train2", args);
  ASSERT_TRUE(trainer0->wait_for("pass: 2,", kRunSeconds)) << trainer0->output();
  const pid_t pid1 = trainer1->pid();
  trainer1->signal(SIGKILL);
  EXPECT_EQ(trainer1->wait(10), 128 + SIGKILL);
  const int rc = trainer0->wait(30);  // the collective timeout (10 s) and some
  EXPECT_NE(rc, -1) << "trainer 0 still runs after its peer died:\n" << trainer0->output();
  EXPECT_NE(rc, 0) << trainer0->output();
  EXPECT_NE(trainer0->output().find("trainer 1 (pid " + std::to_string(pid1)), std::string::npos)
      << "exit status " << rc << "\n"
      << trainer0->output();
}

TEST(TrainerFileShare, ContiguousBlocksCoverTheListOnce) {
  for (int trainers : {1, 2, 3, 5}) {
    for (int n : {0, 1, trainers - 1, trainers, trainers + 1, 3 * trainers + 2}) {
      if (n < 0) continue;
      std::vector<std::string> files;
      for (int i = 0; i < n; ++i) files.push_back("part-" + std::to_string(i));
      std::vector<std::string> joined;
      for (int t = 0; t < trainers; ++t) {
        const auto share = trainer::trainer_file_share(files, t, trainers);
        // Paddle's get_file_shard: the first n % T trainers hold one file more.
        const std::size_t want =
            static_cast<std::size_t>(n / trainers + (t < n % trainers ? 1 : 0));
        EXPECT_EQ(share.size(), want) << "trainer " << t << " of " << trainers << ", " << n;
        joined.insert(joined.end(), share.begin(), share.end());
      }
      EXPECT_EQ(joined, files) << trainers << " trainers, " << n << " files";
    }
  }
  EXPECT_THROW(trainer::trainer_file_share({"a"}, 2, 2), Error);
  EXPECT_THROW(trainer::trainer_file_share({"a"}, 0, 0), Error);
}

TEST(TrainerMetricsPath, TrainerZeroKeepsTheConfiguredPath) {
  EXPECT_EQ(trainer::trainer_metrics_path("log/metrics.jsonl", 0), "log/metrics.jsonl");
  EXPECT_EQ(trainer::trainer_metrics_path("log/metrics.jsonl", 2), "log/metrics.trainer2.jsonl");
  EXPECT_EQ(trainer::trainer_metrics_path("metrics", 1), "metrics.trainer1");
  EXPECT_EQ(trainer::trainer_metrics_path("", 1), "");
}

}  // namespace
}  // namespace gpubox
