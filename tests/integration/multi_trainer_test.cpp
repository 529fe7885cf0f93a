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
//  - saves with one gpubox_server: 2 x 2 saves what 1 x 4 saves (sparse rows and dense half
//    within a stated tolerance: the dense all-reduce's order of summation differs), a save (and
//    a delta chain) loaded into 2 trainers evaluates to the 1-trainer load's test AUC, trainers
//    loading different saves refuse, a SAVE refused on trainer 0 ends every trainer, a job run
//    again (also after a kill) resumes from its last complete save on every trainer, and several
//    trainers with the in-process host tier refuse saves naming --servers;
//  - Collective mode: 1 trainer x 2 cards = 2 trainers x 1 card (saves with no server), and a
//    killed trainer ends the other.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "dataset/generator.hpp"
#include "table/dense_table.hpp"
#include "table/server/host_tier_factory.hpp"
#include "table/sparse_table.hpp"
#include "tests/integration/child_process.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"

#if !defined(GPUBOX_TRAIN_BIN) || !defined(GPUBOX_SERVER_BIN)
#error "GPUBOX_TRAIN_BIN and GPUBOX_SERVER_BIN must name the binaries"
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

  // Trainer `id` of `trainers` on `cards`, training `train_dir` against `servers` ("": the
  // in-process host tier); its metrics file is <name>.jsonl (trainer 0) or
  // <name>.trainer<id>.jsonl.
  static std::unique_ptr<ChildProcess> start_trainer(const std::string& name, int id, int trainers,
                                                     const std::string& cards,
                                                     const std::string& train_dir,
                                                     std::vector<std::string> args = {},
                                                     const std::string& servers = "") {
    args.insert(args.begin(), {"--config", (root_ / "config.yaml").string(), "--threads_per_card",
                               "1", "-o", "runner.train_data_dir=" + train_dir, "-o",
                               "runner.metrics_path=" + (root_ / (name + ".jsonl")).string()});
    const std::vector<std::string> env = {
        "FLAGS_selected_gpus=" + cards,
        "PADDLE_TRAINER_ID=" + std::to_string(id),
        "PADDLE_TRAINERS_NUM=" + std::to_string(trainers),
        "GPUBOX_RENDEZVOUS=file://" + (root_ / ("rendezvous_" + name)).string(),
        "PADDLE_PSERVERS_IP_PORT_LIST=" + servers,
        "GPUBOX_AUTH_TOKEN_FILE="};
    return std::make_unique<ChildProcess>(GPUBOX_TRAIN_BIN, args, env, root_.string());
  }

  // A job of `trainers` processes; returns every trainer's output (trainer 0's first) after
  // every one exited with 0.
  static std::vector<std::string> run_job_outputs(const std::string& name, int trainers,
                                                  const std::string& cards,
                                                  const std::string& train_dir,
                                                  const std::vector<std::string>& args = {},
                                                  const std::string& servers = "") {
    std::vector<std::unique_ptr<ChildProcess>> procs;
    for (int t = 0; t < trainers; ++t)
      procs.push_back(start_trainer(name, t, trainers, cards, train_dir, args, servers));
    std::vector<std::string> outputs;
    for (int t = 0; t < trainers; ++t) {
      const int rc = procs[t]->wait(kRunSeconds);
      EXPECT_EQ(rc, 0) << name << " trainer " << t << ":\n" << procs[t]->output();
      outputs.push_back(procs[t]->output());
    }
    return outputs;
  }
  static std::string run_job(const std::string& name, int trainers, const std::string& cards,
                             const std::string& train_dir) {
    return run_job_outputs(name, trainers, cards, train_dir).front();
  }

  // A fresh gpubox_server on any port, holding saves under `data_dir` (default: the test
  // folder); its endpoint is `*endpoint`.
  static std::unique_ptr<ChildProcess> start_server(std::string* endpoint,
                                                    const fs::path& data_dir = {}) {
    auto server = std::make_unique<ChildProcess>(
        GPUBOX_SERVER_BIN,
        std::vector<std::string>{"--port", "0", "--config", (root_ / "config.yaml").string(),
                                 "--data_dir", (data_dir.empty() ? root_ : data_dir).string()});
    EXPECT_TRUE(server->wait_for(" (shard ", 10)) << server->output();
    const std::string& out = server->output();
    const auto at = out.find("listening on ");
    *endpoint =
        at == std::string::npos ? "" : out.substr(at + 13, out.find(' ', at + 13) - at - 13);
    return server;
  }

  // gpubox_train `args` run by 1 trainer x 4 cards and by 2 trainers x 2 cards, each job
  // against a fresh server; returns trainer 0's output of each.
  static std::pair<std::string, std::string> one_by_four_and_two_by_two(
      const std::string& name, const std::vector<std::string>& args) {
    std::string endpoint;
    std::pair<std::string, std::string> out;
    {
      auto server = start_server(&endpoint);
      out.first = run_job_outputs(name + "_one", 1, "0,1,2,3", "train_1x4", args, endpoint).front();
    }
    {
      auto server = start_server(&endpoint);
      out.second = run_job_outputs(name + "_two", 2, "0,1", "train_2x2", args, endpoint).front();
    }
    return out;
  }

  // What a save holds: every sparse row (read into an in-process table) and the dense block's
  // parameters and optimizer state.
  struct SavedModel {
    std::map<uint64_t, std::vector<float>> rows;
    std::vector<float> dense;  // values, moment1, moment2, steps
  };
  static SavedModel read_save(const fs::path& dir) {
    auto config = trainer::load_trainer_config((root_ / "config.yaml").string());
    throw_if_error(config.status());
    auto host = table::make_host_tier(config->sparse, config->host_tier);
    throw_if_error(host.status());
    throw_if_error((*host)->load((dir / "sparse").string()));
    SavedModel saved;
    const int stride = (*host)->layout().stride();
    auto* table = dynamic_cast<table::SparseTable*>(host->get());
    EXPECT_NE(table, nullptr);
    throw_if_error(table->for_each_row([&](uint64_t key, const float* row) {
      saved.rows[key] = std::vector<float>(row, row + stride);
    }));
    table::DenseTable dense;
    throw_if_error(dense.load((dir / "dense").string()));
    const auto block = dense.get("dense");
    EXPECT_TRUE(block.has_value());
    saved.dense = block->values;
    for (const char* name : {"moment1", "moment2", "steps"}) {
      const auto& state = block->state.at(name);
      saved.dense.insert(saved.dense.end(), state.begin(), state.end());
    }
    return saved;
  }

  // Two saves hold the same keys; returns the largest difference between their values
  // (absolute, relative above magnitude 1), sparse rows and dense half alike.
  static double max_difference(const SavedModel& a, const SavedModel& b) {
    double worst = 0;
    auto diff = [&](float x, float y) {
      const double d =
          std::fabs(static_cast<double>(x) - y) / std::max(1.0, std::fabs(static_cast<double>(x)));
      worst = std::max(worst, d);
    };
    EXPECT_EQ(a.rows.size(), b.rows.size());
    for (const auto& [key, row] : a.rows) {
      const auto other = b.rows.find(key);
      if (other == b.rows.end()) {
        ADD_FAILURE() << "key " << key << " saved by one layout only";
        return worst;
      }
      EXPECT_EQ(row.size(), other->second.size());
      for (std::size_t i = 0; i < row.size() && i < other->second.size(); ++i)
        diff(row[i], other->second[i]);
    }
    EXPECT_EQ(a.dense.size(), b.dense.size());
    for (std::size_t i = 0; i < a.dense.size() && i < b.dense.size(); ++i)
      diff(a.dense[i], b.dense[i]);
    return worst;
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
  const std::vector<std::string> args = {"-o", "runner.epochs=200", "-o",
                                         "runner.peer_timeout_s=1"};
  auto trainer0 = start_trainer("silent_server", 0, 2, "0", "train2", args, endpoint);
  auto trainer1 = start_trainer("silent_server", 1, 2, "0", "train2", args, endpoint);
  ASSERT_TRUE(trainer0->wait_for("pass: 2,", kRunSeconds)) << trainer0->output();
  server->signal(SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  for (auto* trainer : {trainer0.get(), trainer1.get()}) {
    // 1 s of silence, at most 5 s more for a trainer blocked in a call to the server.
    const int rc = trainer->wait(15);
    EXPECT_NE(rc, -1) << "a trainer still runs 15 s after its server stopped:\n"
                      << trainer->output();
    EXPECT_NE(rc, 0) << trainer->output();
    EXPECT_NE(trainer->output().find("lost server " + endpoint + " (shard 0 of 1): no answer"),
              std::string::npos)
        << trainer->output();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - stopped, std::chrono::seconds(10));
  server->signal(SIGCONT);
}

// The tolerance between the 2 x 2 and 1 x 4 saves: they differ only by the order in which the
// dense gradients are summed (Gloo's ring against rank order), roundings of 1e-7 relative
// that 2 passes carry into the weights (3.3e-7 measured after pass 1).
constexpr double kSaveTolerance = 1e-5;

TEST_F(MultiTrainer, TwoByTwoSavesWhatOneByFourSavesAndLoadsIt) {
  const std::vector<std::string> two_passes = {"-o", "runner.epochs=2", "-o",
                                               "runner.save_mode=checkpoint"};
  auto with_save = [&](const std::string& save) {
    std::vector<std::string> args = two_passes;
    args.insert(args.end(), {"-o", "runner.model_save_path=" + (root_ / save).string()});
    return args;
  };
  std::string endpoint;
  {
    auto server = start_server(&endpoint);
    run_job_outputs("save_one", 1, "0,1,2,3", "train_1x4", with_save("saves_1x4"), endpoint);
  }
  std::vector<std::string> two;
  {
    auto server = start_server(&endpoint);
    two = run_job_outputs("save_two", 2, "0,1", "train_2x2", with_save("saves_2x2"), endpoint);
  }
  ASSERT_EQ(two.size(), 2u);
  for (int pass : {0, 1}) {
    const fs::path one_dir = root_ / "saves_1x4" / std::to_string(pass);
    const fs::path two_dir = root_ / "saves_2x2" / std::to_string(pass);
    ASSERT_TRUE(fs::exists(two_dir / "MODEL_MANIFEST")) << two[0] << "\n" << two[1];
    const SavedModel saved_one = read_save(one_dir);
    const SavedModel saved_two = read_save(two_dir);
    EXPECT_GT(saved_one.rows.size(), 100u);
    const double worst = max_difference(saved_one, saved_two);
    std::printf("pass %d: %zu rows, %zu dense values; largest difference 2 x 2 vs 1 x 4: %.3g\n",
                pass, saved_one.rows.size(), saved_one.dense.size(), worst);
    EXPECT_LE(worst, kSaveTolerance) << "pass " << pass;
  }
  // The same save evaluated by 1 trainer x 4 cards and by 2 trainers x 2 cards: the same
  // predictions, so the same test AUC.
  const fs::path save = root_ / "saves_2x2" / "1";
  const auto [one_out, two_out] =
      one_by_four_and_two_by_two("infer", {"--mode", "infer", "--load", save.string()});
  const double auc_one = last_value(one_out, ", auc: ");
  const double auc_two = last_value(two_out, ", auc: ");
  ASSERT_FALSE(std::isnan(auc_one)) << one_out;
  ASSERT_FALSE(std::isnan(auc_two)) << two_out;
  EXPECT_GT(auc_one, 0.52) << one_out;
  std::printf("the pass 1 save evaluated: test auc 1 x 4 %.6f, 2 x 2 %.6f\n", auc_one, auc_two);
  EXPECT_NEAR(auc_two, auc_one, 1e-6) << "1 x 4:\n" << one_out << "\n2 x 2:\n" << two_out;
  EXPECT_EQ(last_value(two_out, "examples: "), 2.0 * kSteps * kLinesPerFile);
  // Training on from the save (runner.model_init_path): 2 x 2 as 1 x 4, within the dense
  // all-reduce's rounding.
  const auto [init_one, init_two] = one_by_four_and_two_by_two(
      "init", {"-o", "runner.epochs=1", "-o", "runner.model_init_path=" + save.string()});
  const double init_auc_one = last_value(init_one, "epoch: 0, test auc: ");
  ASSERT_FALSE(std::isnan(init_auc_one)) << init_one;
  std::printf("a pass from the save: test auc 1 x 4 %.6f, 2 x 2 %.6f\n", init_auc_one,
              last_value(init_two, "epoch: 0, test auc: "));
  EXPECT_NE(init_two.find("starting from runner.model_init_path"), std::string::npos) << init_two;
  EXPECT_NEAR(last_value(init_two, "epoch: 0, test auc: "), init_auc_one, 0.001) << init_one << "\n"
                                                                                 << init_two;
  // Trainers that would load different saves refuse, each naming the mismatch.
  {
    auto server = start_server(&endpoint);
    auto trainer0 = start_trainer(
        "infer_mixed", 0, 2, "0,1", "train_2x2",
        {"--mode", "infer", "--load", (root_ / "saves_2x2" / "0").string()}, endpoint);
    auto trainer1 = start_trainer("infer_mixed", 1, 2, "0,1", "train_2x2",
                                  {"--mode", "infer", "--load", save.string()}, endpoint);
    for (auto* trainer : {trainer0.get(), trainer1.get()}) {
      EXPECT_NE(trainer->wait(kRunSeconds), 0) << trainer->output();
      EXPECT_NE(trainer->output().find("every trainer must see the same save"), std::string::npos)
          << trainer->output();
    }
  }
}

TEST_F(MultiTrainer, SaveThatFailsOnTrainerZeroEndsEveryTrainerNamingIt) {
  // The server's --data_dir does not hold model_save_path: it refuses trainer 0's SAVE.
  fs::create_directories(root_ / "server_data");
  std::string endpoint;
  auto server = start_server(&endpoint, root_ / "server_data");
  const std::vector<std::string> args = {
      "-o", "runner.epochs=1", "-o",
      "runner.model_save_path=" + (root_ / "saves_outside").string()};
  auto trainer0 = start_trainer("save_refused", 0, 2, "0,1", "train_2x2", args, endpoint);
  auto trainer1 = start_trainer("save_refused", 1, 2, "0,1", "train_2x2", args, endpoint);
  EXPECT_NE(trainer0->wait(kRunSeconds), 0) << trainer0->output();
  EXPECT_NE(trainer1->wait(kRunSeconds), 0) << trainer1->output();
  EXPECT_NE(trainer0->output().find("saving the sparse table under"), std::string::npos)
      << trainer0->output();
  EXPECT_NE(trainer1->output().find("trainer 0 failed to write the save"), std::string::npos)
      << trainer1->output();
  EXPECT_FALSE(fs::exists(root_ / "saves_outside" / "0" / "MODEL_MANIFEST"));
}

TEST_F(MultiTrainer, RerunJobResumesFromItsLastDeltaChainOnEveryTrainer) {
  std::string endpoint;
  auto server = start_server(&endpoint);
  // save_mode delta: pass 0's save is a base (nothing to apply onto), pass 1's a delta on it.
  const std::vector<std::string> args = {
      "-o", "runner.save_mode=delta", "-o",
      "runner.model_save_path=" + (root_ / "saves_resume").string()};
  std::vector<std::string> first = args;
  first.insert(first.end(), {"-o", "runner.epochs=1"});
  run_job_outputs("resume_first", 2, "0,1", "train_2x2", first, endpoint);
  // Run again with one epoch more: every trainer loads pass 0's save and trains pass 1 only.
  std::vector<std::string> again = args;
  again.insert(again.end(), {"-o", "runner.epochs=2"});
  const auto outputs = run_job_outputs("resume_again", 2, "0,1", "train_2x2", again, endpoint);
  ASSERT_EQ(outputs.size(), 2u);
  for (const std::string& out : outputs)
    EXPECT_NE(out.find("runner.resume: resuming from pass 0"), std::string::npos) << out;
  EXPECT_EQ(outputs[0].find("pass: 0,"), std::string::npos) << outputs[0];
  EXPECT_NE(outputs[0].find("pass: 1,"), std::string::npos) << outputs[0];
  ASSERT_TRUE(fs::exists(root_ / "saves_resume" / "1" / "MODEL_MANIFEST")) << outputs[0];
  // Trainers that would start differently (one resumes, one starts afresh) refuse, naming it.
  // One epoch more again: the job's last save does not end it, so trainer 0 would resume it.
  {
    std::vector<std::string> more = args;
    more.insert(more.end(), {"-o", "runner.epochs=3"});
    std::vector<std::string> off = more;
    off.insert(off.end(), {"-o", "runner.resume=off"});
    auto trainer0 = start_trainer("resume_mixed", 0, 2, "0,1", "train_2x2", more, endpoint);
    auto trainer1 = start_trainer("resume_mixed", 1, 2, "0,1", "train_2x2", off, endpoint);
    for (auto* trainer : {trainer0.get(), trainer1.get()}) {
      EXPECT_NE(trainer->wait(kRunSeconds), 0) << trainer->output();
      EXPECT_NE(trainer->output().find("trainer 1 starts from scratch, trainer 0 by resuming"),
                std::string::npos)
          << trainer->output();
    }
  }
  // The delta chain loaded into 2 trainers evaluates as loaded into 1.
  const auto [one_out, two_out] = one_by_four_and_two_by_two(
      "delta", {"--mode", "infer", "--load", (root_ / "saves_resume" / "1").string()});
  const double auc_one = last_value(one_out, ", auc: ");
  ASSERT_FALSE(std::isnan(auc_one)) << one_out;
  EXPECT_NEAR(last_value(two_out, ", auc: "), auc_one, 1e-6) << one_out << "\n" << two_out;
}

TEST_F(MultiTrainer, KilledJobRerunResumesFromTheLastCompleteSave) {
  std::string endpoint;
  auto server = start_server(&endpoint);
  const fs::path saves = root_ / "saves_killed";
  auto args = [&](int epochs) {
    return std::vector<std::string>{"-o", "runner.save_mode=checkpoint",
                                    "-o", "runner.model_save_path=" + saves.string(),
                                    "-o", "runner.epochs=" + std::to_string(epochs)};
  };
  auto trainer0 = start_trainer("killed_save", 0, 2, "0,1", "train_2x2", args(200), endpoint);
  auto trainer1 = start_trainer("killed_save", 1, 2, "0,1", "train_2x2", args(200), endpoint);
  ASSERT_TRUE(trainer0->wait_for("pass: 2,", kRunSeconds)) << trainer0->output();
  trainer1->signal(SIGKILL);
  EXPECT_EQ(trainer1->wait(10), 128 + SIGKILL);
  EXPECT_NE(trainer0->wait(30), 0) << trainer0->output();
  // The newest save with a model manifest (one being written when the job died has none).
  int last = -1;
  for (const auto& entry : fs::directory_iterator(saves)) {
    if (fs::exists(entry.path() / "MODEL_MANIFEST"))
      last = std::max(last, std::stoi(entry.path().filename().string()));
  }
  ASSERT_GE(last, 1);
  const auto outputs =
      run_job_outputs("killed_rerun", 2, "0,1", "train_2x2", args(last + 2), endpoint);
  ASSERT_EQ(outputs.size(), 2u);
  for (const std::string& out : outputs) {
    EXPECT_NE(out.find("runner.resume: resuming from pass " + std::to_string(last)),
              std::string::npos)
        << out;
  }
  EXPECT_NE(outputs[0].find("pass: " + std::to_string(last + 1) + ","), std::string::npos)
      << outputs[0];
  EXPECT_TRUE(fs::exists(saves / std::to_string(last + 1) / "MODEL_MANIFEST")) << outputs[0];
}

TEST_F(MultiTrainer, InProcessHostTierRefusesSavesNamingServers) {
  // Refused before the job meets: trainer 0 alone ends with the error.
  auto trainer = start_trainer("local_save", 0, 2, "0", "train2",
                               {"-o", "runner.model_save_path=" + (root_ / "local").string()});
  EXPECT_NE(trainer->wait(kRunSeconds), 0) << trainer->output();
  EXPECT_NE(trainer->output().find("--servers"), std::string::npos) << trainer->output();
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
