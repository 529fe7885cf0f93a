// The fixture of the parameter-server modes' tests (ps_modes_test.cpp, ps_modes_networks_test.cpp,
// ps_modes_saves_test.cpp, ps_modes_failures_test.cpp and the others of the binary ps_modes_test;
// ps_modes_recovery_test.cpp, _recovery_jobs_ and _recovery_refusals_: the binary
// ps_modes_recovery_test): the planted data made once for the suite, jobs of PsTrainers (threads
// of this process) against fresh in-process gpubox_server shards, and a network checked in every
// mode and through a save. One class for every file, so that gtest sees one fixture type (and one
// SetUpTestSuite) for the suite PsModes.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dataset/generator.hpp"
#include "tests/common/scratch_root.hpp"
#include "tests/dataset/planted_data.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"

namespace gpubox::trainer::ps_modes::ps_test {

namespace fs = std::filesystem;

// How many times `what` occurs in `text` (a log, an error).
inline std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The first row of `a` that `b` does not hold to the bit, named with both values ("" when none).
inline std::string first_row_differing(const std::map<uint64_t, std::vector<float>>& a,
                                       const std::map<uint64_t, std::vector<float>>& b) {
  if (a.size() != b.size()) {
    return std::to_string(a.size()) + " rows against " + std::to_string(b.size());
  }
  for (const auto& [key, row] : a) {
    const auto other = b.find(key);
    if (other == b.end()) return "key " + std::to_string(key) + " in one only";
    if (other->second == row) continue;
    std::string text = "key " + std::to_string(key) + ":";
    for (std::size_t i = 0; i < row.size(); ++i) {
      text += " " + std::to_string(row[i]) +
              (row[i] == other->second[i] ? "" : "|" + std::to_string(other->second[i]));
    }
    return text;
  }
  return "";
}

constexpr int kEpochs = 3;
// Issue 16: each mode's test AUC within 0.02 of the planted model's.
constexpr double kPlantedTolerance = 0.02;

// A job of one PsTrainer per config of `configs` (threads of this process) against `servers`:
// trainer w, made from configs[w] with trainer_id w, runs body(trainer, w) on its own thread.
// Returns once all ended: each one's error ("" for none) and the trainers whose body returned,
// kept (null for the others) for what the caller reads of them once the whole job ended.
// `on_end(w)` runs on trainer w's thread as it ends, however it ends (its PsTrainer's constructor
// throwing too), so that a trainer that waits for another's progress is never left waiting for
// one that never began.
struct TrainerJob {
  std::vector<std::unique_ptr<PsTrainer>> trainers;
  std::vector<std::string> errors;
};
template <typename Body, typename OnEnd = void (*)(int)>
TrainerJob run_trainers(
    const std::vector<TrainerConfig>& configs, const std::string& servers, Body body,
    OnEnd on_end = [](int) {}) {
  const int trainers = static_cast<int>(configs.size());
  TrainerJob job;
  job.trainers.resize(static_cast<std::size_t>(trainers));
  job.errors.resize(static_cast<std::size_t>(trainers));
  std::vector<std::thread> threads;
  for (int w = 0; w < trainers; ++w) {
    threads.emplace_back([&, w] {
      std::unique_ptr<PsTrainer> trainer;
      // Destroyed before the trainer: on_end runs before a failed trainer's destructor.
      struct Ended {
        OnEnd& on_end;
        int w;
        ~Ended() { on_end(w); }
      } ended{on_end, w};
      try {
        TrainerEnv env;
        env.servers = servers;
        env.trainer_id = w;
        env.trainers = trainers;
        trainer = std::make_unique<PsTrainer>(configs[static_cast<std::size_t>(w)], env);
        body(*trainer, w);
        job.trainers[static_cast<std::size_t>(w)] = std::move(trainer);
      } catch (const std::exception& e) {
        job.errors[static_cast<std::size_t>(w)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return job;
}
// `trainers` trainers of one config.
template <typename Body, typename OnEnd = void (*)(int)>
TrainerJob run_trainers(
    const TrainerConfig& cfg, const std::string& servers, int trainers, Body body,
    OnEnd on_end = [](int) {}) {
  return run_trainers(std::vector<TrainerConfig>(static_cast<std::size_t>(trainers), cfg), servers,
                      body, on_end);
}

class PsModes : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = gpubox::testing::scratch_root("gpubox_ps_modes");
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
    const TrainerJob job = run_trainers(cfg, servers, trainers, body);
    for (int w = 0; w < trainers; ++w) {
      EXPECT_EQ(job.errors[static_cast<std::size_t>(w)], "") << "trainer " << w;
    }
    if (!job.trainers[0]) return {};
    return finish(*job.trainers[0]);
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

  // `network` (its overrides; `name` for the output) in every PS mode, 2 trainers on 2 servers
  // (geo with twice the passes: it averages the trainers' moves): each mode's test AUC above
  // `min_auc`.
  static void learns_in_every_mode(const std::string& name, const std::vector<std::string>& network,
                                   double min_auc) {
    for (const char* mode : {"async", "sync", "geo"}) {
      SCOPED_TRACE(mode);
      const int passes = std::string(mode) == "geo" ? 2 * kEpochs : kEpochs;
      std::vector<std::string> extra = network;
      extra.push_back(std::string("runner.sync_mode=") + mode);
      extra.push_back("runner.geo_step=4");
      const Outcome out = run(extra, 2, 2, passes);
      std::printf("%s %s, 2 trainers x 2 servers: test auc %.6f, planted %.6f\n", name.c_str(),
                  mode, out.test_auc, planted_auc_);
      EXPECT_GT(out.test_auc, min_auc);
    }
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

  inline static fs::path root_;
  inline static double planted_auc_ = 0;
};

}  // namespace gpubox::trainer::ps_modes::ps_test
