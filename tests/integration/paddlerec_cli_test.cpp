// gpubox_train used as a PaddleRec user uses PaddleRec's trainers, through the binaries:
//  - `-m config.yaml` (PaddleRec's flag) from a PaddleRec-shaped checkout; saves numbered from 0
//    under model_save_path taken from the working directory (not the config's folder);
//  - PaddleRec's lines ("Epoch: E, using time: ..." with ips per card, "epoch: E done, ..."),
//    epochs and passes both from 0;
//  - --mode infer evaluates every save in [infer_start_epoch, infer_end_epoch) under
//    infer_load_path, one line per save (the test data served from the pass data cache after
//    the first, and the cache's closing line logged), and a missing save is an error naming it;
//  - which saves infer picks (saves_to_evaluate) against the folder it looks at;
//  - a PaddleRec ffm folder's config (no hyper_parameters.model) read by gpubox_server and by
//    gpubox_train in a PS mode: both take ffm's row width from the folder, and the job trains;
//  - every binary's --help / -h (its own options, no gflags internals, no build-machine path)
//    and --version (version, commit, backend).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "tests/integration/child_process.hpp"
#include "trainer/schedule/saved_models.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;

struct RunResult {
  int status = -1;
  std::string output;  // stdout and stderr
};

RunResult run(const std::string& command) {
  RunResult r;
  std::FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) r.output.append(buf, n);
  const int status = ::pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::size_t count(const std::string& text, const std::regex& re) {
  return static_cast<std::size_t>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

class PaddleRecCli : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("gpubox_paddlerec_cli_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    // PaddleRec's layout: the config beside its data, run from the checkout's root.
    const fs::path model = root_ / "models/rank/dnn";
    fs::create_directories(model / "data/sample_data/train");
    fs::copy_file(fs::path(GPUBOX_SOURCE_DIR) / "configs/data/sample_data/train/sample_train.txt",
                  model / "data/sample_data/train/sample_train.txt");
    // PaddleRec's config_gpubox.yaml, less its Python reader (tested in the dataset tests).
    std::ofstream(model / "config_gpubox.yaml") << "runner:\n"
                                                   "  train_data_dir: \"data/sample_data/train\"\n"
                                                   "  use_gpu: True\n"
                                                   "  use_auc: True\n"
                                                   "  train_batch_size: 32\n"
                                                   "  epochs: 3\n"
                                                   "  print_interval: 10\n"
                                                   "  model_save_path: \"output_model_dnn_queue\"\n"
                                                   "  sync_mode: \"gpubox\"\n"
                                                   "  thread_num: 2\n"
                                                   "  reader_type: \"InmemoryDataset\"\n"
                                                   "  infer_batch_size: 2\n"
                                                   "  test_data_dir: \"data/sample_data/train\"\n"
                                                   "  infer_load_path: \"output_model_dnn_queue\"\n"
                                                   "  infer_start_epoch: 0\n"
                                                   "  infer_end_epoch: 3\n"
                                                   "hyper_parameters:\n"
                                                   "  optimizer:\n"
                                                   "    class: Adam\n"
                                                   "    learning_rate: 0.001\n"
                                                   "  sparse_inputs_slots: 27\n"
                                                   "  sparse_feature_number: 1024\n"
                                                   "  sparse_feature_dim: 9\n"
                                                   "  dense_input_dim: 13\n"
                                                   "  fc_sizes: [32, 16]\n";
  }
  void TearDown() override { fs::remove_all(root_); }

  // gpubox_train in the checkout's root, as PaddleRec's launcher runs its trainer.
  RunResult train(const std::string& args) const {
    return run("cd '" + root_.string() +
               "' && FLAGS_selected_gpus=0 '" GPUBOX_TRAIN_BIN "' --threads_per_card 1 " + args);
  }

  fs::path root_;
};

TEST_F(PaddleRecCli, TrainsWithDashMSavesFromEpochZeroAndPrintsPaddleRecLines) {
  const RunResult r = train("-m models/rank/dnn/config_gpubox.yaml -o runner.metrics_path=");
  ASSERT_EQ(r.status, 0) << r.output;
  // Saves 0..E-1 in the working directory, none beside the config.
  for (int epoch = 0; epoch < 3; ++epoch) {
    EXPECT_TRUE(is_save_folder((root_ / "output_model_dnn_queue" / std::to_string(epoch)).string()))
        << epoch << "\n"
        << r.output;
  }
  EXPECT_FALSE(fs::exists(root_ / "output_model_dnn_queue/3"));
  EXPECT_FALSE(fs::exists(root_ / "models/rank/dnn/output_model_dnn_queue"));
  // PaddleRec's lines, one of each per epoch, from 0; the pass lines count from 0 too.
  const std::regex epoch_line(
      R"(\nEpoch: ([0-2]), using time: [0-9.]+ second, ips: [0-9.]+ example/sec\. auc: 0\.[0-9]+\n)");
  const std::regex done_line(
      R"(\nepoch: ([0-2]) done, auc: 0\.[0-9]+, logloss: [0-9.]+, epoch time: [0-9.]+ s\n)");
  EXPECT_EQ(count(r.output, epoch_line), 3u) << r.output;
  EXPECT_EQ(count(r.output, done_line), 3u) << r.output;
  EXPECT_EQ(count(r.output, std::regex("\npass: [0-2], using time: ")), 3u) << r.output;
  EXPECT_EQ(r.output.find("\npass: 3,"), std::string::npos) << r.output;
  EXPECT_EQ(count(r.output, std::regex(R"(\nepoch: [0-2], test auc: )")), 3u) << r.output;
  // One card: PaddleRec's ips (per card) is GPUBox's ips.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      r.output, m, std::regex(R"(\nEpoch: 0, using time: [0-9.]+ second, ips: ([0-9.]+))")));
  const std::string paddle_ips = m[1];
  ASSERT_TRUE(std::regex_search(
      r.output, m, std::regex(R"(\npass: 0, using time: [0-9.]+ second, ips: ([0-9.]+))")));
  EXPECT_EQ(paddle_ips, std::string(m[1]));

  // --mode infer with PaddleRec's range: every save, one PaddleRec line each, in order; the test
  // data read once, served from the pass data cache for the other two saves, and said at the end.
  const RunResult infer =
      train("-m models/rank/dnn/config_gpubox.yaml --mode infer -o runner.pass_cache_mb=16");
  ASSERT_EQ(infer.status, 0) << infer.output;
  const std::regex infer_done(
      R"(\nepoch: ([0-9]+) done, auc: 0\.[0-9]+, logloss: [0-9.]+, epoch time: [0-9.]+ s\n)");
  std::vector<std::string> epochs;
  for (auto it = std::sregex_iterator(infer.output.begin(), infer.output.end(), infer_done);
       it != std::sregex_iterator(); ++it) {
    epochs.push_back((*it)[1]);
  }
  EXPECT_EQ(epochs, (std::vector<std::string>{"0", "1", "2"})) << infer.output;
  EXPECT_EQ(
      count(infer.output, std::regex("\ninfer: save: output_model_dnn_queue/[0-2], examples: 80,")),
      3u)
      << infer.output;
  EXPECT_NE(infer.output.find("pass data cache: 2 loads (160 instances) served instead of read"),
            std::string::npos)
      << infer.output;

  // A range past the saves names the missing one and what is there.
  const RunResult missing = train(
      "-m models/rank/dnn/config_gpubox.yaml --mode infer -o runner.infer_start_epoch=1 -o "
      "runner.infer_end_epoch=5");
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.output.find("no save of epoch 3 at 'output_model_dnn_queue/3' "
                                "(runner.infer_start_epoch 1, runner.infer_end_epoch 5); saves "
                                "there: 0, 1, 2"),
            std::string::npos)
      << missing.output;
  // GPUBox's own form: infer_load_path (or --load) naming one save.
  const RunResult one = train(
      "--config models/rank/dnn/config_gpubox.yaml --mode infer -o "
      "runner.infer_load_path=output_model_dnn_queue/1");
  ASSERT_EQ(one.status, 0) << one.output;
  EXPECT_EQ(count(one.output, infer_done), 1u) << one.output;
  EXPECT_NE(one.output.find("\nepoch: 1 done, "), std::string::npos) << one.output;
}

// Issue 32: the server derived its rows' width from the keys alone, so with ffm chosen by the
// folder it kept rows of one factor while the trainer wanted one per field, and the trainer's
// handshake refused the server naming both widths. Now both resolve the network the same way.
TEST_F(PaddleRecCli, AnFfmFolderTrainsAgainstAServerStartedWithTheSameConfig) {
  const fs::path ffm = root_ / "models/rank/ffm";
  fs::create_directories(ffm);
  std::ofstream(ffm / "config.yaml") << "runner:\n"
                                        "  train_data_dir: \"../dnn/data/sample_data/train\"\n"
                                        "  train_batch_size: 16\n"
                                        "  epochs: 2\n"
                                        "  thread_num: 1\n"
                                        "  sync_mode: \"async\"\n"
                                        "  metrics_path: \"\"\n"
                                        "hyper_parameters:\n"
                                        "  sparse_inputs_slots: 27\n"
                                        "  sparse_feature_dim: 3\n"
                                        "  dense_input_dim: 13\n";
  const std::string config = (ffm / "config.yaml").string();
  testing::ChildProcess server(GPUBOX_SERVER_BIN,
                               {"--port", "0", "--config", config, "--data_dir", root_.string()});
  ASSERT_TRUE(server.wait_for(" (shard ", 20)) << server.output();
  const std::string& out = server.output();
  const auto at = out.find("listening on ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string endpoint = out.substr(at + 13, out.find(' ', at + 13) - at - 13);
  const RunResult r = run("cd '" + root_.string() +
                          "' && FLAGS_selected_gpus=0 PADDLE_PSERVERS_IP_PORT_LIST=" + endpoint +
                          " GPUBOX_AUTH_TOKEN_FILE= '" GPUBOX_TRAIN_BIN "' -m " + config);
  ASSERT_EQ(r.status, 0) << r.output << "\nserver:\n" << server.output();
  EXPECT_NE(r.output.find("network: ffm (from PaddleRec's model folder"), std::string::npos)
      << r.output;
  EXPECT_EQ(count(r.output, std::regex("\npass: [0-1], using time: ")), 2u) << r.output;
}

TEST_F(PaddleRecCli, SavesToEvaluateFollowTheFolder) {
  const fs::path saves = root_ / "saves";
  for (const char* epoch : {"0", "1", "2", "4"}) {
    fs::create_directories(saves / epoch / "sparse");
    fs::create_directories(saves / epoch / "dense");
  }
  fs::create_directories(saves / "3");  // not a save: no halves
  fs::create_directories(saves / "notes" / "sparse");
  const auto epochs = [](const std::vector<SaveToEvaluate>& list) {
    std::vector<int64_t> out;
    for (const SaveToEvaluate& s : list) out.push_back(s.epoch);
    return out;
  };
  EXPECT_EQ(epochs(saves_to_evaluate(saves.string(), 0, 3)), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(epochs(saves_to_evaluate(saves.string(), 1, 2)), (std::vector<int64_t>{1}));
  EXPECT_EQ(saves_to_evaluate(saves.string(), 1, 2)[0].dir, (saves / "1").string());
  // -1: through the last save there; a gap in the range is an error naming it.
  EXPECT_THROW(saves_to_evaluate(saves.string(), 0, -1), Error);
  EXPECT_EQ(epochs(saves_to_evaluate(saves.string(), 4, -1)), (std::vector<int64_t>{4}));
  try {
    saves_to_evaluate(saves.string(), 2, 4);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no save of epoch 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("saves there: 0, 1, 2, 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(saves_to_evaluate(saves.string(), 2, 2), Error);  // an empty range
  EXPECT_THROW(saves_to_evaluate((root_ / "nothing").string(), 0, 1), Error);
  EXPECT_THROW(saves_to_evaluate("", 0, 1), Error);
  // One save named directly: that save, its epoch when its folder is a number.
  EXPECT_EQ(epochs(saves_to_evaluate((saves / "2").string(), 0, 1)), (std::vector<int64_t>{2}));
  EXPECT_THROW(saves_to_evaluate((saves / "notes").string(), 0, 1), Error);  // half a save
  fs::create_directories(saves / "notes" / "dense");
  EXPECT_EQ(epochs(saves_to_evaluate((saves / "notes").string(), 0, 1)),
            (std::vector<int64_t>{-1}));
  // A save folder named with leading zeros is not read as that pass's (it was read as 5, then
  // refused as "no save of epoch 5 at N/5" with 5 among the saves listed there): named apart.
  fs::create_directories(saves / "05" / "sparse");
  fs::create_directories(saves / "05" / "dense");
  EXPECT_EQ(epochs(saves_to_evaluate(saves.string(), 4, -1)), (std::vector<int64_t>{4}));
  EXPECT_EQ(epochs(saves_to_evaluate((saves / "05").string(), 0, 1)), (std::vector<int64_t>{-1}));
  // A save a killed run left half written (its sparse half, its dense half staged): not
  // evaluated "through the last", and said (it was passed over without a word).
  fs::create_directories(saves / "7" / "sparse");
  fs::create_directories(saves / "7" / "dense.tmp");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(epochs(saves_to_evaluate(saves.string(), 4, -1)), (std::vector<int64_t>{4}));
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find((saves / "7").string() + " holds an unfinished save (its run stopped while "
                                               "saving it): not evaluated; the saves evaluated "
                                               "end with 4"),
            std::string::npos)
      << said;
  fs::remove_all(saves / "7");
  try {
    saves_to_evaluate(saves.string(), 5, 6);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("saves there: 0, 1, 2, 4 (not read: 05: a save's folder "
                                         "is its pass number, with no leading zeros)"),
              std::string::npos)
        << e.what();
  }
}

// Each binary's own usage: what it does, its flags with defaults, an example; no gflags flags,
// no path of this machine; --version: version, commit, backend.
TEST(ToolUsage, EveryBinaryPrintsItsOwnHelpAndVersion) {
  struct Case {
    std::string command;
    std::string must_hold;
  };
  const std::vector<Case> cases = {
      {"'" GPUBOX_TRAIN_BIN "' --help", "--infer_data_dir (default: \"\")"},
      {"'" GPUBOX_TRAIN_BIN "' -h", "-m CONFIG.yaml"},
      {"'" GPUBOX_TRAIN_BIN "' --config x.yaml -o runner.epochs=2 --help", "usage: gpubox_train"},
      {"'" GPUBOX_SERVER_BIN "' --help", "--port (default: 29011)"},
      {"'" GPUBOX_SERVER_BIN "' -h", "--max_inflight_mb (default: 1024)"},
      {"'" GPUBOX_SERVE_BIN "' --help", "--model (default: \"\")"},
      {"'" GPUBOX_TRAIN_BIN "' --help", "--mode export"},
      {"'" GPUBOX_DATA_BIN "' --help", "usage: gpubox_data convert"},
      {"'" GPUBOX_DATA_BIN "' gen --help", "--vocab N (default: 100000)"},
      {"'" GPUBOX_DATA_BIN "' stat --help", "usage: gpubox_data stat --config"},
      {"'" GPUBOX_DATA_BIN "' stat -h", "--json (default: false)"},
      {"'" GPUBOX_DATA_BIN "' convert --help", "--to F (default: slot)"},
  };
  for (const Case& c : cases) {
    const RunResult r = run(c.command);
    EXPECT_EQ(r.status, 0) << c.command << "\n" << r.output;
    EXPECT_NE(r.output.find(c.must_hold), std::string::npos) << c.command << "\n" << r.output;
    EXPECT_NE(r.output.find("example"), std::string::npos) << c.command << "\n" << r.output;
    EXPECT_EQ(r.output.find("flagfile"), std::string::npos) << c.command << "\n" << r.output;
    EXPECT_EQ(r.output.find(GPUBOX_SOURCE_DIR), std::string::npos) << c.command;
    EXPECT_EQ(r.output.find(".cpp"), std::string::npos) << c.command << "\n" << r.output;
  }
  const std::regex version(
      R"(gpubox_(train|server|serve|data) [0-9]+\.[0-9]+\.[0-9]+ \(commit ([0-9a-f]{12}(-dirty)?|unknown), backend (cpu|cuda)\)\n)");
  for (const std::string bin :
       {GPUBOX_TRAIN_BIN, GPUBOX_SERVER_BIN, GPUBOX_SERVE_BIN, GPUBOX_DATA_BIN}) {
    const RunResult r = run("'" + bin + "' --version");
    EXPECT_EQ(r.status, 0) << bin;
    EXPECT_TRUE(std::regex_match(r.output, version)) << r.output;
  }
}

// No binary carries the path of the machine it was built on (its __FILE__ strings included).
TEST(ToolUsage, BinariesHoldNoBuildMachinePath) {
#if defined(GPUBOX_CUDA_LINEINFO_BUILD)
  // nvcc -lineinfo (GPUBOX_CUDA_LINEINFO, scripts/bundle_cuda.sh's build for the sanitizer
  // reports) writes the source paths into the device code's line tables.
  GTEST_SKIP() << "a -lineinfo build names its sources for compute-sanitizer's reports";
#endif
  for (const std::string bin :
       {GPUBOX_TRAIN_BIN, GPUBOX_SERVER_BIN, GPUBOX_SERVE_BIN, GPUBOX_DATA_BIN}) {
    const RunResult r = run("grep -c -a -F '" GPUBOX_SOURCE_DIR "/' '" + bin + "'");
    EXPECT_EQ(r.output, "0\n") << bin << " holds " << GPUBOX_SOURCE_DIR;
  }
}

}  // namespace
}  // namespace gpubox::trainer
