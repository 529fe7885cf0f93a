// runner.pass_cache_mb in the PS modes (dataset/pass_data_cache.hpp): a sync job of one trainer
// with one training thread (deterministic) trains two epochs, each pass shuffled with its own
// seed and evaluated after it, to the same dense parameters and test metrics bit for bit with the
// cache on and off; with it on, the second pass and evaluation were served from it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "dataset/generator.hpp"
#include "tests/dataset/planted_data.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/schedule/trainer_env.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

namespace fs = std::filesystem;

struct Outcome {
  std::vector<float> dense;
  std::vector<MetricValues> passes;
  std::vector<MetricValues> tests;
  std::vector<double> cached;  // each pass's cached_instances
};

double extra(const PassReport& report, const std::string& name) {
  for (const auto& [key, value] : report.extra)
    if (key == name) return value;
  ADD_FAILURE() << "pass report has no " << name;
  return -1;
}

Outcome run(const fs::path& root, const std::string& cache_mb) {
  const TrainerConfig cfg =
      ps_test_config({"runner.sync_mode=sync", "runner.epochs=2", "runner.shuffle=true",
                      "runner.pass_cache_mb=" + cache_mb});
  Servers shards(cfg, 1);
  TrainerEnv env;
  env.servers = shards.endpoints();
  PsTrainer trainer(cfg, env);
  const std::vector<std::string> train = data_files((root / "train").string());
  const std::vector<std::string> test = data_files((root / "test").string());
  Outcome out;
  for (int epoch = 0; epoch < 2; ++epoch) {
    const PassReport report = trainer.train_pass(train);
    out.passes.push_back(report.metrics);
    out.cached.push_back(extra(report, "cached_instances"));
    out.tests.push_back(trainer.evaluate(test).metrics);
  }
  out.dense = trainer.dense_values();
  return out;
}

void expect_same_metrics(const MetricValues& got, const MetricValues& want, const char* what) {
  EXPECT_EQ(got.examples, want.examples) << what;
  EXPECT_EQ(got.auc, want.auc) << what;
  EXPECT_EQ(got.logloss, want.logloss) << what;
}

TEST(PsPassCache, SyncTrainsTheSameWithTheCacheOnAndOff) {
  const fs::path root =
      fs::temp_directory_path() / ("gpubox_ps_pass_cache_" + std::to_string(::getpid()));
  fs::remove_all(root);
  dataset::OracleSummary oracle;
  gpubox::testing::write_planted_train_test(root, &oracle);
  const Outcome off = run(root, "0");
  const Outcome on = run(root, "64");
  fs::remove_all(root);
  ASSERT_EQ(on.passes.size(), 2u);
  for (std::size_t p = 0; p < 2; ++p) {
    expect_same_metrics(on.passes[p], off.passes[p], "pass");
    expect_same_metrics(on.tests[p], off.tests[p], "test");
    EXPECT_EQ(off.cached[p], 0) << "pass " << p;
    EXPECT_EQ(on.cached[p], p == 0 ? 0.0 : static_cast<double>(on.passes[p].examples))
        << "pass " << p;
  }
  ASSERT_EQ(on.dense.size(), off.dense.size());
  EXPECT_EQ(std::memcmp(on.dense.data(), off.dense.data(), on.dense.size() * sizeof(float)), 0)
      << "dense parameters differ";
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
