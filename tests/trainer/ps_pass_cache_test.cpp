// runner.pass_cache_mb in the PS modes (dataset/pass_data_cache.hpp): a sync job of one trainer
// with one training thread (deterministic) trains two epochs, each pass shuffled with its own
// seed and evaluated after it, to the same dense parameters and test metrics bit for bit with the
// cache on and off; with it on, the second pass and evaluation were served from it. And the
// cache's budget and whether a run makes one (trainer/schedule/pass_data.hpp): the memory an
// eighth of which -1 takes, divided by the trainers; none when each list is loaded once (one
// epoch, runner.epochs 0 or -1, a resume into the last epoch, an infer of one save); the run's
// closing report logged when the run throws.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "dataset/generator.hpp"
#include "tests/dataset/planted_data.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/schedule/epoch_loop.hpp"
#include "trainer/schedule/pass_data.hpp"
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
  trainer.plan_pass_cache(2);  // as train() does: two epochs to run
  EXPECT_EQ(trainer.pass_cache() != nullptr, cache_mb != "0");  // what the run's end reports
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

constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST(PassCachePlan, TheBudgetIsAnEighthOfTheUsableMemoryPerTrainerUnlessGiven) {
  TrainerConfig cfg = ps_test_config({"runner.pass_cache_mb=-1"});
  const UsableMemory cgroup{16 * kGiB, "the cgroup limit in /sys/fs/cgroup/memory.max"};
  const PassCacheBudget one = pass_cache_budget(cfg.runner, 1, cgroup);
  EXPECT_EQ(one.bytes, 2 * kGiB);
  EXPECT_NE(one.source.find("an eighth of the 16384 MiB of the cgroup limit in "
                            "/sys/fs/cgroup/memory.max"),
            std::string::npos)
      << one.source;
  EXPECT_EQ(one.source.find("divided"), std::string::npos) << one.source;
  const PassCacheBudget four = pass_cache_budget(cfg.runner, 4, cgroup);
  EXPECT_EQ(four.bytes, kGiB / 2);
  EXPECT_NE(four.source.find("divided by the job's 4 trainers"), std::string::npos) << four.source;
  EXPECT_EQ(pass_cache_budget(cfg.runner, 3, {24 * kGiB, "physical memory"}).bytes, kGiB);
  EXPECT_EQ(pass_cache_budget(cfg.runner, 0, cgroup).bytes, 2 * kGiB);            // no count: one
  EXPECT_EQ(pass_cache_budget(cfg.runner, 1, {0, "physical memory"}).bytes, 0u);  // unknown
  // Given: its MiB, whatever the memory and the trainers.
  for (const int64_t mb : {0, 1, 5000}) {
    cfg.runner.pass_cache_mb = mb;
    const PassCacheBudget given = pass_cache_budget(cfg.runner, 4, cgroup);
    EXPECT_EQ(given.bytes, static_cast<std::size_t>(mb) << 20);
    EXPECT_EQ(given.source, "runner.pass_cache_mb");
  }
}

TEST(PassCachePlan, ACacheOnlyWhenALaterLoadCanBeServed) {
  const fs::path root =
      fs::temp_directory_path() / ("gpubox_pass_cache_plan_" + std::to_string(::getpid()));
  fs::remove_all(root);
  dataset::OracleSummary oracle;
  gpubox::testing::write_planted_train_test(root, &oracle);
  // Two passes an epoch.
  const std::string passes =
      "runner.pass_dirs=[" + (root / "train").string() + "," + (root / "test").string() + "]";
  const UsableMemory memory{16 * kGiB, "physical memory"};
  struct Case {
    int epochs;
    int64_t first;  // the pass a resume starts from
    int64_t loads;  // each list's
  };
  // runner.epochs 0 and -1 run one epoch (plan_run); a resume counts the epoch it is in whole.
  const std::vector<Case> cases = {{1, 0, 1}, {0, 0, 1}, {-1, 0, 1}, {2, 0, 2}, {3, 0, 3},
                                   {3, 1, 3}, {3, 2, 2}, {3, 3, 2},  {3, 4, 1}, {3, 5, 1}};
  for (const Case& c : cases) {
    SCOPED_TRACE("epochs " + std::to_string(c.epochs) + ", from pass " + std::to_string(c.first));
    TrainerConfig cfg = ps_test_config({passes, "runner.pass_cache_mb=-1"});
    cfg.runner.epochs = c.epochs;  // -1 is no config's value, but plan_run must not count on it
    const RunPlan plan = plan_run(cfg.runner);
    ASSERT_EQ(plan.per_epoch, 2);
    EXPECT_EQ(epochs_left(plan, c.first), c.loads);
    const auto cache = make_pass_cache(cfg, 1, epochs_left(plan, c.first), memory);
    EXPECT_EQ(cache != nullptr, c.loads > 1);
    if (cache) {
      EXPECT_EQ(cache->budget_bytes(), 2 * kGiB);
    }
  }
  fs::remove_all(root);
  // --mode infer loads the test data once per save, whatever runner.epochs says.
  for (const int epochs : {1, 5}) {
    TrainerConfig cfg = ps_test_config({"runner.pass_cache_mb=64"});
    cfg.runner.epochs = epochs;
    for (const int64_t saves : {0, 1, 2, 7}) {
      const auto cache = make_pass_cache(cfg, 1, saves, memory);
      EXPECT_EQ(cache != nullptr, saves > 1) << saves << " saves, epochs " << epochs;
      if (cache) {
        EXPECT_EQ(cache->budget_bytes(), std::size_t{64} << 20);
      }
    }
  }
  // Never with a pipe_command, QueueDataset, or 0.
  TrainerConfig piped = ps_test_config({"runner.pass_cache_mb=64"});
  piped.dataset.pipe_command = "cat";
  EXPECT_EQ(make_pass_cache(piped, 1, 3, memory), nullptr);
  TrainerConfig queue = ps_test_config({"runner.pass_cache_mb=64"});
  queue.runner.reader_type = config::ReaderType::kQueueDataset;
  EXPECT_EQ(make_pass_cache(queue, 1, 3, memory), nullptr);
  TrainerConfig off = ps_test_config({"runner.pass_cache_mb=0"});
  EXPECT_EQ(make_pass_cache(off, 1, 3, memory), nullptr);
}

// The run's closing line (PassCacheReport, as run_epochs and infer_job hold it) is logged when
// the run ends by an error too, and not at all without a cache.
TEST(PassCachePlan, TheReportIsLoggedWhenTheRunThrows) {
  const TrainerConfig cfg = ps_test_config({"runner.pass_cache_mb=64"});
  const auto cache = make_pass_cache(cfg, 1, 2, UsableMemory{16 * kGiB, "physical memory"});
  ASSERT_NE(cache, nullptr);
  for (const bool with_cache : {true, false}) {
    ::testing::internal::CaptureStderr();
    EXPECT_THROW(
        {
          const PassCacheReport report(with_cache ? cache.get() : nullptr);
          throw std::runtime_error("a pass failed");
        },
        std::runtime_error);
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(log.find("pass data cache: 0 loads (0 instances) served instead of read; it holds "
                       "0 file lists in 0 MiB of 64 (runner.pass_cache_mb)") != std::string::npos,
              with_cache)
        << log;
  }
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
