// The parameter-server modes (runner.sync_mode async | sync | geo) against gpubox_server shards
// on loopback (in-process servers over in-process tables): each mode learns the planted model,
// 1 trainer in sync mode matches the gpubox mode's single card, geo with geo_step 1 matches
// sync, 2 trainers x 2 servers train in every mode, and a dead server or trainer ends the job
// with an error naming it, within its timeout.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "common/status.hpp"
#include "dataset/generator.hpp"
#include "table/server/remote_host_tier.hpp"
#include "table/server/server.hpp"
#include "table/sparse_row/optimizer.hpp"
#include "table/sparse_table.hpp"
#include "tests/dataset/planted_data.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"
#include "trainer/ps_modes/geo_rows.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/ps_modes/ps_worker.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

namespace fs = std::filesystem;

constexpr int kEpochs = 3;
// Issue 16: each mode's test AUC within 0.02 of the planted model's.
constexpr double kPlantedTolerance = 0.02;
// ffm learns its 11 x 2 factors a key slowly: 0.688 after 3 epochs in Collective mode when written
// (planted 0.761; async, sync and geo 0.72-0.73; it approaches the planted model after 15
// epochs: planted_models_test).
constexpr double kFfmAuc = 0.66;

class PsModes : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("gpubox_ps_modes_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    dataset::OracleSummary oracle;
    gpubox::testing::write_planted_train_test(root_, &oracle);
    planted_auc_ = oracle.auc;
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // config_gpubox.yaml sized to the data (as held_out_quality_test), plus `extra`.
  static TrainerConfig config(const std::vector<std::string>& extra) {
    return ps_test_config(extra);
  }

  struct Outcome {
    double test_auc = 0;
    std::vector<float> dense;  // trainer 0's, after training
  };

  // `trainers` PsTrainers (threads of this process) of one job against `servers`: each runs
  // `body(trainer, id)`; once all are done, `finish(trainer 0)` gives the result. Every
  // trainer's error is reported.
  template <typename Body, typename Finish>
  static auto run_job(const TrainerConfig& cfg, const std::string& servers, int trainers, Body body,
                      Finish finish) -> decltype(finish(std::declval<PsTrainer&>())) {
    std::vector<std::unique_ptr<PsTrainer>> made(static_cast<std::size_t>(trainers));
    std::vector<std::string> errors(static_cast<std::size_t>(trainers));
    std::vector<std::thread> threads;
    for (int w = 0; w < trainers; ++w) {
      threads.emplace_back([&, w] {
        try {
          TrainerEnv env;
          env.servers = servers;
          env.trainer_id = w;
          env.trainers = trainers;
          auto trainer = std::make_unique<PsTrainer>(cfg, env);
          body(*trainer, w);
          made[static_cast<std::size_t>(w)] = std::move(trainer);
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(w)] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int w = 0; w < trainers; ++w) {
      EXPECT_EQ(errors[static_cast<std::size_t>(w)], "") << "trainer " << w;
    }
    if (!made[0]) return {};
    return finish(*made[0]);
  }
  static double test_auc(PsTrainer& trainer) {
    return trainer.evaluate(data_files((root_ / "test").string())).metrics.auc;
  }

  // `trainers` PsTrainers against `servers` fresh shards, `passes` passes over the training
  // files; trainer 0's test AUC afterwards.
  static Outcome run(const std::vector<std::string>& extra, int trainers, int servers,
                     int passes = kEpochs) {
    const TrainerConfig cfg = config(extra);
    Servers shards(cfg, servers);
    const auto train = data_files((root_ / "train").string());
    return run_job(
        cfg, shards.endpoints(), trainers,
        [&](PsTrainer& trainer, int) {
          for (int e = 0; e < passes; ++e) trainer.train_pass(train);
        },
        [](PsTrainer& trainer) {
          return Outcome{test_auc(trainer), trainer.dense_values()};
        });
  }

  static double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    double worst = 0;
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
    }
    return worst;
  }

  // Issue 32: a network (`network`: its overrides; `name` for the output) whose parameters sit in
  // the dense table like any dense block, in every PS mode: async and geo learn what the gpubox
  // mode's single card learns (reaching `min_auc`); 1 trainer in sync mode with SGD ends at the
  // gpubox mode's dense weights up to rounding (`dense_tolerance`), and its save evaluates the
  // same in the gpubox mode.
  static void network_in_every_mode_and_through_a_save(const std::string& name,
                                                       const std::vector<std::string>& network,
                                                       double min_auc,
                                                       double dense_tolerance = 1e-4) {
    auto with = [&](std::vector<std::string> extra) {
      extra.insert(extra.end(), network.begin(), network.end());
      return extra;
    };
    const auto train = data_files((root_ / "train").string());
    const auto test = data_files((root_ / "test").string());
    TrainerEnv env;
    env.threads_per_card = 1;
    auto gpubox_auc = [&](const std::vector<std::string>& extra, std::vector<float>* dense) {
      Trainer gpubox(config(with(extra)), env);
      for (int e = 0; e < kEpochs; ++e) gpubox.train_pass(train);
      if (dense != nullptr) *dense = gpubox.dense_values(0);
      return gpubox.evaluate(test, false).metrics.auc;
    };
    const double adam_auc = gpubox_auc({}, nullptr);
    for (const char* mode : {"async", "geo"}) {
      SCOPED_TRACE(mode);
      const Outcome out =
          run(with({std::string("runner.sync_mode=") + mode, "runner.geo_step=4"}), 1, 1);
      std::printf("%s %s: test auc %.6f, gpubox mode %.6f\n", name.c_str(), mode, out.test_auc,
                  adam_auc);
      EXPECT_NEAR(out.test_auc, adam_auc, kPlantedTolerance);
    }
    EXPECT_GT(adam_auc, min_auc);
    const std::string saves = (root_ / (name + "_saves")).string();
    const std::string sgd = "hyper_parameters.optimizer.class=SGD";
    const TrainerConfig sync_cfg =
        config(with({"runner.sync_mode=sync", "runner.model_save_path=" + saves,
                     "runner.save_mode=base", sgd}));
    Outcome sync;
    {
      Servers shards(sync_cfg, 1);
      sync = run_job(
          sync_cfg, shards.endpoints(), 1,
          [&](PsTrainer& trainer, int) {
            for (int e = 0; e < kEpochs; ++e) trainer.train_pass(train);
            trainer.save(saves + "/0");
          },
          [](PsTrainer& trainer) {
            return Outcome{test_auc(trainer), trainer.dense_values()};
          });
    }
    std::vector<float> gpubox_dense;
    const double sgd_auc = gpubox_auc({sgd}, &gpubox_dense);
    Trainer loaded(config(with({sgd})), env);
    loaded.load(saves + "/0");
    const double loaded_auc = loaded.evaluate(test, false).metrics.auc;
    const double dense_diff = max_abs_diff(sync.dense, gpubox_dense);
    std::printf(
        "%s sync (SGD): test auc %.6f (gpubox mode %.6f, its save there %.6f), dense "
        "weights differ by at most %.3g\n",
        name.c_str(), sync.test_auc, sgd_auc, loaded_auc, dense_diff);
    EXPECT_NEAR(sync.test_auc, sgd_auc, 1e-3);
    EXPECT_LT(dense_diff, dense_tolerance);
    EXPECT_NEAR(loaded_auc, sync.test_auc, 1e-5);
  }

  static fs::path root_;
  static double planted_auc_;
};
fs::path PsModes::root_;
double PsModes::planted_auc_ = 0;

TEST_F(PsModes, AsyncLearnsThePlantedModel) {
  const Outcome async = run({"runner.sync_mode=async", "runner.thread_num=2"}, 1, 1);
  EXPECT_NEAR(async.test_auc, planted_auc_, kPlantedTolerance);
  std::printf("async test auc %.6f, planted %.6f\n", async.test_auc, planted_auc_);
}

// The async mode's dense exchange losing no window: ps_pipeline_test (a thread's steps whose
// rows are pulled serially, its exchanges against its in-place syncs; the PS trainer's async
// steps pull the next batch's rows ahead, so they no longer end where the sync mode ends).

TEST_F(PsModes, SyncWithOneTrainerMatchesTheGpuboxModeOnOneCard) {
  // The gpubox mode on one card takes the same batches, the same sparse rule per key per batch
  // and the same dense step; what differs is the order of float sums (the per-key merge) and
  // one rounding per dense sync (the servers' table adds the step's change). With Adam those
  // differences grow: a near-zero gradient's sign decides a step of about the learning rate.
  // So: Adam's held-out AUC agrees closely, and with SGD the dense weights agree to rounding.
  for (const char* optimizer : {"Adam", "SGD"}) {
    SCOPED_TRACE(optimizer);
    const std::string dense_optimizer =
        std::string("hyper_parameters.optimizer.class=") + optimizer;
    const Outcome sync = run({"runner.sync_mode=sync", dense_optimizer}, 1, 1);
    const TrainerConfig cfg = config({dense_optimizer});
    TrainerEnv env;
    env.threads_per_card = 1;
    Trainer gpubox(cfg, env);
    const auto train = data_files((root_ / "train").string());
    for (int e = 0; e < kEpochs; ++e) gpubox.train_pass(train);
    const double gpubox_auc =
        gpubox.evaluate(data_files((root_ / "test").string()), false).metrics.auc;
    const double dense_diff = max_abs_diff(sync.dense, gpubox.dense_values(0));
    std::printf("%s: sync test auc %.6f, gpubox %.6f; dense weights differ by at most %.3g\n",
                optimizer, sync.test_auc, gpubox_auc, dense_diff);
    EXPECT_NEAR(sync.test_auc, gpubox_auc, 1e-3);
    if (std::string(optimizer) == "SGD") {
      EXPECT_LT(dense_diff, 1e-4);
    }
  }
}

TEST_F(PsModes, GeoWithGeoStepOneEqualsSync) {
  const Outcome sync = run({"runner.sync_mode=sync"}, 1, 1);
  const Outcome geo = run({"runner.sync_mode=geo", "runner.geo_step=1"}, 1, 1);
  std::printf("geo_step 1: test auc %.6f, sync %.6f; dense weights differ by at most %.3g\n",
              geo.test_auc, sync.test_auc, max_abs_diff(geo.dense, sync.dense));
  EXPECT_NEAR(geo.test_auc, sync.test_auc, 1e-4);
  EXPECT_LT(max_abs_diff(geo.dense, sync.dense), 1e-4);
}

// Geo averages the trainers' moves at each sync (as Paddle's geo does), so two trainers move the
// model about as far per pass as one: it gets twice the passes to reach the planted AUC.
TEST_F(PsModes, TwoTrainersOnTwoServersInEveryMode) {
  for (const char* mode : {"async", "sync", "geo"}) {
    SCOPED_TRACE(mode);
    const int passes = std::string(mode) == "geo" ? 2 * kEpochs : kEpochs;
    const Outcome out =
        run({std::string("runner.sync_mode=") + mode, "runner.geo_step=4"}, 2, 2, passes);
    std::printf("%s, 2 trainers x 2 servers: test auc %.6f, planted %.6f\n", mode, out.test_auc,
                planted_auc_);
    EXPECT_NEAR(out.test_auc, planted_auc_, kPlantedTolerance);
  }
}

// xdeepfm: its CIN's and dense embeddings' parameters (its quality against the dnn's:
// planted_models_test).
TEST_F(PsModes, XdeepfmInEveryModeAndThroughASave) {
  network_in_every_mode_and_through_a_save(
      "xdeepfm", {"hyper_parameters.model=xdeepfm", "hyper_parameters.layer_sizes_cin=[16, 8]"},
      0.68);
}

// autoint: its interacting layers' projections, LayerNorms and dense embeddings (its quality
// against fm's and the dnn's: planted_models_test), without a DNN as PaddleRec's config.yaml. It
// learns this data slower than xdeepfm in 3 epochs (0.627 when written, async 0.628, geo 0.628),
// and the LayerNorms' 1 / std amplifies the two modes' different summation orders: the sync job's
// dense weights ended 1.7e-4 from the gpubox mode's, its test AUC 1e-4 from it.
TEST_F(PsModes, AutointInEveryModeAndThroughASave) {
  network_in_every_mode_and_through_a_save(
      "autoint",
      {"hyper_parameters.model=autoint", "hyper_parameters.attn_layer_sizes=[8, 8]",
       "hyper_parameters.fc_sizes=[]"},
      0.6, 1e-3);
}

// ffm (one factor per field in every row: 8 slots + 3 dense features, factors of 2) in every PS
// mode, 2 trainers on 2 servers: the servers keep rows of the trainers' width (the handshake
// compares them) and every mode learns (geo with twice the passes, as above).
TEST_F(PsModes, FfmTrainsInEveryMode) {
  // An FM's factors start wider than the default, as for fm (planted_models_test).
  const std::vector<std::string> ffm = {"hyper_parameters.model=ffm",
                                        "hyper_parameters.sparse_feature_dim=3",
                                        "hyper_parameters.sparse_optimizer.embedx_threshold=0",
                                        "hyper_parameters.sparse_optimizer.mf_initial_range=0.01",
                                        "hyper_parameters.sparse_optimizer.mf_learning_rate=0.03",
                                        "hyper_parameters.optimizer.learning_rate=0.01"};
  EXPECT_EQ(config(ffm).mf_dim(), (8 + 3) * 2);
  for (const char* mode : {"async", "sync", "geo"}) {
    SCOPED_TRACE(mode);
    const int passes = std::string(mode) == "geo" ? 2 * kEpochs : kEpochs;
    std::vector<std::string> extra = ffm;
    extra.push_back(std::string("runner.sync_mode=") + mode);
    extra.push_back("runner.geo_step=4");
    const Outcome out = run(extra, 2, 2, passes);
    std::printf("ffm %s, 2 trainers x 2 servers: test auc %.6f, planted %.6f\n", mode, out.test_auc,
                planted_auc_);
    EXPECT_GT(out.test_auc, kFfmAuc);
  }
}

// deepfefm (its field-pair matrices and dense vectors in the dense table with the dnn) in every
// PS mode, 2 trainers on 2 servers: every mode learns (geo with twice the passes, as above).
TEST_F(PsModes, DeepFefmTrainsInEveryMode) {
  const std::vector<std::string> deepfefm = {"hyper_parameters.model=deepfefm",
                                             "hyper_parameters.fc_sizes=[32, 16]"};
  for (const char* mode : {"async", "sync", "geo"}) {
    SCOPED_TRACE(mode);
    const int passes = std::string(mode) == "geo" ? 2 * kEpochs : kEpochs;
    std::vector<std::string> extra = deepfefm;
    extra.push_back(std::string("runner.sync_mode=") + mode);
    extra.push_back("runner.geo_step=4");
    const Outcome out = run(extra, 2, 2, passes);
    std::printf("deepfefm %s, 2 trainers x 2 servers: test auc %.6f, planted %.6f\n", mode,
                out.test_auc, planted_auc_);
    EXPECT_GT(out.test_auc, 0.68);
  }
}

// flen (its groups' bi-interaction beside the dnn in the dense table, PaddleRec's dense Adagrad)
// in every PS mode, 2 trainers on 2 servers: every mode learns (geo with twice the passes).
TEST_F(PsModes, FlenTrainsInEveryMode) {
  const std::vector<std::string> flen = {
      "hyper_parameters.model=flen", "hyper_parameters.field_group_sizes=[3, 3, 2]",
      "hyper_parameters.fc_sizes=[32, 16]", "hyper_parameters.optimizer.class=Adagrad",
      "hyper_parameters.optimizer.learning_rate=0.01"};
  for (const char* mode : {"async", "sync", "geo"}) {
    SCOPED_TRACE(mode);
    const int passes = std::string(mode) == "geo" ? 2 * kEpochs : kEpochs;
    std::vector<std::string> extra = flen;
    extra.push_back(std::string("runner.sync_mode=") + mode);
    extra.push_back("runner.geo_step=4");
    const Outcome out = run(extra, 2, 2, passes);
    std::printf("flen %s, 2 trainers x 2 servers: test auc %.6f, planted %.6f\n", mode,
                out.test_auc, planted_auc_);
    EXPECT_GT(out.test_auc, 0.68);
  }
}

// fat_deepffm (ffm's rows: 8 slots + 3 dense features, factors of 2; CEN's layers, dense vectors
// and DNN in the dense table) in every PS mode, 2 trainers on 2 servers: the servers keep rows of
// the trainers' width and every mode learns (geo with twice the passes, as above).
TEST_F(PsModes, FatDeepffmTrainsInEveryMode) {
  const std::vector<std::string> fat = {"hyper_parameters.model=fat_deepffm",
                                        "hyper_parameters.layer_sizes_dnn=[32, 16]",
                                        "hyper_parameters.sparse_feature_dim=3",
                                        "hyper_parameters.sparse_optimizer.embedx_threshold=0",
                                        "hyper_parameters.sparse_optimizer.mf_initial_range=0.01",
                                        "hyper_parameters.sparse_optimizer.mf_learning_rate=0.03"};
  EXPECT_EQ(config(fat).mf_dim(), (8 + 3) * 2);
  for (const char* mode : {"async", "sync", "geo"}) {
    SCOPED_TRACE(mode);
    const int passes = std::string(mode) == "geo" ? 2 * kEpochs : kEpochs;
    std::vector<std::string> extra = fat;
    extra.push_back(std::string("runner.sync_mode=") + mode);
    extra.push_back("runner.geo_step=4");
    const Outcome out = run(extra, 2, 2, passes);
    std::printf("fat_deepffm %s, 2 trainers x 2 servers: test auc %.6f, planted %.6f\n", mode,
                out.test_auc, planted_auc_);
    // When written: async 0.728, sync 0.734, geo 0.738 (planted 0.761).
    EXPECT_GT(out.test_auc, 0.70);
  }
}

// Issue 17: slot_dims (widths 4, 16 and 2 beside the default 8) in every PS mode, 2 trainers on
// 2 servers: the rows travel at their own widths (protocol 4), each server keeps every row at its
// slot's width, the model learns, and an async job's save loads into another PS job exactly.
TEST_F(PsModes, MixedWidthsInEveryModeAndThroughASave) {
  const std::string mixed = "hyper_parameters.slot_dims={1: 4, 2: 16, 5: 2}";
  const auto train = data_files((root_ / "train").string());
  for (const char* mode : {"async", "sync", "geo"}) {
    SCOPED_TRACE(mode);
    const TrainerConfig cfg =
        config({mixed, std::string("runner.sync_mode=") + mode, "runner.geo_step=4"});
    Servers shards(cfg, 2);
    const double auc = run_job(
        cfg, shards.endpoints(), 2, [&](PsTrainer& trainer, int) { trainer.train_pass(train); },
        test_auc);
    std::printf("%s with slot_dims, 2 trainers x 2 servers, 1 pass: test auc %.6f\n", mode, auc);
    EXPECT_GT(auc, 0.6);
    std::map<int32_t, std::size_t> per_width;
    for (int i = 0; i < 2; ++i) {
      const table::RowLayout record = shards.table(i).layout();
      throw_if_error(shards.table(i).for_each_row([&](uint64_t key, const float* row) {
        const table::RowLayout own = record.of_row(row);
        EXPECT_EQ(own.mf_dim, table::slot_mf_dim(cfg.sparse, static_cast<int32_t>(row[own.slot()])))
            << "key " << key;
        ++per_width[own.mf_dim];
      }));
    }
    EXPECT_EQ(per_width.size(), 4u);
  }
  const std::string saves = (root_ / "mixed_saves").string();
  const TrainerConfig writer =
      config({mixed, "runner.sync_mode=async", "runner.save_mode=checkpoint",
              "runner.train_data_dir=" + (root_ / "train").string(),
              "runner.test_data_dir=", "runner.model_save_path=" + saves});
  double saved_auc = 0;
  {
    Servers shards(writer, 2);
    saved_auc = run_job(
        writer, shards.endpoints(), 2,
        [](PsTrainer& trainer, int) { EXPECT_EQ(trainer.train().size(), 1u); }, test_auc);
  }
  const TrainerConfig reader = config({mixed, "runner.sync_mode=async"});
  Servers shards(reader, 2);
  const double auc = run_job(
      reader, shards.endpoints(), 1, [&](PsTrainer& trainer, int) { trainer.load(saves + "/0"); },
      test_auc);
  EXPECT_EQ(auc, saved_auc);
}

// Issue 16: a pass's last dense window shorter than runner.dense_sync_steps (geo: geo_step) is
// on the servers after the pass, so a save or an evaluation has it. The oracle: trainer 0's dense
// net after the pass equals the servers' dense table (evaluate adopts it), exactly where every
// change of the net reached the table (sync: after its last barrier, with two trainers of two
// threads; async and geo: one thread, the table's only writer).
TEST_F(PsModes, APassesLastPartialDenseWindowReachesTheServers) {
  constexpr int kWindow = 7;
  for (const char* mode : {"sync", "async", "geo"}) {
    SCOPED_TRACE(mode);
    const bool sync = std::string(mode) == "sync";
    const int trainers = sync ? 2 : 1;
    const TrainerConfig cfg = config({std::string("runner.sync_mode=") + mode,
                                      "runner.thread_num=" + std::to_string(trainers),
                                      "runner.dense_sync_steps=" + std::to_string(kWindow),
                                      "runner.geo_step=" + std::to_string(kWindow)});
    Servers shards(cfg, 2);
    const auto train = data_files((root_ / "train").string());
    double steps = 0;
    run_job(
        cfg, shards.endpoints(), trainers,
        [&](PsTrainer& trainer, int id) {
          const PassReport report = trainer.train_pass(train);
          if (id != 0) return;
          for (const auto& [name, value] : report.extra) {
            if (name == "steps") steps = value;
          }
        },
        [&](PsTrainer& trainer) {
          const std::vector<float> trained = trainer.dense_values();
          trainer.evaluate(data_files((root_ / "test").string()));
          const std::vector<float> on_servers = trainer.dense_values();
          EXPECT_EQ(max_abs_diff(trained, on_servers), 0.0);
          return 0;
        });
    // The pass ends inside a window (else this test would not test it).
    EXPECT_NE(static_cast<long long>(steps) % kWindow, 0) << "steps " << steps;
  }
}

// Geo with two trainers that both create the embedx part of the same rows (each on its own
// first touch, before the other synced): the servers hold the key's initial values once plus
// the average of the trainers' changes of them (each delta scaled by 1 / 2, as Paddle's geo
// scales by 1 / trainers; the oracle in float64 from the two local copies), not the initial
// values once per trainer; show and click add up.
TEST_F(PsModes, GeoCountsTheInitialValuesOfAPartTwoTrainersCreatedOnce) {
  const TrainerConfig cfg =
      config({"runner.sync_mode=geo", "hyper_parameters.sparse_optimizer.mf_initial_range=0.5",
              "hyper_parameters.sparse_optimizer.embedx_threshold=1",
              "hyper_parameters.sparse_optimizer.embed_threshold=0"});
  Servers shards(cfg, 2);
  auto connect = [&] {
    table::server::RemoteHostTierOptions options;
    options.endpoints = shards.endpoints();
    options.config = cfg.sparse;
    auto client = table::server::RemoteHostTier::connect(std::move(options));
    throw_if_error(client.status());
    return std::move(client).value();
  };
  auto client_a = connect();
  auto client_b = connect();
  GeoRows trainer_a(*client_a), trainer_b(*client_b);
  const table::RowLayout& layout = client_a->layout();
  const auto stride = static_cast<std::size_t>(layout.stride());
  const auto push_dim = static_cast<std::size_t>(layout.push_dim());
  const auto mf = static_cast<std::size_t>(layout.mf_dim);
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; k <= 17; ++k) keys.push_back(k * 7919);
  const std::vector<int32_t> slots(keys.size(), 2);
  const std::size_t n = keys.size();
  std::vector<float> rows_a(n * stride), rows_b(n * stride);
  std::vector<uint32_t> locals_a(n), locals_b(n);
  // Neither has embedx yet.
  trainer_a.read(keys.data(), slots.data(), n, rows_a.data(), locals_a.data());
  trainer_b.read(keys.data(), slots.data(), n, rows_b.data(), locals_b.data());
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> grad(-1.0f, 1.0f);
  for (int step = 0; step < 3; ++step) {  // the first step creates embedx (score 1 per click)
    for (auto [trainer, locals] :
         {std::make_pair(&trainer_a, &locals_a), std::make_pair(&trainer_b, &locals_b)}) {
      std::vector<float> push(n * push_dim);
      for (std::size_t i = 0; i < n; ++i) {
        push[i * push_dim] = 1.0f;      // show
        push[i * push_dim + 1] = 1.0f;  // click
        for (std::size_t f = 2; f < push_dim; ++f) push[i * push_dim + f] = grad(rng);
      }
      trainer->apply(locals->data(), n, push.data());
    }
  }
  trainer_a.read(keys.data(), slots.data(), n, rows_a.data(), locals_a.data());
  trainer_b.read(keys.data(), slots.data(), n, rows_b.data(), locals_b.data());
  trainer_a.sync(0.5f);
  trainer_b.sync(0.5f);
  std::vector<float> merged(n * stride);
  ASSERT_TRUE(client_a->pull(keys.data(), slots.data(), n, merged.data(), nullptr).ok());
  std::vector<float> initial(stride, 0.0f);
  for (std::size_t i = 0; i < n; ++i) {
    SCOPED_TRACE(keys[i]);
    const float* a = rows_a.data() + i * stride;
    const float* b = rows_b.data() + i * stride;
    const float* m = merged.data() + i * stride;
    ASSERT_GT(a[layout.mf_size()], 0.0f);
    ASSERT_GT(b[layout.mf_size()], 0.0f);
    ASSERT_GT(m[layout.mf_size()], 0.0f);
    EXPECT_EQ(m[table::RowLayout::kShow], a[table::RowLayout::kShow] + b[table::RowLayout::kShow]);
    table::create_embedx(initial.data(), layout, cfg.sparse, keys[i]);
    for (std::size_t f = 0; f < mf; ++f) {
      const auto at = static_cast<std::size_t>(layout.embedx_w()) + f;
      const double start = initial[at];
      const double expected = start + 0.5 * (a[at] - start) + 0.5 * (b[at] - start);
      EXPECT_NEAR(m[at], expected, 1e-5) << "embedx " << f << " (initial value " << start << ")";
    }
  }
}

// Issue 16: a PS save (2 trainers x 2 servers) is the gpubox mode's save: it starts a PS job on
// fresh servers and the gpubox mode (both evaluate the same model as the job that saved it),
// and a gpubox-mode save (on 2 servers) starts a 2-trainer PS job the same way. The model is
// the servers' rows and dense table, so the AUCs agree to float rounding of the two forward
// paths; PS to PS to the bit.
TEST_F(PsModes, SavesLoadBetweenThePsModesAndTheGpuboxMode) {
  const auto test = data_files((root_ / "test").string());
  const std::string ps_saves = (root_ / "ps_saves").string();
  const std::vector<std::string> common = {"runner.train_data_dir=" + (root_ / "train").string(),
                                           "runner.test_data_dir=", "runner.save_mode=base"};
  std::vector<std::string> ps_keys = common;
  ps_keys.insert(ps_keys.end(), {"runner.sync_mode=async", "runner.model_save_path=" + ps_saves});
  const TrainerConfig ps_cfg = config(ps_keys);
  double saved_auc = 0;
  {
    Servers shards(ps_cfg, 2);
    saved_auc = run_job(
        ps_cfg, shards.endpoints(), 2,
        [](PsTrainer& trainer, int) { EXPECT_EQ(trainer.train().size(), 1u); }, test_auc);
  }
  const std::string ps_save = ps_saves + "/0";
  ASSERT_TRUE(fs::exists(ps_save + "/MODEL_MANIFEST"));
  const TrainerConfig reader_cfg = config({"runner.sync_mode=async"});
  {
    Servers shards(reader_cfg, 2);
    const double auc = run_job(
        reader_cfg, shards.endpoints(), 1, [&](PsTrainer& trainer, int) { trainer.load(ps_save); },
        test_auc);
    std::printf("PS save: test auc %.6f when saved, %.6f loaded by a PS job\n", saved_auc, auc);
    EXPECT_EQ(auc, saved_auc);
  }
  const TrainerConfig gpubox_cfg = config(common);
  {
    Servers shards(gpubox_cfg, 2);
    TrainerEnv env;
    env.servers = shards.endpoints();
    env.threads_per_card = 1;
    Trainer gpubox(gpubox_cfg, env);
    gpubox.load(ps_save);
    const double auc = gpubox.evaluate(test, false).metrics.auc;
    std::printf("PS save: test auc %.6f loaded by the gpubox mode\n", auc);
    EXPECT_NEAR(auc, saved_auc, 1e-5);
  }
  // The other way: a gpubox-mode save starts a PS job of 2 trainers.
  const std::string gpubox_save = (root_ / "gpubox_save").string();
  double gpubox_auc = 0;
  {
    Servers shards(gpubox_cfg, 2);
    TrainerEnv env;
    env.servers = shards.endpoints();
    env.threads_per_card = 1;
    Trainer gpubox(gpubox_cfg, env);
    gpubox.train_pass(data_files((root_ / "train").string()));
    gpubox.save(gpubox_save);
    gpubox_auc = gpubox.evaluate(test, false).metrics.auc;
  }
  {
    Servers shards(reader_cfg, 2);
    const double auc = run_job(
        reader_cfg, shards.endpoints(), 2,
        [&](PsTrainer& trainer, int) { trainer.load(gpubox_save); }, test_auc);
    std::printf("gpubox save: test auc %.6f, loaded by a PS job of 2 trainers %.6f\n", gpubox_auc,
                auc);
    EXPECT_NEAR(auc, gpubox_auc, 1e-5);
  }
}

// A PS job stopped after its first pass and run again (on fresh servers: they died too) goes on
// from its save (save_mode checkpoint: with the rows' optimizer state) with the passes after
// it, every trainer alike, and learns the planted model; a job that has all its passes trains
// none. A save made with another number of servers is refused naming both counts.
TEST_F(PsModes, AStoppedJobResumesFromItsLastSave) {
  const std::string saves = (root_ / "resume_saves").string();
  std::vector<std::string> keys = {"runner.train_data_dir=" + (root_ / "train").string(),
                                   "runner.test_data_dir=", "runner.sync_mode=async",
                                   "runner.save_mode=checkpoint",
                                   "runner.model_save_path=" + saves};
  const auto passes_of = [](const std::vector<PassReport>& reports) {
    std::vector<int64_t> out;
    for (const PassReport& r : reports) out.push_back(r.pass);
    return out;
  };
  {
    const TrainerConfig first = config(keys);  // runner.epochs=1: "killed" after pass 0 of 3
    Servers shards(first, 2);
    run_job(
        first, shards.endpoints(), 2,
        [&](PsTrainer& trainer, int) {
          EXPECT_EQ(passes_of(trainer.train()), (std::vector<int64_t>{0}));
        },
        [](PsTrainer&) { return 0; });
  }
  keys.push_back("runner.epochs=3");
  const TrainerConfig again = config(keys);
  {
    Servers shards(again, 2);
    const double auc = run_job(
        again, shards.endpoints(), 2,
        [&](PsTrainer& trainer, int) {
          EXPECT_EQ(passes_of(trainer.train()), (std::vector<int64_t>{1, 2}));
        },
        test_auc);
    std::printf("resumed async job: test auc %.6f, planted %.6f\n", auc, planted_auc_);
    EXPECT_NEAR(auc, planted_auc_, kPlantedTolerance);
    EXPECT_TRUE(fs::exists(saves + "/2/MODEL_MANIFEST"));
  }
  {  // The job with another number of trainers is another job: refused, naming it.
    Servers shards(again, 2);
    TrainerEnv env;
    env.servers = shards.endpoints();
    PsTrainer one_trainer(again, env);
    try {
      one_trainer.train();
      ADD_FAILURE() << "a save of a 2-trainer job resumed by 1 trainer";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("is of another job than this one: trainers: saved 2, "
                                           "now 1"),
                std::string::npos)
          << e.what();
    }
  }
  Servers one(again, 1);
  TrainerEnv env;
  env.servers = one.endpoints();
  PsTrainer trainer(again, env);
  try {
    trainer.load(saves + "/2");
    ADD_FAILURE() << "a save of 2 servers loaded into 1";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 part(s)"), std::string::npos) << e.what();
  }
}

// A relative runner.model_save_path names a folder under the trainer's working directory; the
// servers (--data_dir: its parent here) must write the sparse halves there too, where the
// resume looks (they resolved relative names inside their data_dir: the halves landed in
// <data_dir>/<model_save_path> and the resume found none).
TEST_F(PsModes, ARelativeSavePathResumes) {
  const fs::path work = root_ / "relative_cwd";
  fs::create_directories(work);
  const fs::path cwd = fs::current_path();
  fs::current_path(work);
  std::vector<std::string> keys = {"runner.train_data_dir=" + (root_ / "train").string(),
                                   "runner.test_data_dir=", "runner.sync_mode=async",
                                   "runner.save_mode=checkpoint",
                                   "runner.model_save_path=relative_saves"};
  try {
    {
      const TrainerConfig first = config(keys);
      Servers shards(first, 1, root_.string());
      run_job(
          first, shards.endpoints(), 1, [](PsTrainer& trainer, int) { trainer.train(); },
          [](PsTrainer&) { return 0; });
    }
    EXPECT_TRUE(fs::is_directory(work / "relative_saves" / "0" / "sparse"));
    keys.push_back("runner.epochs=2");
    const TrainerConfig again = config(keys);
    Servers shards(again, 1, root_.string());
    run_job(
        again, shards.endpoints(), 1,
        [](PsTrainer& trainer, int) {
          const std::vector<PassReport> reports = trainer.train();
          ASSERT_EQ(reports.size(), 1u);
          EXPECT_EQ(reports[0].pass, 1);
        },
        [](PsTrainer&) { return 0; });
  } catch (...) {
    fs::current_path(cwd);
    throw;
  }
  fs::current_path(cwd);
}

// A second job on the same servers, with another number of trainers (sync mode: its tables
// are per trainer) and another dense net, starts from its own initial values: the servers'
// tables of the first job are replaced at its start.
TEST_F(PsModes, ASecondJobOnTheSameServersStartsAfresh) {
  const TrainerConfig two = config({"runner.sync_mode=sync"});
  Servers shards(two, 1);
  const auto train = data_files((root_ / "train").string());
  run_job(
      two, shards.endpoints(), 2, [&](PsTrainer& trainer, int) { trainer.train_pass(train); },
      [](PsTrainer&) { return 0; });
  const TrainerConfig other =
      config({"runner.sync_mode=sync", "hyper_parameters.fc_sizes=[32]", "runner.epochs=1"});
  std::vector<float> initial;
  run_job(
      other, shards.endpoints(), 3,
      [&](PsTrainer& trainer, int id) {
        if (id == 0) initial = trainer.dense_values();  // as this job starts
        trainer.train_pass(train);
      },
      [](PsTrainer&) { return 0; });
  TrainerEnv env;
  env.servers = "";
  Trainer fresh(other, env);  // the same config's initial dense net, in-process
  EXPECT_EQ(initial, fresh.dense_values(0));
}

// runner.reader_type QueueDataset streams each pass (the sync mode reads it once more to count
// its batches): with one training thread and no shuffle the batches and their order are
// InmemoryDataset's, so every mode ends with the same model bit for bit; two trainers in sync
// mode (the count agreed over the job from each trainer's scan) still learn the planted model.
TEST_F(PsModes, QueueDatasetReachesInMemoryDatasetsModelInEveryMode) {
  for (const char* mode : {"async", "sync", "geo"}) {
    SCOPED_TRACE(mode);
    const std::vector<std::string> base = {std::string("runner.sync_mode=") + mode,
                                           "runner.geo_step=4"};
    std::vector<std::string> queued = base;
    queued.push_back("runner.reader_type=QueueDataset");
    const Outcome held = run(base, 1, 1);
    const Outcome streamed = run(queued, 1, 1);
    std::printf("%s: QueueDataset test auc %.6f, InmemoryDataset %.6f\n", mode, streamed.test_auc,
                held.test_auc);
    EXPECT_EQ(streamed.test_auc, held.test_auc);
    EXPECT_EQ(streamed.dense, held.dense);
  }
  const Outcome two = run({"runner.sync_mode=sync", "runner.reader_type=QueueDataset"}, 2, 2);
  EXPECT_NEAR(two.test_auc, planted_auc_, kPlantedTolerance);
}

// The gpubox mode with QueueDataset: each pass read once for its keys (begin_pass), then
// streamed to the cards; on two cards, with runner.prefetch_passes off and on (the next pass's
// keys read and its rows staged ahead), the same model as InmemoryDataset's without a shuffle.
TEST_F(PsModes, QueueDatasetInTheGpuboxModeEqualsInMemoryDataset) {
  const auto test = data_files((root_ / "test").string());
  auto train_with = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> overrides = {"runner.train_data_dir=" + (root_ / "train").string(),
                                          "runner.test_data_dir=", "runner.epochs=2"};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    TrainerEnv env;
    env.selected_cards = "0,1";
    env.threads_per_card = 1;
    Trainer trainer(config(overrides), env);
    trainer.train();
    return std::make_pair(trainer.evaluate(test, false).metrics.auc, trainer.dense_values(0));
  };
  const auto held = train_with({});
  for (const char* prefetch : {"runner.prefetch_passes=0", "runner.prefetch_passes=1"}) {
    SCOPED_TRACE(prefetch);
    const auto streamed = train_with({"runner.reader_type=QueueDataset", prefetch});
    std::printf("gpubox mode, 2 cards, %s: QueueDataset test auc %.6f, InmemoryDataset %.6f\n",
                prefetch, streamed.first, held.first);
    EXPECT_EQ(streamed.first, held.first);
    EXPECT_EQ(streamed.second, held.second);
  }
}

// A server that dies mid-job: the trainer's next call fails after runner.server_timeout_s,
// naming the server, never a hang.
TEST_F(PsModes, ADeadServerEndsTheJobWithAnErrorNamingIt) {
  const TrainerConfig cfg = config({"runner.sync_mode=async", "runner.server_timeout_s=1"});
  Servers shards(cfg, 2);
  TrainerEnv env;
  env.servers = shards.endpoints();
  PsTrainer trainer(cfg, env);
  const auto train = data_files((root_ / "train").string());
  trainer.train_pass(train);
  shards.stop(1);
  const auto started = std::chrono::steady_clock::now();
  try {
    trainer.train_pass(train);
    ADD_FAILURE() << "a pass against a dead server succeeded";
  } catch (const Error& e) {
    const std::string what = e.what();
    const std::string dead = shards.endpoints().substr(shards.endpoints().find(',') + 1);
    EXPECT_NE(what.find(dead), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(30));
}

// An async dense exchange still under way when its worker is destroyed (a step threw before the
// pass's last sync_dense took it) that then fails is logged naming the server, not dropped.
TEST_F(PsModes, AFailedDenseExchangeLeftAtTheEndIsLoggedNamingTheServer) {
  const TrainerConfig cfg = config({"runner.sync_mode=async"});
  Servers shards(cfg, 1);
  table::server::RemoteHostTierOptions options;
  options.endpoints = shards.endpoints();
  options.config = cfg.sparse;
  options.deadline_s = 1.0;
  options.connect_timeout_s = 0.5;
  auto servers = table::server::RemoteHostTier::connect(std::move(options));
  throw_if_error(servers.status());
  device::Card card(0, 0, 0, 1);
  auto worker = std::make_unique<PsWorker>(card, **servers, cfg);
  worker->sync_dense(0.0f);  // the servers' dense table
  shards.stop(0);
  worker->exchange_dense();  // fails on its own thread: nothing takes its status
  ::testing::internal::CaptureStderr();
  worker.reset();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("the dense exchange under way when the thread stopped failed"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find(shards.endpoints()), std::string::npos) << log;
}

// In sync mode a trainer that stops coming ends the others' job at the next barrier, after
// runner.collective_timeout_s, with an error naming it.
TEST_F(PsModes, ADeadTrainerEndsASyncJobWithAnErrorNamingIt) {
  const TrainerConfig cfg = config({"runner.sync_mode=sync", "runner.collective_timeout_s=1"});
  Servers shards(cfg, 1);
  const auto train = data_files((root_ / "train").string());
  std::string error;
  std::thread survivor([&] {
    try {
      TrainerEnv env;
      env.servers = shards.endpoints();
      env.trainers = 2;
      PsTrainer trainer(cfg, env);
      trainer.train_pass(train);
      trainer.train_pass(train);  // trainer 1 is gone by now
    } catch (const Error& e) {
      error = e.what();
    }
  });
  {
    TrainerEnv env;
    env.servers = shards.endpoints();
    env.trainers = 2;
    env.trainer_id = 1;
    PsTrainer trainer(cfg, env);
    trainer.train_pass(train);
  }  // trainer 1 dies after its first pass
  const auto started = std::chrono::steady_clock::now();
  survivor.join();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(30));
  EXPECT_NE(error.find("missing: trainer 1"), std::string::npos) << error;
  EXPECT_NE(error.find("runner.collective_timeout_s"), std::string::npos) << error;
}

// Data whose every line is malformed (here PaddleRec's slot_dnn lines, which start with a show
// field the config does not name) trains nothing: every PS mode and both readers end with the
// same error naming the file and why its lines were skipped, and write no save.
TEST_F(PsModes, DataWithoutAValidInstanceIsAnErrorInEveryMode) {
  const fs::path bad = root_ / "all_malformed";
  fs::create_directories(bad);
  {
    std::ofstream out(bad / "part-0");
    for (int i = 0; i < 10; ++i) out << "1 0 1:" << 100 + i << " 2:" << 200 + i << "\n";
  }
  for (const char* mode : {"async", "sync", "geo"}) {
    for (const char* reader : {"InmemoryDataset", "QueueDataset"}) {
      const fs::path saves = root_ / (std::string("malformed_saves_") + mode + reader);
      const TrainerConfig cfg =
          config({"runner.train_data_dir=" + bad.string(),
                  "runner.test_data_dir=", std::string("runner.sync_mode=") + mode,
                  std::string("runner.reader_type=") + reader, "runner.save_mode=base",
                  "runner.model_save_path=" + saves.string()});
      Servers shards(cfg, 1);
      TrainerEnv env;
      env.servers = shards.endpoints();
      PsTrainer trainer(cfg, env);
      try {
        trainer.train();
        ADD_FAILURE() << mode << " " << reader << " trained on nothing";
      } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("pass 0: no valid instance in 1 file(s) (10 lines, 10 malformed): " +
                            (bad / "part-0").string()),
                  std::string::npos)
            << mode << " " << reader << ": " << what;
      }
      EXPECT_FALSE(fs::exists(saves / "0")) << mode << " " << reader;
    }
  }
}

// The divergence check (trainer/schedule/divergence.hpp) judges the job's steady loss, added up
// over the trainers through the servers: two async trainers forced to diverge (deepfm with summed
// steps per hot key and sparse SGD at 50) both stop with the error after pass 0, before its save; a
// healthy job's passes end under the constant predictor on both trainers, with the same figure.
TEST_F(PsModes, EveryTrainerStopsADivergedJobBeforeItsSave) {
  for (const bool diverging : {true, false}) {
    SCOPED_TRACE(diverging ? "diverging" : "healthy");
    const fs::path saves = root_ / (diverging ? "diverged_saves" : "healthy_saves");
    std::vector<std::string> extra = {"runner.sync_mode=async",
                                      "runner.print_interval=10",
                                      "runner.save_mode=base",
                                      "runner.model_save_path=" + saves.string(),
                                      "runner.train_data_dir=" + (root_ / "train").string(),
                                      "runner.test_data_dir="};
    if (diverging) {
      extra.push_back("hyper_parameters.model=deepfm");
      extra.push_back("hyper_parameters.sparse_optimizer.class=sgd");
      extra.push_back("hyper_parameters.sparse_optimizer.learning_rate=50");
      extra.push_back("hyper_parameters.sparse_optimizer.mf_learning_rate=50");
    }
    const TrainerConfig cfg = config(extra);
    Servers shards(cfg, 1);
    std::vector<std::string> errors(2);
    std::vector<std::vector<PassReport>> reports(2);
    std::vector<std::thread> threads;
    for (int w = 0; w < 2; ++w) {
      threads.emplace_back([&, w] {
        try {
          TrainerEnv env;
          env.servers = shards.endpoints();
          env.trainer_id = w;
          env.trainers = 2;
          PsTrainer trainer(cfg, env);
          reports[static_cast<std::size_t>(w)] = trainer.train();
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(w)] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int w = 0; w < 2; ++w) {
      const std::string& error = errors[static_cast<std::size_t>(w)];
      if (diverging) {
        EXPECT_NE(error.find("pass 0 is not saved"), std::string::npos) << w << ": " << error;
      } else {
        EXPECT_EQ(error, "") << "trainer " << w;
      }
    }
    EXPECT_EQ(fs::exists(saves / "0"), !diverging);
    if (diverging) continue;
    ASSERT_EQ(reports[0].size(), 1u);
    ASSERT_EQ(reports[1].size(), 1u);
    const SteadyLoss& a = reports[0][0].metrics.steady;
    const SteadyLoss& b = reports[1][0].metrics.steady;
    EXPECT_DOUBLE_EQ(a.ratio_to_constant(), b.ratio_to_constant());
    EXPECT_LT(a.ratio_to_constant(), 1.0);
    // The job's figure: both trainers' steps after their warm-up (each ~78 steps of 256).
    EXPECT_GT(a.examples, reports[0][0].metrics.examples);
  }
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
