// Crash-safe resume with the real binaries (gpubox_train + gpubox_server on loopback, small
// generated data, 2 cards (1 on a 1-GPU machine), shuffled passes):
//  - a 3-pass run (passes 0, 1, 2) whose trainer and server are killed with -9 in pass 1, run
//    again against a fresh server, resumes from pass 0 and ends with the same final test AUC as an
//    uninterrupted run, and the same dense half bit for bit: the run is deterministic (the
//    shuffle seed is derived from runner.seed and the pass, every reduction has a fixed order);
//  - a server restarted (kill -9, same port) while pass 1 trains is repaired in the run: pass 1
//    is dropped from the cards, pass 0's save reloaded and pass 1 trained again, and the run
//    ends the same;
//  - a server restarted between passes (around pass 1's save) is repaired in the run, and so
//    are both of two restarted together;
//  - a token-protected server refuses a trainer without its token, and serves one given
//    GPUBOX_AUTH_TOKEN_FILE;
//  - gpubox_train --mode infer --load refuses a save whose halves do not match its manifest.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "table/io/model_manifest.hpp"
#include "tests/dataset/planted_data.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/integration/child_process.hpp"

#if !defined(GPUBOX_TRAIN_BIN) || !defined(GPUBOX_SERVER_BIN)
#error "GPUBOX_TRAIN_BIN and GPUBOX_SERVER_BIN must name the binaries"
#endif

namespace gpubox {
namespace {

namespace fs = std::filesystem;
using testing::ChildProcess;

constexpr double kRunSeconds = 60;  // one trainer run, at most (each takes a few seconds)

class ResumeBinaries : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("gpubox_resume_bin_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    testing::write_small_train_test(root_, 6000, 2000, /*seed=*/3, /*slots=*/6, /*dense=*/3,
                                    /*vocab=*/2000, /*files=*/2);
    std::ofstream(root_ / "config.yaml") << "runner:\n"
                                            "  train_data_dir: train\n"
                                            "  test_data_dir: test\n"
                                            "  metrics_path: \"\"\n"
                                            "  train_batch_size: 64\n"
                                            "  epochs: 3\n"
                                            "  thread_num: 2\n"
                                            "  print_interval: 1\n"
                                            "  shuffle: true\n"
                                            "  seed: 5\n"
                                            "  save_mode: checkpoint\n"
                                            "hyper_parameters:\n"
                                            "  sparse_inputs_slots: 7\n"
                                            "  dense_input_dim: 3\n"
                                            "  sparse_feature_dim: 5\n"
                                            "  fc_sizes: [16, 8]\n"
                                            "  optimizer:\n"
                                            "    learning_rate: 0.01\n"
                                            "  sparse_optimizer:\n"
                                            "    learning_rate: 0.3\n"
                                            "    mf_learning_rate: 0.3\n";
    // The uninterrupted run every other run is compared with.
    auto server = start_server();
    auto trainer = start_trainer("straight", server_endpoint(*server));
    ASSERT_EQ(trainer->wait(kRunSeconds), 0) << trainer->output();
    straight_auc_ = final_test_auc(trainer->output());
    ASSERT_FALSE(straight_auc_.empty()) << trainer->output();
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // A gpubox_server on `port` (0: any) holding saves under the test folder.
  static std::unique_ptr<ChildProcess> start_server(int port = 0,
                                                    const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"--port",     std::to_string(port),
                                     "--config",   (root_ / "config.yaml").string(),
                                     "--data_dir", root_.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    auto server = std::make_unique<ChildProcess>(GPUBOX_SERVER_BIN, args);
    EXPECT_TRUE(server->wait_for(" (shard ", 10)) << server->output();
    return server;
  }
  static std::string server_endpoint(const ChildProcess& server) {
    const std::string& out = server.output();
    const auto at = out.find("listening on ");
    if (at == std::string::npos) return "";
    return out.substr(at + 13, out.find(' ', at + 13) - at - 13);
  }
  // gpubox_train on the test config, saving under `save`, against `endpoint` ("": in-process).
  static std::unique_ptr<ChildProcess> start_trainer(const std::string& save,
                                                     const std::string& endpoint,
                                                     std::vector<std::string> args = {},
                                                     std::vector<std::string> env = {}) {
    args.insert(args.begin(), {"--config", (root_ / "config.yaml").string(), "--threads_per_card",
                               "1", "-o", "runner.model_save_path=" + (root_ / save).string()});
    env.insert(env.begin(),
               {"PADDLE_PSERVERS_IP_PORT_LIST=" + endpoint,
                "FLAGS_selected_gpus=" + device::testing::card_list(device::testing::cards_here(2)),
                "GPUBOX_AUTH_TOKEN_FILE="});
    return std::make_unique<ChildProcess>(GPUBOX_TRAIN_BIN, args, env, root_.string());
  }
  // How many times `what` occurs in `out`.
  static std::size_t occurrences(const std::string& out, const std::string& what) {
    std::size_t n = 0;
    for (auto at = out.find(what); at != std::string::npos; at = out.find(what, at + 1)) ++n;
    return n;
  }
  // Where `out` warns of the reload after servers restarted between passes: "No pass was open"
  // when the trainer was stopped between passes, or "The pass's rows on the cards are dropped"
  // when, on a loaded machine, it went on into the next pass's start before the test's SIGSTOP
  // landed (a server logs its save before it replies); npos when neither. Either way the run
  // must end as the straight run does.
  static std::size_t between_passes_reload(const std::string& out) {
    return std::min(out.find("No pass was open: reloading the last complete save (pass "),
                    out.find("The pass's rows on the cards are dropped: reloading the last "
                             "complete save (pass "));
  }
  // The value of the last "test auc: " in a trainer's output.
  static std::string final_test_auc(const std::string& out) {
    const auto at = out.rfind("epoch: 2, test auc: ");
    if (at == std::string::npos) return "";
    return out.substr(at + 20, out.find(',', at + 20) - at - 20);
  }
  static table::io::ModelManifest manifest(const std::string& save, int pass) {
    auto m = table::io::read_model_manifest(table::io::FileEnv::posix(),
                                            (root_ / save / std::to_string(pass)).string());
    throw_if_error(m.status());
    return m.value();
  }

  static fs::path root_;
  static std::string straight_auc_;
};
fs::path ResumeBinaries::root_;
std::string ResumeBinaries::straight_auc_;

TEST_F(ResumeBinaries, KilledInPass1RerunEndsWithTheSameTestAucAndDenseHalf) {
  {
    auto server = start_server();
    auto trainer = start_trainer("killed", server_endpoint(*server));
    ASSERT_TRUE(trainer->wait_for("pass 1: 3/", kRunSeconds)) << trainer->output();
    trainer->signal(SIGKILL);
    server->signal(SIGKILL);  // a machine that went down: the server's rows are gone too
    EXPECT_EQ(trainer->wait(10), 128 + SIGKILL);
    ASSERT_EQ(trainer->output().find("pass: 1,"), std::string::npos)
        << "pass 1 ended before the kill: the test did not interrupt it";
  }
  auto server = start_server();
  auto rerun = start_trainer("killed", server_endpoint(*server));
  ASSERT_EQ(rerun->wait(kRunSeconds), 0) << rerun->output();
  EXPECT_NE(rerun->output().find("runner.resume: resuming from pass 0 ("), std::string::npos)
      << rerun->output();
  EXPECT_NE(rerun->output().find("the next pass is 1"), std::string::npos) << rerun->output();
  EXPECT_EQ(rerun->output().find("pass: 0,"), std::string::npos) << "pass 0 trained again";
  EXPECT_EQ(final_test_auc(rerun->output()), straight_auc_) << rerun->output();
  EXPECT_EQ(manifest("killed", 2).dense, manifest("straight", 2).dense)
      << "the dense halves (parameters and Adam state) differ";
}

// Found by pass 1's write-back at its end (the steps call no server), or by the staging of pass
// 2 first: either way pass 1 was open on the cards.
TEST_F(ResumeBinaries, AServerRestartedMidPassIsRepairedInTheRun) {
  auto server = start_server();
  const std::string endpoint = server_endpoint(*server);
  const int port = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
  auto trainer = start_trainer("mid_pass", endpoint);
  ASSERT_TRUE(trainer->wait_for("pass 1: 3/", kRunSeconds)) << trainer->output();
  server->signal(SIGKILL);
  EXPECT_EQ(server->wait(10), 128 + SIGKILL);
  server = start_server(port);  // back on the same port, empty
  ASSERT_EQ(server_endpoint(*server), endpoint) << server->output();
  ASSERT_EQ(trainer->wait(kRunSeconds), 0) << trainer->output();
  const std::string& out = trainer->output();
  EXPECT_NE(out.find("pass 1: server " + endpoint + " restarted (instance "), std::string::npos)
      << out;
  EXPECT_NE(out.find("The pass's rows on the cards are dropped: reloading the last complete save "
                     "(pass 0, " +
                     (root_ / "mid_pass" / "0").string() + ")"),
            std::string::npos)
      << out;
  EXPECT_EQ(occurrences(out, "pass: 1,"), 1u) << out;
  EXPECT_EQ(final_test_auc(out), straight_auc_) << out;
}

TEST_F(ResumeBinaries, AServerRestartedBetweenPassesIsReloadedInTheRun) {
  auto server = start_server();
  const std::string endpoint = server_endpoint(*server);
  const int port = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
  auto trainer = start_trainer("between", endpoint);
  // The server's log line of pass 1's sparse save comes before its reply: the trainer is
  // stopped there, between passes, while the server is replaced.
  ASSERT_TRUE(
      server->wait_for("saved to " + (root_ / "between" / "1" / "sparse").string(), kRunSeconds))
      << server->output();
  trainer->signal(SIGSTOP);
  server->signal(SIGKILL);
  EXPECT_EQ(server->wait(10), 128 + SIGKILL);
  server = start_server(port);
  trainer->signal(SIGCONT);
  ASSERT_EQ(trainer->wait(kRunSeconds), 0) << trainer->output();
  const std::string& out = trainer->output();
  EXPECT_NE(out.find("server " + endpoint + " restarted"), std::string::npos) << out;
  EXPECT_NE(between_passes_reload(out), std::string::npos) << out;
  EXPECT_EQ(occurrences(out, ": reloading the last complete save"), 1u) << out;
  EXPECT_EQ(final_test_auc(out), straight_auc_) << out;
}

// Both servers of two restarted together (a fleet restart): the call that finds the first stops
// there, so every server is asked who it is before any restart is accepted; both are named in one
// warning and one reload restores both. The rows are sharded by key, so the run ends as the
// straight run on one server does.
TEST_F(ResumeBinaries, TwoServersRestartedBetweenPassesAreReloadedTogether) {
  std::vector<std::unique_ptr<ChildProcess>> servers;
  std::vector<std::string> endpoints;
  const auto shard = [](int i) {
    return std::vector<std::string>{"--shard_id", std::to_string(i), "--shard_num", "2"};
  };
  for (int i = 0; i < 2; ++i) {
    servers.push_back(start_server(0, shard(i)));
    endpoints.push_back(server_endpoint(*servers.back()));
  }
  auto trainer = start_trainer("between_both", endpoints[0] + "," + endpoints[1]);
  // Both servers' log lines of pass 1's sparse save come before their replies: the trainer is
  // stopped there, between passes, while the servers are replaced.
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(servers[std::size_t(i)]->wait_for(
        "saved to " + (root_ / "between_both" / "1" / "sparse").string(), kRunSeconds))
        << servers[std::size_t(i)]->output();
  }
  trainer->signal(SIGSTOP);
  for (int i = 0; i < 2; ++i) {
    auto& server = servers[std::size_t(i)];
    server->signal(SIGKILL);
    EXPECT_EQ(server->wait(10), 128 + SIGKILL);
    const std::string& endpoint = endpoints[std::size_t(i)];
    server = start_server(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)), shard(i));
  }
  trainer->signal(SIGCONT);
  ASSERT_EQ(trainer->wait(kRunSeconds), 0) << trainer->output();
  const std::string& out = trainer->output();
  const auto warned = between_passes_reload(out);
  ASSERT_NE(warned, std::string::npos) << out;
  const std::string warning =
      out.substr(out.rfind('\n', warned) + 1, warned - out.rfind('\n', warned));
  for (const std::string& endpoint : endpoints) {
    EXPECT_NE(warning.find("server " + endpoint + " restarted"), std::string::npos) << out;
  }
  EXPECT_EQ(occurrences(out, ": reloading the last complete save"), 1u) << out;  // one reload
  EXPECT_EQ(final_test_auc(out), straight_auc_) << out;
}

TEST_F(ResumeBinaries, ATokenServerServesOnlyATrainerGivenItsToken) {
  const fs::path token = root_ / "token";
  std::ofstream(token) << "t0k3n-0123456789abcdef0123456789-" << ::getpid() << "\n";
  ::chmod(token.c_str(), 0600);
  auto server = start_server(0, {"--auth_token_file", token.string()});
  const std::string endpoint = server_endpoint(*server);

  auto without = start_trainer("token_none", endpoint, {"-o", "runner.epochs=1"});
  EXPECT_EQ(without->wait(kRunSeconds), 1) << without->output();
  EXPECT_NE(without->output().find("they need a token: set runner.auth_token_file or "
                                   "GPUBOX_AUTH_TOKEN_FILE"),
            std::string::npos)
      << without->output();

  const fs::path wrong = root_ / "wrong_token";
  std::ofstream(wrong) << "not-it-0123456789abcdef0123456789abcdef\n";
  ::chmod(wrong.c_str(), 0600);
  auto refused = start_trainer("token_wrong", endpoint, {"-o", "runner.epochs=1"},
                               {"GPUBOX_AUTH_TOKEN_FILE=" + wrong.string()});
  EXPECT_EQ(refused->wait(kRunSeconds), 1) << refused->output();
  EXPECT_NE(refused->output().find("the token of GPUBOX_AUTH_TOKEN_FILE '" + wrong.string() +
                                   "' was refused"),
            std::string::npos)
      << refused->output();

  // The config names a missing file, the environment the right one: the environment wins.
  auto with = start_trainer(
      "token_ok", endpoint,
      {"-o", "runner.epochs=1", "-o", "runner.auth_token_file=" + (root_ / "missing").string()},
      {"GPUBOX_AUTH_TOKEN_FILE=" + token.string()});
  EXPECT_EQ(with->wait(kRunSeconds), 0) << with->output();
  EXPECT_NE(with->output().find("pass: 0,"), std::string::npos) << with->output();
}

TEST_F(ResumeBinaries, InferRefusesASaveWhoseHalvesDoNotMatch) {
  const fs::path mixed = root_ / "mixed";
  fs::copy(root_ / "straight" / "2", mixed, fs::copy_options::recursive);
  fs::remove_all(mixed / "dense");
  fs::copy(root_ / "straight" / "1" / "dense", mixed / "dense", fs::copy_options::recursive);
  auto infer = start_trainer("unused", "", {"--mode", "infer", "--load", mixed.string()});
  EXPECT_EQ(infer->wait(kRunSeconds), 1) << infer->output();
  EXPECT_NE(infer->output().find(
                "the halves of " + mixed.string() +
                " do not match its MODEL_MANIFEST (saved after 3 passes): dense/MANIFEST has "
                "digest"),
            std::string::npos)
      << infer->output();

  const std::string last = (root_ / "straight" / "2").string();
  auto good = start_trainer("unused", "", {"--mode", "infer", "--load", last});
  EXPECT_EQ(good->wait(kRunSeconds), 0) << good->output();
  EXPECT_NE(good->output().find("infer: save: " + last + ", examples: 2000, auc: " + straight_auc_),
            std::string::npos)
      << good->output();
}

}  // namespace
}  // namespace gpubox
