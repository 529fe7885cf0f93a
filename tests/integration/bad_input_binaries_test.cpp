// A new user's mistakes, through the real binaries (small generated data, the in-process host
// tier): each is refused before any pass trains, with an error that names the key, the file or
// the process at fault, and nothing already saved is touched.
//  - two training runs saving into one runner.model_save_path: the second is refused naming
//    the first (SaveFolderLock); after it, the folder is free again and holds only saves;
//  - a runner.model_save_path that cannot be a folder (a file is in the way) is refused before
//    pass 0 trains, naming the key (it failed after pass 0 with a bare filesystem error);
//  - a host tier that cannot open names its disk tier's key, or its servers once;
//  - a save loaded (infer, export, --load) under another network or input names the keys that
//    differ, also where the parameter count is the same (slots reordered, the dense transform);
//  - --predictions_out is checked before the evaluation and replaced only when written whole,
//    through a symlink to its target, and written in place into a FIFO;
//  - test data of one class says why its AUC is nan;
//  - slot names of the config that no line has (every key skipped as another slot's) are refused
//    at the first load naming the count and the slots skipped (it trained the dense part alone
//    and exited 0);
//  - a runner.metrics_path that cannot take a line (a full disk: /dev/full) stops the job naming
//    it, after pass 0's save (it was ignored: exit 0 with the lines lost);
//  - a runner.train_data_dir list naming a folder twice is refused naming it and the file it
//    would have read twice (every pass trained on that data twice);
//  - a bad FLAGS_selected_gpus is named.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "tests/dataset/planted_data.hpp"
#include "tests/integration/child_process.hpp"
#include "trainer/schedule/save_folder_lock.hpp"

#if !defined(GPUBOX_TRAIN_BIN)
#error "GPUBOX_TRAIN_BIN must name the binary"
#endif

namespace gpubox {
namespace {

namespace fs = std::filesystem;
using testing::Finished;
using testing::run_to_end;
using trainer::SaveFolderLock;

const std::vector<std::string> kLocalTier = {
    "FLAGS_selected_gpus=0", "GPUBOX_LOCAL_TIER=1",
    "PADDLE_PSERVERS_IP_PORT_LIST=", "PADDLE_TRAINERS_NUM=", "PADDLE_TRAINER_ID="};

class BadInputBinaries : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("gpubox_bad_input_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    testing::write_small_train_test(root_, 600, 200, /*seed=*/7, /*slots=*/4, /*dense=*/2,
                                    /*vocab=*/500, /*files=*/1);
    std::ofstream(root_ / "config.yaml") << "runner:\n"
                                            "  train_data_dir: train\n"
                                            "  test_data_dir: test\n"
                                            "  metrics_path: \"\"\n"
                                            "  train_batch_size: 32\n"
                                            "  infer_batch_size: 32\n"
                                            "  epochs: 2\n"
                                            "  print_interval: 5\n"
                                            "hyper_parameters:\n"
                                            "  sparse_inputs_slots: 5\n"
                                            "  dense_input_dim: 2\n"
                                            "  sparse_feature_dim: 5\n"
                                            "  fc_sizes: [8]\n";
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // gpubox_train on the test config from the test folder (model paths are taken from there).
  static Finished train(std::vector<std::string> args) {
    args.insert(args.begin(), {"--config", (root_ / "config.yaml").string()});
    return run_to_end(GPUBOX_TRAIN_BIN, args, kLocalTier, root_.string(), 120);
  }
  // The test file copied to <folder>/part-00000, line n (from 1) written as edit(n, line) (its
  // newline included); the folder.
  template <class Edit>
  static fs::path edited_test_data(const std::string& folder, const Edit& edit) {
    const fs::path dir = root_ / folder;
    fs::create_directories(dir);
    std::ifstream in(root_ / "test" / "part-00000");
    std::ofstream copy(dir / "part-00000");
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) copy << edit(n, line);
    return dir;
  }
  static bool trained_a_pass(const Finished& run) {
    return run.output.find("pass: 0, using time") != std::string::npos;
  }

  static fs::path root_;
};

fs::path BadInputBinaries::root_;

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
                              "(runner.rocksdb_path '" +
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

// A key the save never saw reads, in --mode infer and an export, as the row it would have started
// at: under another initial_range or seed than the save's, both answered for other rows (exit 0).
// They are refused naming the -o that reads the save at its own; a load to train on takes the
// config's for its new keys.
TEST_F(BadInputBinaries, ASaveIsEvaluatedAndExportedAtItsOwnRowStarts) {
  const std::string save = (root_ / "row_start_saves").string();
  const Finished made = train({"-o", "runner.model_save_path=" + save, "-o", "runner.epochs=1",
                               "-o", "hyper_parameters.sparse_optimizer.initial_range=0.1"});
  ASSERT_EQ(made.status, 0) << made.output;
  const std::string load = save + "/0";
  const std::string range = "hyper_parameters.sparse_optimizer.initial_range";
  for (const std::string mode : {"infer", "export"}) {
    for (const std::string& other : {range + "=0.2", std::string("runner.seed=5"),
                                     std::string("hyper_parameters.sparse_optimizer.seed=9")}) {
      std::vector<std::string> args = {"--mode", mode,           "--load", load,
                                       "-o",     range + "=0.1", "-o",     other};
      if (mode == "export") args.insert(args.end(), {"--out", (root_ / "no_export").string()});
      const Finished refused = train(args);
      EXPECT_EQ(refused.status, 1) << refused.output;
      EXPECT_NE(refused.output.find("started its rows at other values"), std::string::npos)
          << mode << " " << other << "\n"
          << refused.output;
      const std::string key = other.substr(0, other.find('='));
      EXPECT_NE(refused.output.find(key + ": saved "), std::string::npos) << refused.output;
      EXPECT_FALSE(fs::exists(root_ / "no_export"));
    }
    // At the save's own values: read.
    std::vector<std::string> args = {"--mode", mode, "--load", load, "-o", range + "=0.1"};
    if (mode == "export") args.insert(args.end(), {"--out", (root_ / "row_start_export").string()});
    const Finished read = train(args);
    EXPECT_EQ(read.status, 0) << mode << "\n" << read.output;
  }
  const Finished warm = train({"--load", load, "-o", "runner.model_save_path=", "-o",
                               "runner.epochs=1", "-o", range + "=0.2"});
  EXPECT_EQ(warm.status, 0) << warm.output;
}

// A save loaded under another network names the keys that differ (it guessed "different
// fc_sizes, slots, dense_input_dim or dnn_batch_norm?", even when the model was another one);
// learning rates that differ are not named (a save loads under other ones).
TEST_F(BadInputBinaries, ASaveOfAnotherNetworkNamesTheKeysThatDiffer) {
  const std::string save = (root_ / "network_saves").string();
  const Finished made = train({"-o", "runner.model_save_path=" + save, "-o", "runner.epochs=1"});
  ASSERT_EQ(made.status, 0) << made.output;
  const std::string load = save + "/0";
  struct Case {
    std::vector<std::string> overrides;
    std::string named;
  };
  // The slots in another order and the dense values transformed have the save's parameter
  // count: they were read silently as the save (another model's predictions, exit 0).
  for (const Case& c : std::vector<Case>{
           {{"hyper_parameters.model=deepfm"}, "hyper_parameters.model: saved dnn, now deepfm"},
           {{"hyper_parameters.fc_sizes=[16]", "hyper_parameters.optimizer.learning_rate=0.5"},
            "hyper_parameters.fc_sizes: saved [8], now [16]"},
           {{"hyper_parameters.slot_names=[\"4\", \"3\", \"2\", \"1\"]"},
            "hyper_parameters.slot_names: saved [], now [4, 3, 2, 1]"},
           {{"runner.dense_transform=log1p"}, "runner.dense_transform: saved none, now log1p"}}) {
    for (const std::string mode : {"infer", "train", "export"}) {
      std::vector<std::string> args = {"--mode", mode, "--load", load};
      for (const std::string& o : c.overrides) args.insert(args.end(), {"-o", o});
      if (mode == "train") args.insert(args.end(), {"-o", "runner.model_save_path="});
      if (mode == "export") args.insert(args.end(), {"--out", (root_ / "no_export").string()});
      const Finished refused = train(args);
      EXPECT_EQ(refused.status, 1) << refused.output;
      EXPECT_NE(refused.output.find("save " + load +
                                    " was made for another network or input "
                                    "than the config "),
                std::string::npos)
          << mode << "\n"
          << refused.output;
      EXPECT_NE(refused.output.find(c.named), std::string::npos) << mode << "\n" << refused.output;
      EXPECT_EQ(refused.output.find("learning_rate"), std::string::npos) << refused.output;
      EXPECT_FALSE(fs::exists(root_ / "no_export"));
    }
  }
  // The numbered slot names written out are the same network as none given.
  const Finished same = train({"--mode", "infer", "--load", load, "-o",
                               "hyper_parameters.slot_names=[\"1\", \"2\", \"3\", \"4\"]"});
  EXPECT_EQ(same.status, 0) << same.output;
}

// --predictions_out that cannot be written is refused before the evaluation (it was found only
// after every save was evaluated), and an evaluation that fails leaves an earlier file whole.
TEST_F(BadInputBinaries, PredictionsOutIsCheckedFirstAndWrittenWhole) {
  const std::string save = (root_ / "predicted_saves").string();
  const Finished made = train({"-o", "runner.model_save_path=" + save, "-o", "runner.epochs=1"});
  ASSERT_EQ(made.status, 0) << made.output;
  const fs::path file = root_ / "a_file_three";
  std::ofstream(file) << "not a folder\n";
  const std::string nowhere = (file / "p.txt").string();
  const Finished refused =
      train({"--mode", "infer", "--load", save + "/0", "--predictions_out", nowhere});
  EXPECT_EQ(refused.status, 1) << refused.output;
  EXPECT_NE(refused.output.find("gpubox_train: cannot write --predictions_out '" + nowhere + "'"),
            std::string::npos)
      << refused.output;
  EXPECT_EQ(refused.output.find("infer: save:"), std::string::npos) << refused.output;

  const fs::path kept = root_ / "predictions.txt";
  std::ofstream(kept) << "1 0.5\n";
  const Finished failed = train(
      {"--mode", "infer", "--load", save + "/7", "--predictions_out", kept.string()});  // no save
  EXPECT_EQ(failed.status, 1) << failed.output;
  std::ifstream in(kept);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "1 0.5\n");
  EXPECT_FALSE(fs::exists(kept.string() + ".tmp"));

  const Finished written =
      train({"--mode", "infer", "--load", save + "/0", "--predictions_out", kept.string()});
  ASSERT_EQ(written.status, 0) << written.output;
  std::ifstream again(kept);
  std::size_t lines = 0;
  for (std::string line; std::getline(again, line);) ++lines;
  EXPECT_EQ(lines, 200u);  // the test data's instances
  EXPECT_FALSE(fs::exists(kept.string() + ".tmp"));
}

// --predictions_out holds one save's rows, one per line: several saves to evaluate are refused
// (it kept the last save's, unsaid), and so is a malformed line, named (skipped, it moved every
// row after it off its line).
TEST_F(BadInputBinaries, PredictionsOutIsOneSavesRowPerLine) {
  const std::string save = (root_ / "two_saves").string();
  const Finished made = train({"-o", "runner.model_save_path=" + save});
  ASSERT_EQ(made.status, 0) << made.output;
  const std::string out = (root_ / "rows.txt").string();
  const Finished several =
      train({"--mode", "infer", "-o", "runner.infer_load_path=" + save, "--predictions_out", out});
  EXPECT_EQ(several.status, 1) << several.output;
  EXPECT_NE(several.output.find("are one save's, and 2 saves would be evaluated"),
            std::string::npos)
      << several.output;
  EXPECT_FALSE(fs::exists(out));
  // The evaluation of `data` with --predictions_out stops naming `line` (file:line: reason),
  // writing nothing; without the flag the line is skipped and counted as before.
  const auto stops_at = [&](const fs::path& data, const std::string& line) {
    const Finished refused = train({"--mode", "infer", "--load", save + "/1", "--infer_data_dir",
                                    data.string(), "--predictions_out", out});
    EXPECT_EQ(refused.status, 1) << refused.output;
    EXPECT_NE(refused.output.find((data / "part-00000").string() + line), std::string::npos)
        << refused.output;
    EXPECT_NE(refused.output.find("(--predictions_out keeps a row per line"), std::string::npos)
        << refused.output;
    EXPECT_FALSE(fs::exists(out));
    const Finished lenient =
        train({"--mode", "infer", "--load", save + "/1", "--infer_data_dir", data.string()});
    EXPECT_EQ(lenient.status, 0) << lenient.output;
  };
  stops_at(edited_test_data("bad_test",
                            [](int n, const std::string& line) {
                              return (n == 5 ? "click:7 1:3" : line) + "\n";
                            }),
           ":5: bad_label");
  // A blank line (or one of spaces) would move every row after it too.
  stops_at(edited_test_data(
               "blank_test",
               [](int n, const std::string& line) { return line + (n == 3 ? "\n   \n" : "\n"); }),
           ":4: blank line");
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

// --predictions_out through a symlink writes its target and keeps the link; into a FIFO it writes
// the lines to the reader (both were replaced by a regular file <path>.tmp was renamed to).
TEST_F(BadInputBinaries, PredictionsOutWritesThroughSymlinksAndFifos) {
  const std::string save = (root_ / "linked_saves").string();
  const Finished made = train({"-o", "runner.model_save_path=" + save, "-o", "runner.epochs=1"});
  ASSERT_EQ(made.status, 0) << made.output;
  const fs::path target = root_ / "target.txt";
  const fs::path link = root_ / "link.txt";
  std::ofstream(target) << "1 0.5\n";
  fs::create_symlink(target, link);
  const Finished linked =
      train({"--mode", "infer", "--load", save + "/0", "--predictions_out", link.string()});
  ASSERT_EQ(linked.status, 0) << linked.output;
  EXPECT_TRUE(fs::is_symlink(link));
  std::ifstream in(target);
  std::size_t lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  EXPECT_EQ(lines, 200u);

  const fs::path fifo = root_ / "predictions.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Held open read-write and non-blocking: the run's open does not wait, and 200 short lines fit
  // the pipe's buffer, read after the run.
  const int reader = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  const Finished piped =
      train({"--mode", "infer", "--load", save + "/0", "--predictions_out", fifo.string()});
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(reader, buf, sizeof(buf))) > 0;) text.append(buf, n);
  ::close(reader);
  ASSERT_EQ(piped.status, 0) << piped.output;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 200) << text;
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
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

}  // namespace
}  // namespace gpubox
