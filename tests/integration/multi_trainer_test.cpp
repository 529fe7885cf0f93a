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
//    naming the dead trainer.
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "dataset/generator.hpp"
#include "tests/integration/child_process.hpp"
#include "trainer/engine/trainer.hpp"

#if !defined(GPUBOX_TRAIN_BIN)
#error "GPUBOX_TRAIN_BIN must name the binary"
#endif

namespace gpubox {
namespace {

namespace fs = std::filesystem;
using testing::ChildProcess;

constexpr double kRunSeconds = 120;  // one job, at most (each takes a few seconds)
constexpr int kLinesPerFile = 100;   // one batch
constexpr int kSteps = 10;           // batches per card per pass in the 2 x 2 / 1 x 4 jobs

class MultiTrainer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("gpubox_multi_trainer_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    for (const auto& [dir, first_line, files] :
         {std::tuple{"train_1x4", 0, 4 * kSteps}, std::tuple{"train2", 0, 2 * kSteps},
          std::tuple{"test", 20000, 2 * kSteps}}) {
      dataset::GeneratorOptions gen;
      gen.out_dir = (root_ / dir).string();
      gen.lines = kLinesPerFile * files;
      gen.first_line = first_line;
      gen.files = files;
      gen.seed = 3;
      gen.slots = 6;
      gen.dense = 3;
      gen.vocab = 2000;
      dataset::OracleSummary oracle;
      throw_if_error(dataset::generate(gen, &oracle));
    }
    // 1 x 4: card g reads sorted file 4b + g at step b. 2 x 2: trainer t reads the sorted files
    // [2 kSteps t, 2 kSteps (t + 1)) and its card c at step b the block's file 2b + c: that file
    // is a copy of 1 x 4's file 4b + 2t + c.
    fs::create_directories(root_ / "train_2x2");
    for (int t = 0; t < 2; ++t) {
      for (int b = 0; b < kSteps; ++b) {
        for (int c = 0; c < 2; ++c) {
          char from[32], to[32];
          std::snprintf(from, sizeof(from), "part-%05d", 4 * b + 2 * t + c);
          std::snprintf(to, sizeof(to), "part-%05d", 2 * kSteps * t + 2 * b + c);
          fs::copy_file(root_ / "train_1x4" / from, root_ / "train_2x2" / to);
        }
      }
    }
    // A batch is a file's lines; no shuffle.
    // Two files of kSteps batches each.
    fs::create_directories(root_ / "train_one_file_each");
    for (int f = 0; f < 2; ++f) {
      std::ofstream out(root_ / "train_one_file_each" / ("part-0000" + std::to_string(f)));
      for (int k = 0; k < kSteps; ++k) {
        char name[32];
        std::snprintf(name, sizeof(name), "part-%05d", f * kSteps + k);
        out << std::ifstream(root_ / "train2" / name).rdbuf();
      }
    }
    std::ofstream(root_ / "config.yaml") << "runner:\n"
                                            "  test_data_dir: test\n"
                                            "  train_batch_size: "
                                         << kLinesPerFile
                                         << "\n"
                                            "  infer_batch_size: 256\n"
                                            "  epochs: 3\n"
                                            "  thread_num: 1\n"
                                            "  shuffle: false\n"
                                            "  seed: 5\n"
                                            "  collective_timeout_s: 10\n"
                                            "hyper_parameters:\n"
                                            "  sparse_inputs_slots: 7\n"
                                            "  dense_input_dim: 3\n"
                                            "  sparse_feature_dim: 5\n"
                                            "  fc_sizes: [16, 8]\n"
                                            "  optimizer:\n"
                                            "    learning_rate: 0.05\n"
                                            "  sparse_optimizer:\n"
                                            "    learning_rate: 0.3\n"
                                            "    mf_learning_rate: 0.3\n";
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // Trainer `id` of `trainers` on `cards`, training `train_dir`; its metrics file is
  // <name>.jsonl (trainer 0) or <name>.trainer<id>.jsonl.
  static std::unique_ptr<ChildProcess> start_trainer(const std::string& name, int id, int trainers,
                                                     const std::string& cards,
                                                     const std::string& train_dir,
                                                     std::vector<std::string> args = {}) {
    args.insert(args.begin(), {"--config", (root_ / "config.yaml").string(), "--threads_per_card",
                               "1", "-o", "runner.train_data_dir=" + train_dir, "-o",
                               "runner.metrics_path=" + (root_ / (name + ".jsonl")).string()});
    const std::vector<std::string> env = {
        "FLAGS_selected_gpus=" + cards,
        "PADDLE_TRAINER_ID=" + std::to_string(id),
        "PADDLE_TRAINERS_NUM=" + std::to_string(trainers),
        "GPUBOX_RENDEZVOUS=file://" + (root_ / ("rendezvous_" + name)).string(),
        "PADDLE_PSERVERS_IP_PORT_LIST=",
        "GPUBOX_AUTH_TOKEN_FILE="};
    return std::make_unique<ChildProcess>(GPUBOX_TRAIN_BIN, args, env, root_.string());
  }

  // A job of `trainers` processes; returns trainer 0's output after every one exited with 0.
  static std::string run_job(const std::string& name, int trainers, const std::string& cards,
                             const std::string& train_dir) {
    std::vector<std::unique_ptr<ChildProcess>> procs;
    for (int t = 0; t < trainers; ++t)
      procs.push_back(start_trainer(name, t, trainers, cards, train_dir));
    for (int t = 0; t < trainers; ++t) {
      const int rc = procs[t]->wait(kRunSeconds);
      EXPECT_EQ(rc, 0) << name << " trainer " << t << ":\n" << procs[t]->output();
    }
    return procs[0]->output();
  }

  // The number after the last `label` in `out` (NaN when absent).
  static double last_value(const std::string& out, const std::string& label) {
    const auto at = out.rfind(label);
    if (at == std::string::npos) return std::nan("");
    return std::stod(out.substr(at + label.size()));
  }

  static std::vector<std::string> lines_of(const fs::path& path) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  static fs::path root_;
};
fs::path MultiTrainer::root_;

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
