// A new user's mistakes, through the real binaries (small generated data, the in-process host
// tier): each is refused before any pass trains, with an error that names the key, the file or
// the process at fault, and nothing already saved is touched.
//  - two training runs saving into one runner.model_save_path: the second is refused naming
//    the first (SaveFolderLock); after it, the folder is free again and holds only saves;
//  - a runner.model_save_path that cannot be a folder (a file is in the way) is refused before
//    pass 0 trains, naming the key (it failed after pass 0 with a bare filesystem error);
//  - a host tier that cannot open names its disk tier's key, or its servers once;
//  - (saves read under another network, and --predictions_out: bad_input_saves_test.cpp);
//  - test data of one class says why its AUC is nan;
//  - slot names of the config that no line has (every key skipped as another slot's) are refused
//    at the first load naming the count and the slots skipped (it trained the dense part alone
//    and exited 0);
//  - a runner.metrics_path that cannot take a line (a full disk: /dev/full) stops the job naming
//    it, after pass 0's save (it was ignored: exit 0 with the lines lost);
//  - a runner.train_data_dir list naming a folder twice is refused naming it and the file it
//    would have read twice (every pass trained on that data twice); a runner.pass_dirs list
//    naming a day twice is warned of;
//  - a pass more of whose lines are malformed than runner.max_malformed_share allows stops
//    before it trains, naming the counts and the first of them (it trained on the rest, exit 0);
//  - a bad FLAGS_selected_gpus is named;
//  - a trainer of a job of two whose config is refused tells the other, which ends at once naming
//    it (it waited runner.collective_timeout_s for a trainer that had exited).
#include "tests/integration/bad_input_binaries.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "trainer/schedule/save_folder_lock.hpp"

namespace gpubox {
namespace {

namespace fs = std::filesystem;
using testing::BadInputBinaries;
using testing::Finished;
using testing::kLocalTier;
using testing::run_to_end;
using trainer::SaveFolderLock;

TEST_F(BadInputBinaries, ASaveFolderInUseByAnotherRunIsRefusedNamingIt) {
  const std::string save = (root_ / "saves_in_use").string();
  {
    // Another run holds the folder (this test process, as a second gpubox_train would).
    const SaveFolderLock held(save);
    const Finished refused = train({"-o", "runner.model_save_path=" + save});
    EXPECT_EQ(refused.status, 1) << refused.output;
    EXPECT_NE(refused.output.find("gpubox_train: runner.model_save_path '" + save +
                                  "' is being saved into by another training run (pid " +
                                  std::to_string(::getpid()) + " on host "),
              std::string::npos)
        << refused.output;
    EXPECT_FALSE(trained_a_pass(refused)) << refused.output;
    EXPECT_FALSE(fs::exists(fs::path(save) / "0"));
    // In one process too: each lock is its own open file.
    try {
      SaveFolderLock second(save);
      ADD_FAILURE() << "a second lock of one folder was granted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("another training run"), std::string::npos) << e.what();
    }
  }
  // Its holder made the folder and saved nothing: letting go, it leaves no trace.
  EXPECT_FALSE(fs::exists(save));
  // Free again: the run saves every pass, and the folder then holds its saves alone.
  const Finished ran = train({"-o", "runner.model_save_path=" + save});
  ASSERT_EQ(ran.status, 0) << ran.output;
  std::vector<std::string> entries;
  for (const auto& entry : fs::directory_iterator(save)) {
    entries.push_back(entry.path().filename().string());
  }
  std::sort(entries.begin(), entries.end());
  EXPECT_EQ(entries, (std::vector<std::string>{"0", "1"}));
  EXPECT_TRUE(fs::exists(fs::path(save) / "1" / "MODEL_MANIFEST"));
  const SaveFolderLock after(save);  // and the finished run holds nothing
  EXPECT_TRUE(after.held());
}

// A save path written with a trailing slash leaves no folder behind either: its parents were
// recorded one level off ("/x/a/b/" then "/x/a/b"), so removing the second failed and /x/a stayed.
TEST_F(BadInputBinaries, ASaveFolderLockLeavesNoFolderForATrailingSlash) {
  const fs::path top = root_ / "slash_top";
  { const SaveFolderLock held((top / "a" / "b").string() + "/"); }
  EXPECT_FALSE(fs::exists(top)) << "left " << top;
}

TEST_F(BadInputBinaries, ASavePathThatCannotBeAFolderIsRefusedBeforeTraining) {
  const fs::path file = root_ / "a_file";
  std::ofstream(file) << "not a folder\n";
  const Finished refused = train({"-o", "runner.model_save_path=" + (file / "m").string()});
  EXPECT_EQ(refused.status, 1) << refused.output;
  EXPECT_NE(refused.output.find("gpubox_train: runner.model_save_path '" + (file / "m").string() +
                                "': cannot make the folder the saves go to"),
            std::string::npos)
      << refused.output;
  EXPECT_FALSE(trained_a_pass(refused)) << refused.output;
}

TEST_F(BadInputBinaries, SlotNamesThatNoLineHasAreRefusedAtTheFirstLoad) {
  const Finished refused = train({"-o", "hyper_parameters.slot_names=[a, b, c]", "-o",
                                  "hyper_parameters.sparse_inputs_slots=4", "-o",
                                  "runner.model_save_path=" + (root_ / "no_keys").string()});
  EXPECT_EQ(refused.status, 1) << refused.output;
  for (const char* part :
       {"no key in any of the config's 3 sparse slots in 1 file(s) (600 instances)",
        "none of the config's 3 sparse slots holds a key in the 600 instances read: the slot "
        "names (hyper_parameters.slot_names",
        "; the lines hold slots the config does not have: 1, 2, 3, 4 (2400 tokens skipped)"}) {
    EXPECT_NE(refused.output.find(part), std::string::npos) << part << "\n" << refused.output;
  }
  EXPECT_FALSE(trained_a_pass(refused)) << refused.output;
  EXPECT_FALSE(fs::exists(root_ / "no_keys" / "0"));
}

TEST_F(BadInputBinaries, AFolderNamedTwiceInTheDataListIsRefusedNamingIt) {
  const Finished refused = train({"-o", "runner.train_data_dir=[train, test, ./train]", "-o",
                                  "runner.model_save_path=" + (root_ / "twice").string()});
  EXPECT_EQ(refused.status, 1) << refused.output;
  EXPECT_NE(refused.output.find("gpubox_train: the list of data folders names '" +
                                (root_ / "train").string() + "' twice"),
            std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find(": each pass would read its files twice"), std::string::npos);
  EXPECT_FALSE(trained_a_pass(refused)) << refused.output;
  // A day of runner.pass_dirs named twice trained twice an epoch, and the day it stood for
  // never, unsaid: warned (a day trained as two passes on purpose is allowed), through a link too.
  fs::create_directory_symlink(root_ / "train", root_ / "train_link");
  const Finished days = train({"-o", "runner.pass_dirs=[train, test, train_link]", "-o",
                               "runner.epochs=1", "-o", "runner.model_save_path="});
  EXPECT_EQ(days.status, 0) << days.output;
  EXPECT_NE(days.output.find("runner.pass_dirs names '" + (root_ / "train").string() +
                             "' twice (passes 0 and 2, again as '" +
                             (root_ / "train_link").string() + "'): its data trains twice"),
            std::string::npos)
      << days.output;
}

// A pass most of whose lines are malformed (a float label in exported data made 1,999 of 2,000
// lines malformed) trained on what was left and saved it, exit 0: over
// runner.max_malformed_share it stops before training, naming the counts and the first lines.
TEST_F(BadInputBinaries, APassOfMostlyMalformedLinesStopsBeforeTraining) {
  const fs::path data = edited_test_data("mostly_malformed", [](int n, const std::string& line) {
    return (n % 4 == 0 ? line : "click:1.0" + line.substr(line.find(' '))) + "\n";
  });
  const std::vector<std::string> args = {"-o", "runner.train_data_dir=" + data.string(),
                                         "-o", "runner.test_data_dir=",
                                         "-o", "runner.epochs=1"};
  std::vector<std::string> refused_args = args;
  refused_args.insert(refused_args.end(),
                      {"-o", "runner.model_save_path=" + (root_ / "malformed").string()});
  const Finished refused = train(refused_args);
  EXPECT_EQ(refused.status, 1) << refused.output;
  EXPECT_NE(refused.output.find("150 of its 200 lines (75.0%; "), std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find(" bytes) are malformed, over runner.max_malformed_share's 0.5"),
            std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find(":1: bad_label: 'click:1.0' (a label is 0 or 1)"),
            std::string::npos)
      << refused.output;
  EXPECT_FALSE(trained_a_pass(refused)) << refused.output;
  EXPECT_FALSE(fs::exists(root_ / "malformed" / "0"));
  // Raised: trains on the 50 lines that parse.
  std::vector<std::string> raised = args;
  raised.insert(raised.end(), {"-o", "runner.max_malformed_share=0.8", "-o",
                               "runner.model_save_path=" + (root_ / "malformed_raised").string()});
  const Finished trained = train(raised);
  EXPECT_EQ(trained.status, 0) << trained.output;
  EXPECT_TRUE(trained_a_pass(trained)) << trained.output;
  // Test data as malformed: refused too, in an evaluation's words (it said the model would learn
  // from what was left).
  const Finished test_refused =
      train({"-o", "runner.test_data_dir=" + data.string(), "-o", "runner.epochs=1"});
  EXPECT_EQ(test_refused.status, 1) << test_refused.output;
  EXPECT_NE(test_refused.output.find("the figures would be measured on the 50 instances left"),
            std::string::npos)
      << test_refused.output;
}

// Malformed by bytes: one over-long line (a binary file, or one whose lines end in CR alone, is
// one "line") beside 200 good lines was 1 malformed line of 201 and lost without a word.
TEST_F(BadInputBinaries, AFileThatIsOneHugeMalformedLineStopsTheLoad) {
  const fs::path data =
      edited_test_data("one_huge_line", [](int, const std::string& line) { return line + "\n"; });
  std::ofstream(data / "part-00001") << std::string(3 << 20, 'x') << "\n";
  const Finished refused = train({"-o", "runner.train_data_dir=" + data.string(), "-o",
                                  "runner.test_data_dir=", "-o", "runner.epochs=1"});
  EXPECT_EQ(refused.status, 1) << refused.output;
  EXPECT_NE(refused.output.find("1 of its 201 lines (0.5%; 9"), std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find("part-00001:1: line_too_long"), std::string::npos)
      << refused.output;
  EXPECT_FALSE(trained_a_pass(refused)) << refused.output;
}

TEST_F(BadInputBinaries, AMetricsFileThatCannotBeWrittenStopsTheJobAfterThePassSave) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const std::string save = (root_ / "metrics_full").string();
  const Finished stopped =
      train({"-o", "runner.metrics_path=/dev/full", "-o", "runner.model_save_path=" + save});
  EXPECT_EQ(stopped.status, 1) << stopped.output;
  EXPECT_NE(stopped.output.find("gpubox_train: cannot write runner.metrics_path '/dev/full' (No "
                                "space left on device): its line for this pass"),
            std::string::npos)
      << stopped.output;
  EXPECT_TRUE(trained_a_pass(stopped)) << stopped.output;
  EXPECT_TRUE(fs::exists(fs::path(save) / "0" / "MODEL_MANIFEST"));  // saved before its line
  EXPECT_FALSE(fs::exists(fs::path(save) / "1"));
}

// The host tier that cannot open says which: the in-process table's disk tier by its key (it
// said "cannot reach the host-tier servers" with no server), the servers once each.
TEST_F(BadInputBinaries, AHostTierThatCannotOpenIsNamed) {
  const fs::path file = root_ / "a_file_too";
  std::ofstream(file) << "not a folder\n";
  const std::string disk = (file / "rocksdb").string();
  const Finished local = train({"-o", "runner.rocksdb_path=" + disk});
  EXPECT_EQ(local.status, 1) << local.output;
  EXPECT_NE(local.output.find("gpubox_train: IOError: opening the host table's disk tier "
                              "(runner.rocksdb_path or gpubox_server --rocksdb_dir '" +
                              disk + "'): rocksdb open " + disk),
            std::string::npos)
      << local.output;
  EXPECT_EQ(local.output.find("servers"), std::string::npos) << local.output;

  std::vector<std::string> env = kLocalTier;
  env.push_back("GPUBOX_LOCAL_TIER=0");
  env.push_back("PADDLE_PSERVERS_IP_PORT_LIST=127.0.0.1:1");  // nobody listens on port 1
  const Finished remote =
      run_to_end(GPUBOX_TRAIN_BIN,
                 {"--config", (root_ / "config.yaml").string(), "-o", "runner.server_timeout_s=1"},
                 env, root_.string(), 60);
  EXPECT_EQ(remote.status, 1) << remote.output;
  const std::string named = "cannot reach the host-tier servers 127.0.0.1:1";
  const auto first = remote.output.find(named);
  EXPECT_NE(first, std::string::npos) << remote.output;
  EXPECT_EQ(remote.output.find(named, first + 1), std::string::npos) << remote.output;
}

// A run that saves nothing does not resume from the saves an earlier run left there: said (it
// started afresh unsaid), and not when runner.resume is off (that run says so itself).
TEST_F(BadInputBinaries, ARunSavingNothingSaysItDoesNotResume) {
  const std::string save = (root_ / "earlier_saves").string();
  ASSERT_EQ(train({"-o", "runner.model_save_path=" + save, "-o", "runner.epochs=1"}).status, 0);
  const Finished none = train({"-o", "runner.model_save_path=" + save, "-o", "runner.epochs=1",
                               "-o", "runner.save_mode=none"});
  EXPECT_EQ(none.status, 0) << none.output;
  EXPECT_NE(none.output.find("runner.resume: not resuming: runner.save_mode is none, and " + save +
                             " holds saves of an earlier run (the newest: pass 0)"),
            std::string::npos)
      << none.output;
  EXPECT_TRUE(trained_a_pass(none)) << none.output;
  const Finished off = train({"-o", "runner.model_save_path=" + save, "-o", "runner.epochs=1", "-o",
                              "runner.save_mode=none", "-o", "runner.resume=off"});
  EXPECT_EQ(off.status, 0) << off.output;
  EXPECT_EQ(off.output.find("not resuming"), std::string::npos) << off.output;
}

// runner.metrics_path naming one of the run's inputs appended JSON lines to it, exit 0: to the
// config (the next run failed on its YAML), to a data file or into a data folder (read back as
// data), into a save (its checksums broken). Refused before any pass, naming which; a file
// beside the saves is fine.
TEST_F(BadInputBinaries, MetricsPathIsNoneOfTheRunsInputs) {
  const std::string save = (root_ / "metrics_saves").string();
  ASSERT_EQ(train({"-o", "runner.model_save_path=" + save, "-o", "runner.epochs=1"}).status, 0);
  const std::string config = (root_ / "config.yaml").string();
  const std::string config_text = [&] {
    std::ifstream in(config);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  const std::vector<std::pair<std::string, std::string>> refused = {
      {config, "is the config"},
      {(root_ / "train" / "part-00000").string(), "is the data file"},
      {(root_ / "test" / "metrics.jsonl").string(), "is inside the data folder"},
      {save + "/0/dense/MANIFEST", "is inside a save under runner.model_save_path"},
  };
  for (const auto& [path, said] : refused) {
    const auto before = fs::exists(path) ? fs::file_size(path) : 0;
    const Finished run = train({"-o", "runner.model_save_path=" + save, "-o", "runner.epochs=2",
                                "-o", "runner.metrics_path=" + path});
    EXPECT_EQ(run.status, 1) << run.output;
    EXPECT_NE(run.output.find("runner.metrics_path '" + path + "' " + said), std::string::npos)
        << run.output;
    EXPECT_FALSE(trained_a_pass(run)) << run.output;
    EXPECT_EQ(fs::exists(path) ? fs::file_size(path) : 0, before) << path;
  }
  std::ifstream in(config);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), config_text);
  const Finished beside = train({"-o", "runner.model_save_path=" + save, "-o", "runner.epochs=2",
                                 "-o", "runner.metrics_path=" + save + "/metrics.jsonl"});
  EXPECT_EQ(beside.status, 0) << beside.output;
  EXPECT_TRUE(fs::exists(save + "/metrics.jsonl"));
}

// Test data that is training data too: its "test auc" is said not to be held out.
TEST_F(BadInputBinaries, TestDataThatIsTrainingDataIsSaid) {
  const Finished same = train({"-o", "runner.model_save_path=", "-o", "runner.epochs=1", "-o",
                               "runner.test_data_dir=./train"});
  EXPECT_EQ(same.status, 0) << same.output;
  EXPECT_NE(same.output.find("1 of the 1 files of runner.test_data_dir are training data too ("),
            std::string::npos)
      << same.output;
  const Finished apart = train({"-o", "runner.model_save_path=", "-o", "runner.epochs=1"});
  EXPECT_EQ(apart.status, 0) << apart.output;
  EXPECT_EQ(apart.output.find("are training data too"), std::string::npos) << apart.output;
}

// A card list that is not one names the variable it came from (it said "card list 'abc'"), and
// FLAGS_selected_gpus only when the list came from it.
TEST_F(BadInputBinaries, ABadCardListNamesItsVariable) {
  for (const std::string variable : {"FLAGS_selected_gpus", "GPUBOX_SELECTED_GPUS"}) {
    for (const std::string cards : {"abc", "0,0", "0,,1"}) {
      std::vector<std::string> env = kLocalTier;
      env.push_back("FLAGS_selected_gpus=");  // unset: GPUBOX_SELECTED_GPUS is read after it
      env.push_back(variable + "=" + cards);
      const Finished refused =
          run_to_end(GPUBOX_TRAIN_BIN, {"--config", (root_ / "config.yaml").string()}, env,
                     root_.string(), 60);
      EXPECT_EQ(refused.status, 1) << refused.output;
      EXPECT_NE(refused.output.find("gpubox_train: card list (" + variable + ") '" + cards + "'"),
                std::string::npos)
          << refused.output;
    }
  }
}

// Test data of one class: its AUC prints as nan, and a warning says why (the line alone left
// "test auc: nan" unexplained), after each epoch and in --mode infer.
TEST_F(BadInputBinaries, OneClassTestDataSaysWhyItsAucIsNan) {
  const fs::path negatives = root_ / "negatives";
  fs::create_directories(negatives);
  std::size_t lines = 0;
  {
    std::ifstream in(root_ / "test" / "part-00000");
    std::ofstream out(negatives / "part-00000");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("click:0 ", 0) == 0) {
        out << line << "\n";
        ++lines;
      }
    }
  }
  ASSERT_GT(lines, 10u);
  const std::string why = "its " + std::to_string(lines) +
                          " instances are all negative (label 0): AUC is undefined with one "
                          "class (nan); logloss is measured";
  const std::string save = (root_ / "one_class_saves").string();
  const Finished trained = train({"-o", "runner.model_save_path=" + save, "-o", "runner.epochs=1",
                                  "-o", "runner.test_data_dir=" + negatives.string()});
  ASSERT_EQ(trained.status, 0) << trained.output;
  EXPECT_NE(trained.output.find("epoch: 0, test auc: nan"), std::string::npos) << trained.output;
  EXPECT_NE(trained.output.find("runner.test_data_dir: " + why), std::string::npos)
      << trained.output;
  const Finished inferred =
      train({"--mode", "infer", "--load", save + "/0", "--infer_data_dir", negatives.string()});
  ASSERT_EQ(inferred.status, 0) << inferred.output;
  EXPECT_NE(inferred.output.find("the evaluated data: " + why), std::string::npos)
      << inferred.output;
  // Both classes: no such line (in a run that evaluated).
  const Finished both = train({"--mode", "infer", "--load", save + "/0"});
  ASSERT_EQ(both.status, 0) << both.output;
  EXPECT_NE(both.output.find("infer: save:"), std::string::npos) << both.output;
  EXPECT_EQ(both.output.find("all negative"), std::string::npos) << both.output;
  // Training data of one class: its pass line's nan said why as well.
  const Finished one_class_training =
      train({"-o", "runner.model_save_path=", "-o", "runner.epochs=1", "-o",
             "runner.train_data_dir=" + negatives.string()});
  EXPECT_NE(one_class_training.output.find("pass 0's training data: " + why), std::string::npos)
      << one_class_training.output;
}

// Two trainers started by hand: trainer 1's config names an unknown key, so it exits before the
// trainers meet; trainer 0, already waiting for it, ends at once with trainer 1's message, well
// within its runner.collective_timeout_s (60 s here).
TEST_F(BadInputBinaries, ATrainerWhoseConfigIsRefusedTellsTheOthersAtOnce) {
  const fs::path folder = root_ / "rendezvous_refused";
  fs::remove_all(folder);
  std::vector<std::string> env = kLocalTier;
  env.insert(env.end(), {"PADDLE_TRAINERS_NUM=2", "GPUBOX_RENDEZVOUS=file://" + folder.string()});
  std::vector<std::string> env0 = env, env1 = env;
  env0.push_back("PADDLE_TRAINER_ID=0");
  env1.push_back("PADDLE_TRAINER_ID=1");
  const auto started = std::chrono::steady_clock::now();
  testing::ChildProcess waiting(
      GPUBOX_TRAIN_BIN,
      {"--config", (root_ / "config.yaml").string(), "-o", "runner.collective_timeout_s=60"}, env0,
      root_.string());
  ASSERT_TRUE(waiting.wait_for("network:", 30)) << waiting.output();
  const Finished refused = run_to_end(
      GPUBOX_TRAIN_BIN, {"--config", (root_ / "config.yaml").string(), "-o", "runner.epoch=1"},
      env1, root_.string(), 60);
  EXPECT_EQ(refused.status, 2) << refused.output;
  EXPECT_EQ(waiting.wait(30), 1) << waiting.output();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(30));
  EXPECT_NE(waiting.output().find("gpubox_train: trainer 1 of the job failed: "), std::string::npos)
      << waiting.output();
  EXPECT_NE(waiting.output().find("unknown key 'runner.epoch' (did you mean 'runner.epochs'?)"),
            std::string::npos)
      << waiting.output();
  fs::remove_all(folder);
}

}  // namespace
}  // namespace gpubox
