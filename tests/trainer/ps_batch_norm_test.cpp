// dlrm with batch norm (hyper_parameters.dnn_batch_norm) in the parameter-server modes, against
// an in-process gpubox_server shard on loopback, on the planted data (tests/dataset/
// planted_data.hpp): async and sync, with two training threads that each move their own copy of
// the running statistics and merge the moves through the dense table, learn what the gpubox
// mode learns taking as many steps, and their statistics end finite and moved; async with 8 threads
// averages the threads' statistic moves (PsWorker::sync_dense); geo is refused at load
// (config_loader.cpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/card.hpp"
#include "tests/dataset/planted_data.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/engine/trainer.hpp"
#include "trainer/nn/dense_model.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kDlrmBn = {
    "hyper_parameters.model=dlrm", "hyper_parameters.dnn_batch_norm=true",
    "hyper_parameters.sparse_feature_dim=5", "hyper_parameters.bot_layer_sizes=[16, 5]",
    "runner.thread_num=2"};

class PsBatchNorm : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("gpubox_ps_bn_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    dataset::OracleSummary oracle;
    gpubox::testing::write_planted_train_test(root_, &oracle);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }
  // `output`: dlrm's output layer (hyper_parameters.dlrm_output).
  static TrainerConfig config(const std::string& mode, const std::string& output = "logit") {
    std::vector<std::string> extra = kDlrmBn;
    extra.push_back("runner.sync_mode=" + mode);
    extra.push_back("hyper_parameters.dlrm_output=" + output);
    return ps_test_config(extra);
  }
  static std::vector<std::string> files(const char* part) {
    return data_files((root_ / part).string());
  }
  static fs::path root_;
};
fs::path PsBatchNorm::root_;

// Both output layers: the logit, and PaddleRec's two-class output, whose last norm's statistics
// the threads move and merge like the others'.
class PsBatchNormOutputs : public PsBatchNorm, public ::testing::WithParamInterface<const char*> {};

// The reference of each mode is the gpubox mode taking the same steps (issue 32): async's threads
// each add their changes whole (a thread's step moves the model as a card's does), so one card and
// its pass of twice the steps; sync's step is the gpubox mode's on as many cards as the trainer has
// training threads (the job's gradients averaged, one optimizer step; a key's gradients summed
// over the threads: SyncOnTwoThreadsStepsAsTheGpuboxModeOnTwoCards below), so two cards. Against
// one card, sync's two threads trail (half the Adam steps, each about the learning rate whatever
// the batch, move the model half as far): the gpubox mode on two cards trails one card as much
// (0.6933 against 0.7142 two-class, 0.7191 against 0.7311 logit). Against two cards, sync ends
// 0.0015 behind (logit) and 0.0014 ahead (two-class), the same every run; before its step was the
// cards' (each thread its own Adam step, averaged; each thread's push of a key applied on its own)
// it trailed by 0.002-0.014 two-class, 0.001-0.007 logit. What is left is the rows' rounding (the
// servers' rule against the cards', 1e-9 a step) that Adam grows through the biases before a norm.
// async 0.000-0.017 behind one card, 0.003-0.018 logit (the bounds below say what a loaded machine
// adds).
TEST_P(PsBatchNormOutputs, AsyncAndSyncLearnWhatTheGpuboxModeLearns) {
  constexpr int kEpochs = 3;
  const TrainerConfig gpubox_cfg = config("gpubox", GetParam());
  // The gpubox mode's test AUC on `cards` cards, one thread a card.
  const auto gpubox_auc = [&](int cards) {
    TrainerEnv env;
    env.selected_cards = device::testing::card_list(cards);
    env.threads_per_card = 1;
    Trainer gpubox(gpubox_cfg, env);
    for (int e = 0; e < kEpochs; ++e) gpubox.train_pass(files("train"));
    return gpubox.evaluate(files("test"), false).metrics.auc;
  };
  const double one_card_auc = gpubox_auc(1);

  // Where the statistics sit (DenseParameters::add_statistic) and where they start.
  device::CardSet cards = device::CardSet::from_list("0");
  cards.card(0).activate();
  const DenseModel shape(cards.card(0), gpubox_cfg.dense_model_config());
  const std::size_t trained = shape.parameters().trained_size();
  const std::vector<float> initial = shape.parameters().values_to_host();
  for (const char* mode : {"async", "sync"}) {
    SCOPED_TRACE(mode);
    const TrainerConfig cfg = config(mode, GetParam());
    Servers shards(cfg, 1);
    TrainerEnv env;
    env.servers = shards.endpoints();
    PsTrainer trainer(cfg, env);
    for (int e = 0; e < kEpochs; ++e) trainer.train_pass(files("train"));
    const double auc = trainer.evaluate(files("test")).metrics.auc;
    const bool sync = std::string(mode) == "sync";
    const int reference_cards = sync ? trainer.threads() : 1;
    const double reference = reference_cards == 1 ? one_card_auc : gpubox_auc(reference_cards);
    std::printf(
        "dlrm (%s) with batch norm, %s (%d threads): test auc %.4f, gpubox mode on %d "
        "card(s) %.4f (behind by %.4f)\n",
        GetParam(), mode, trainer.threads(), auc, reference_cards, reference, reference - auc);
    // Trailing is what is guarded (one-sided): sync's bound 0.025 (at most 0.0015 behind two
    // cards seen on the CPU backend; kept until measured on CUDA, whose kernels round
    // differently); async's 0.035, with margin over what a loaded machine shows: at load ~9 in 20
    // runs the two-class output trailed one card by 0.0112 on average, 0.0193 at most, and the
    // logit reached 0.0251 once in 35 runs (a 0.025 bound failed ~1-3% of runs). Far ahead (never
    // seen: at most 0.0014, sync) would mean the reference or the comparison is off.
    const double behind = sync ? 0.025 : 0.035;
    EXPECT_GT(auc, reference - behind) << "behind the gpubox mode by more than " << behind;
    EXPECT_LT(auc, reference + 0.05) << "far ahead of the gpubox mode: is the reference off?";
    EXPECT_GT(auc, 0.65) << "the planted data is learnable: a constant predictor is 0.5";
    const std::vector<float> dense = trainer.dense_values();
    ASSERT_EQ(dense.size(), initial.size());
    std::size_t moved = 0;
    for (std::size_t k = trained; k < dense.size(); ++k) {
      EXPECT_TRUE(std::isfinite(dense[k])) << shape.parameters().describe(k);
      moved += dense[k] != initial[k];
    }
    EXPECT_GT(moved, (dense.size() - trained) / 2) << "the running statistics stayed put";
  }
  EXPECT_GT(one_card_auc, 0.7);
}

INSTANTIATE_TEST_SUITE_P(DlrmOutputs, PsBatchNormOutputs, ::testing::Values("logit", "softmax2"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

// Async with 8 threads exchanging every 10 steps: each thread moves its own copy of the running
// statistics toward its batches, and the servers must average those moves, not add them (added,
// the servers' statistics move 8 x (1 - 0.9^10) = 5.2 times the gap a window: when written a
// running variance ended at -4.9, another at 16). The batches' variances are not visible from
// outside the workers, so the weights are held still (learning rates 1e-12: every mode sees the
// same batches' statistics) and the reference is the sync mode's run of the same threads (its
// step averages every thread's change): each async running variance is within 20% of the sync
// one's (0.94-1.05x when written) and not below -0.01 (moves averaged from bases up to two
// windows stale can pass a target near 0 by a sliver: -7e-4 on a dead ReLU column when written;
// batch_norm.cu normalises a negative variance as 0).
TEST_F(PsBatchNorm, AsyncAveragesTheThreadsStatisticMoves) {
  std::vector<std::string> extra = kDlrmBn;
  extra.push_back("runner.thread_num=8");  // overrides kDlrmBn's
  extra.push_back("runner.dense_sync_steps=10");
  extra.push_back("runner.train_batch_size=32");
  for (const char* rate : {"optimizer.learning_rate", "sparse_optimizer.learning_rate",
                           "sparse_optimizer.mf_learning_rate"}) {
    extra.push_back(std::string("hyper_parameters.") + rate + "=1e-12");
  }
  device::CardSet cards = device::CardSet::from_list("0");
  cards.card(0).activate();
  const DenseModel shape(cards.card(0), ps_test_config(extra).dense_model_config());
  const DenseParameters& params = shape.parameters();
  auto train = [&](const std::string& mode) {
    std::vector<std::string> with_mode = extra;
    with_mode.push_back("runner.sync_mode=" + mode);
    const TrainerConfig cfg = ps_test_config(with_mode);
    Servers shards(cfg, 1);
    TrainerEnv env;
    env.servers = shards.endpoints();
    PsTrainer trainer(cfg, env);
    trainer.train_pass(files("train"));
    return trainer.dense_values();
  };
  const std::vector<float> async = train("async");
  const std::vector<float> sync = train("sync");
  ASSERT_EQ(async.size(), params.size());
  ASSERT_EQ(sync.size(), params.size());
  std::size_t variances = 0;
  for (std::size_t k = params.trained_size(); k < async.size(); ++k) {
    if (params.describe(k).find(".running_var[") == std::string::npos) continue;
    ++variances;
    EXPECT_GE(async[k], -0.01f) << params.describe(k);
    EXPECT_NEAR(async[k], sync[k], 0.2f * sync[k] + 0.01f) << params.describe(k);
  }
  EXPECT_EQ(variances, 16u + 5u + 128u + 64u);  // bot [16, 5], the top MLP's [128, 64]
}

// Issue 32: the sync mode's step on two threads is the gpubox mode's on two cards, the running
// statistics included: the threads' gradients and statistic changes summed over the job (the
// statistics' weighted by each thread's share of the job's batch, as the cards' all-reduce sums
// them) and one Adam step with the same moments on every thread (PsWorker::add_gradients), each
// key's row updated once a step (MergedPushes). Measured on the CPU backend, both outputs: after
// one step, and after a pass (313 steps of 64) with the rows held still (sparse learning rates
// 1e-12), the dense values are the cards' bit for bit (before: each thread's own Adam step,
// averaged). A pass with the rows learning ends 0.04-0.19 apart in a weight: the server's and the
// card's sparse rule round differently (1e-9 in a row after a step), and Adam turns gradients that
// are rounding noise (a bias before a batch norm has none: the norm removes any shift) into steps
// of about the learning rate; not bounded here.
TEST_P(PsBatchNormOutputs, SyncOnTwoThreadsStepsAsTheGpuboxModeOnTwoCards) {
  const int cards = device::testing::cards_here(2);
  constexpr int kBatch = 64;
  std::vector<std::string> extra = kDlrmBn;
  extra.push_back("runner.thread_num=" + std::to_string(cards));  // overrides kDlrmBn's
  extra.push_back("hyper_parameters.dlrm_output=" + std::string(GetParam()));
  extra.push_back("runner.train_batch_size=" + std::to_string(kBatch));
  const fs::path one_step = root_ / (std::string("one_step_") + GetParam());
  fs::create_directories(one_step);
  {
    std::ifstream in(files("train").at(0));
    std::ofstream out(one_step / "part-00000");
    std::string line;
    for (int i = 0; i < cards * kBatch && std::getline(in, line); ++i) out << line << "\n";
  }
  std::vector<std::string> with_sync = extra;
  with_sync.push_back("runner.sync_mode=sync");
  const TrainerConfig sync_cfg = ps_test_config(with_sync);
  device::CardSet shape_cards = device::CardSet::from_list("0");
  shape_cards.card(0).activate();
  const DenseModel shape(shape_cards.card(0), sync_cfg.dense_model_config());
  const std::size_t trained = shape.parameters().trained_size();
  for (const bool whole_pass : {false, true}) {
    SCOPED_TRACE(whole_pass ? "a pass, the rows held still" : "one step");
    const std::vector<std::string> pass =
        whole_pass ? files("train") : data_files(one_step.string());
    std::vector<std::string> held = {};
    if (whole_pass) {
      held = {"hyper_parameters.sparse_optimizer.learning_rate=1e-12",
              "hyper_parameters.sparse_optimizer.mf_learning_rate=1e-12"};
    }
    std::vector<std::string> sync_extra = with_sync;
    sync_extra.insert(sync_extra.end(), held.begin(), held.end());
    const TrainerConfig sync_pass_cfg = ps_test_config(sync_extra);
    Servers shards(sync_pass_cfg, 1);
    TrainerEnv sync_env;
    sync_env.servers = shards.endpoints();
    PsTrainer sync(sync_pass_cfg, sync_env);
    sync.train_pass(pass);
    const std::vector<float> synced = sync.dense_values();
    TrainerEnv env;
    env.selected_cards = device::testing::card_list(cards);
    env.threads_per_card = 1;
    std::vector<std::string> gpubox_extra = extra;
    gpubox_extra.insert(gpubox_extra.end(), held.begin(), held.end());
    Trainer gpubox(ps_test_config(gpubox_extra), env);
    gpubox.train_pass(pass);
    const std::vector<float> reference = gpubox.dense_values(0);
    ASSERT_EQ(synced.size(), reference.size());
    double weights = 0;
    double statistics = 0;
    for (std::size_t k = 0; k < synced.size(); ++k) {
      double& worst = k < trained ? weights : statistics;
      worst = std::max(worst, std::fabs(static_cast<double>(synced[k]) - reference[k]));
    }
    std::printf(
        "dlrm (%s) with batch norm, %s: sync on %d threads against the gpubox mode on %d "
        "cards: weights differ by at most %.3g, running statistics by %.3g\n",
        GetParam(), whole_pass ? "a pass, the rows held still" : "one step", cards, cards, weights,
        statistics);
    EXPECT_LT(weights, 1e-6);
    EXPECT_LT(statistics, 1e-6);
  }
}

TEST_F(PsBatchNorm, GeoIsRefusedNamingBothKeys) {
  try {
    config("geo");
    ADD_FAILURE() << "geo with batch norm loaded";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("hyper_parameters.dnn_batch_norm is not built for runner.sync_mode geo"),
              std::string::npos)
        << what;
  }
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
