// runner.prefetch_passes end to end: the passes after the one training are read, shuffled and
// their rows staged ahead (trainer/engine/pass_pipeline.hpp). On the cpu backend a run is
// deterministic, so with the pipeline off, 1 or 2 passes deep, and through a save and a resume
// in between, every pass's metrics, the test evaluation, the dense parameters and every host
// row must be bit-identical; 1 and 2 simulated cards. Passes overlap in keys (hits), each epoch
// is evaluated between passes, and the pass-seeded shuffle is on. The pass data cache
// (runner.pass_cache_mb), which serves epoch 1 the records epoch 0 parsed, is pinned the same way.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "dataset/generator.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "dataset/queue_dataset.hpp"
#include "heterps/card_tier/card_tier.hpp"
#include "table/sparse_table.hpp"
#include "tests/common/test_data_config.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/pass_pipeline.hpp"
#include "trainer/engine/trainer.hpp"
#include "trainer/main/run_job.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;

constexpr int kPasses = 4;

// What a run ends with, compared bit for bit.
struct RunResult {
  std::vector<PassReport> reports;
  std::vector<float> dense;
  std::map<uint64_t, std::vector<float>> host_rows;
};

class PassPrefetch : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("gpubox_prefetch_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    // One folder per pass; the same vocabulary, so consecutive passes share keys.
    for (int p = 0; p <= kPasses; ++p) {
      dataset::GeneratorOptions gen;
      gen.out_dir = (root_ / (p == kPasses ? "test" : "pass" + std::to_string(p))).string();
      gen.lines = 600;
      gen.files = 2;
      gen.seed = 40 + p;
      gen.slots = 6;
      gen.dense = 3;
      gen.vocab = 300;
      dataset::OracleSummary oracle;
      throw_if_error(dataset::generate(gen, &oracle));
      // The same passes over a vocabulary so large that most of each pass's keys are new.
      gen.out_dir = (root_ / ("fresh" + std::to_string(p))).string();
      gen.vocab = 1000000;
      throw_if_error(dataset::generate(gen, &oracle));
    }
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static TrainerConfig config(int prefetch, int epochs, const std::vector<std::string>& extra) {
    std::string dirs = "runner.pass_dirs=[";
    for (int p = 0; p < kPasses; ++p)
      dirs += (p ? ", " : "") + (root_ / ("pass" + std::to_string(p))).string();
    std::vector<std::string> overrides = {dirs + "]",
                                          "runner.test_data_dir=" + (root_ / "test").string(),
                                          "runner.prefetch_passes=" + std::to_string(prefetch),
                                          "runner.epochs=" + std::to_string(epochs),
                                          "runner.train_batch_size=64",
                                          "runner.shuffle=true",
                                          "runner.metrics_path=",
                                          "runner.model_save_path=",
                                          "runner.thread_num=2",
                                          "hyper_parameters.sparse_inputs_slots=7",
                                          "hyper_parameters.sparse_feature_dim=5",
                                          "hyper_parameters.dense_input_dim=3",
                                          "hyper_parameters.fc_sizes=[16, 8]",
                                          "hyper_parameters.sparse_optimizer.embed_threshold=0",
                                          "hyper_parameters.sparse_optimizer.embedx_threshold=0"};
    return testing::load_test_config(std::move(overrides), extra);
  }

  static RunResult finish(Trainer& trainer, std::vector<PassReport> reports) {
    RunResult out;
    out.reports = std::move(reports);
    out.dense = trainer.dense_values(trainer.num_cards() - 1);
    auto* table = dynamic_cast<table::SparseTable*>(&trainer.host_tier());
    EXPECT_NE(table, nullptr);
    const int stride = trainer.host_tier().layout().stride();
    throw_if_error(table->for_each_row([&](uint64_t key, const float* row) {
      out.host_rows[key] = std::vector<float>(row, row + stride);
    }));
    return out;
  }

  static RunResult run(int cards, int prefetch, const std::vector<std::string>& extra = {}) {
    Trainer trainer(config(prefetch, 2, extra), env(cards));
    auto reports = trainer.train();
    return finish(trainer, std::move(reports));
  }

  // Epoch 0 with saves (runner.save_mode checkpoint) in one trainer, then a second trainer that
  // resumes from the last save and trains epoch 1.
  static RunResult run_with_resume(int cards, int prefetch) {
    const fs::path saves =
        root_ / ("saves_" + std::to_string(cards) + "_" + std::to_string(prefetch));
    const std::vector<std::string> extra = {"runner.model_save_path=" + saves.string(),
                                            "runner.save_mode=checkpoint", "runner.resume=auto"};
    std::vector<PassReport> reports;
    {
      Trainer first(config(prefetch, 1, extra), env(cards));
      reports = first.train();
    }
    Trainer second(config(prefetch, 2, extra), env(cards));
    auto rest = second.train();
    EXPECT_EQ(rest.size(), static_cast<std::size_t>(kPasses)) << "did not resume at epoch 1";
    reports.insert(reports.end(), rest.begin(), rest.end());
    return finish(second, std::move(reports));
  }

  static TrainerEnv env(int cards) {
    TrainerEnv e;
    e.selected_cards = cards == 1 ? "0" : "0,1";
    e.threads_per_card = 1;
    return e;
  }

  static double extra(const PassReport& report, const std::string& name) {
    for (const auto& [key, value] : report.extra)
      if (key == name) return value;
    ADD_FAILURE() << "pass report has no " << name;
    return -1;
  }

  // Counters too unless `values_only` (a resumed run starts with empty cards: more pulls).
  static void expect_identical(const RunResult& got, const RunResult& want, const char* what,
                               bool values_only = false) {
    ASSERT_EQ(got.reports.size(), want.reports.size()) << what;
    for (std::size_t p = 0; p < want.reports.size(); ++p) {
      const MetricValues& g = got.reports[p].metrics;
      const MetricValues& w = want.reports[p].metrics;
      EXPECT_EQ(got.reports[p].pass, want.reports[p].pass) << what;
      EXPECT_EQ(g.examples, w.examples) << what << " pass " << p;
      EXPECT_EQ(g.auc, w.auc) << what << " pass " << p;
      EXPECT_EQ(g.logloss, w.logloss) << what << " pass " << p;
      if (values_only) continue;
      // The pass's counters, and what its steady steps asked of the cards (step_accounting_test
      // pins those): the staging thread never touches a card.
      for (const char* counter :
           {"keys_in_pass", "hits", "created", "allocations_per_step", "pageable_copies_per_step",
            "pinned_copies_per_step", "launches_per_step", "collectives_per_step"}) {
        EXPECT_EQ(extra(got.reports[p], counter), extra(want.reports[p], counter))
            << what << " pass " << p << " " << counter;
      }
      expect_same_step_waits(got.reports[p], want.reports[p], what, p);
      EXPECT_EQ(extra(got.reports[p], "pulled") + extra(got.reports[p], "prefetched"),
                extra(want.reports[p], "pulled"))
          << what << " pass " << p;
      // With the pipeline the next pass's keys are known at end_pass: their rows stay dirty on
      // the cards (kept_dirty) instead of being written back; every dirty row is one or the other.
      EXPECT_EQ(extra(got.reports[p], "written_back") + extra(got.reports[p], "kept_dirty"),
                extra(want.reports[p], "written_back") + extra(want.reports[p], "kept_dirty"))
          << what << " pass " << p;
    }
    ASSERT_EQ(got.dense.size(), want.dense.size()) << what;
    EXPECT_EQ(std::memcmp(got.dense.data(), want.dense.data(), got.dense.size() * sizeof(float)), 0)
        << what << ": dense parameters differ";
    ASSERT_EQ(got.host_rows.size(), want.host_rows.size()) << what;
    for (const auto& [key, row] : want.host_rows) {
      ASSERT_TRUE(got.host_rows.count(key)) << what << ": key " << key;
      ASSERT_EQ(std::memcmp(got.host_rows.at(key).data(), row.data(), row.size() * sizeof(float)),
                0)
          << what << ": host row of key " << key << " differs";
    }
  }

  // The steady steps' host waits: equal with the pipeline on and off, on every backend (0: no
  // round trip). A GPU's step also waits for the status of the step kStatusDepth before it when
  // the host ran that far ahead of the card (LateReadback's full ring, the batch's staging block
  // with it), which timing decides run to run (on an H200 2 to 6 of a pass's 8 steps, counted as
  // host syncs then): those are pipeline waits, bounded, at most one in any step.
  static void expect_same_step_waits(const PassReport& got, const PassReport& want,
                                     const char* what, std::size_t p) {
    EXPECT_EQ(extra(got, "host_syncs_per_step"), extra(want, "host_syncs_per_step"))
        << what << " pass " << p << " host_syncs_per_step";
    EXPECT_LE(extra(got, "max_pipeline_waits_in_a_step"), 1.0) << what << " pass " << p;
    EXPECT_LE(extra(want, "max_pipeline_waits_in_a_step"), 1.0)
        << what << " pass " << p << ", without the pipeline";
  }

  static void check_early_inserts(const std::vector<PassReport>& reports);

  static fs::path root_;
};
fs::path PassPrefetch::root_;

TEST_P(PassPrefetch, PrefetchOnEqualsOffBitForBitAlsoThroughASaveAndResume) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  const RunResult off = run(cards, 0);
  ASSERT_EQ(off.reports.size(), 2u * kPasses);
  double hits = 0;
  for (const auto& report : off.reports) {
    EXPECT_EQ(extra(report, "prefetched"), 0) << "prefetch off staged rows";
    EXPECT_EQ(extra(report, "kept_dirty"), 0) << "prefetch off kept rows dirty";
    // The write-back's pinned buffers are in the report once it wrote rows back.
    if (extra(report, "written_back") > 0) {
      EXPECT_GT(extra(report, "write_back_pinned_mb"), 0);
    }
    hits += extra(report, "hits");
  }
  EXPECT_GT(hits, 0) << "the passes share no key: the test would not see stale staging";

  const RunResult one = run(cards, 1);
  expect_identical(one, off, "prefetch_passes=1");
  // Within an epoch a pass keeps the next pass's rows dirty (the passes share keys); the last
  // pass of an epoch (an evaluation follows) keeps none.
  for (std::size_t p = 0; p < one.reports.size(); ++p) {
    if ((p + 1) % kPasses == 0) {
      EXPECT_EQ(extra(one.reports[p], "kept_dirty"), 0) << "pass " << p;
    } else {
      EXPECT_GT(extra(one.reports[p], "kept_dirty"), 0) << "pass " << p;
    }
  }
  // Every pass after the first had its missing rows staged: begin_pass pulled none itself (in
  // epoch 1 every key is on the cards already).
  // Nothing staged goes unused: the staging skips the keys on the cards (they are hits).
  for (std::size_t p = 1; p < one.reports.size(); ++p) {
    EXPECT_EQ(extra(one.reports[p], "pulled"), 0) << "pass " << p;
    EXPECT_EQ(extra(one.reports[p], "staged"), extra(one.reports[p], "prefetched")) << "pass " << p;
    if (p < kPasses) {
      EXPECT_GT(extra(one.reports[p], "prefetched"), 0) << "pass " << p;
    }
  }
  const RunResult two = run(cards, 2);
  expect_identical(two, off, "prefetch_passes=2");
  // The next pass's card work between the steps (runner.next_pass_chunk_keys; on by default
  // above) off, and in chunks of 3 keys (the work spread over many steps, often unfinished at
  // begin_pass), under a card budget too: the same runs.
  double early = 0;
  for (const auto& report : one.reports) early += extra(report, "early_inserted");
  for (const auto& report : two.reports) early += extra(report, "early_inserted");
  const RunResult no_early = run(cards, 1, {"runner.next_pass_chunk_keys=0"});
  for (const auto& report : no_early.reports) {
    EXPECT_EQ(extra(report, "early_inserted"), 0) << "the work ran while off";
  }
  expect_identical(no_early, off, "next_pass_chunk_keys=0");
  for (const char* budget : {"runner.card_memory_mb=0", "runner.card_memory_mb=12"}) {
    const RunResult small = run(cards, 1, {"runner.next_pass_chunk_keys=3", budget});
    for (const auto& report : small.reports) early += extra(report, "early_inserted");
    expect_identical(small, off, (std::string("next_pass_chunk_keys=3, ") + budget).c_str());
  }
  std::printf("rows inserted between steps over the runs with the work on: %.0f\n", early);
  // Else every run above took begin_pass's whole path and the comparisons say nothing of it.
  EXPECT_GT(early, 0) << "no staged row was inserted between steps";
  const RunResult resumed_off = run_with_resume(cards, 0);
  expect_identical(resumed_off, off, "a save and resume", /*values_only=*/true);
  expect_identical(run_with_resume(cards, 1), resumed_off, "prefetch_passes=1, save and resume");
}

// runner.pass_cache_mb: epoch 1 shares the passes and the test data that epoch 0 parsed instead of
// reading them again (dataset/pass_data_cache.hpp). The records are the same and the pass's
// seeded shuffle is applied to them as to a fresh parse, so every pass, the dense parameters, the
// host rows and each epoch's test evaluation equal a run without the cache bit for bit, with the
// pipeline reading ahead or not; the reports and the log say what was served.
TEST_P(PassPrefetch, PassCacheOnEqualsOffBitForBit) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  std::vector<MetricValues> tests;
  RunHooks hooks;
  hooks.on_epoch = [&tests](int64_t, const MetricValues&, const MetricValues* test) {
    ASSERT_NE(test, nullptr);
    tests.push_back(*test);
  };
  auto run_with = [&](int prefetch, const char* cache_mb) {
    Trainer trainer(config(prefetch, 2, {std::string("runner.pass_cache_mb=") + cache_mb}),
                    env(cards));
    auto reports = trainer.train("", hooks);
    return finish(trainer, std::move(reports));
  };
  const RunResult off = run_with(0, "0");
  for (const PassReport& report : off.reports) EXPECT_EQ(extra(report, "cached_instances"), 0);
  for (const int prefetch : {0, 1}) {
    SCOPED_TRACE("prefetch_passes=" + std::to_string(prefetch));
    ::testing::internal::CaptureStderr();
    const RunResult on = run_with(prefetch, "64");
    const std::string log = ::testing::internal::GetCapturedStderr();
    expect_identical(on, off, "pass_cache_mb=64");
    for (std::size_t p = 0; p < on.reports.size(); ++p) {
      EXPECT_EQ(extra(on.reports[p], "cached_instances"),
                p < kPasses ? 0.0 : static_cast<double>(on.reports[p].metrics.examples))
          << "pass " << p;
    }
    EXPECT_NE(log.find("pass " + std::to_string(kPasses) +
                       ": 600 instances of 2 files from the pass data cache"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("evaluation data: 600 instances of 2 files from the pass data cache"),
              std::string::npos)
        << log;
    // Epoch 1's 4 passes and its evaluation, once the run ends; the shuffled passes planned
    // afresh, the evaluation (read unshuffled) served its plan of epoch 0.
    EXPECT_NE(log.find("pass data cache: 5 loads (3000 instances) served instead of read; it "
                       "holds 5 file lists"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find(" unique keys, 1 their step plans\n"), std::string::npos) << log;
  }
  // Each run evaluated after both epochs: the runs with the cache as the one without.
  ASSERT_EQ(tests.size(), 6u);
  for (std::size_t e = 2; e < tests.size(); ++e) {
    EXPECT_EQ(tests[e].examples, tests[e % 2].examples) << "evaluation " << e;
    EXPECT_EQ(tests[e].auc, tests[e % 2].auc) << "evaluation " << e;
    EXPECT_EQ(tests[e].logloss, tests[e % 2].logloss) << "evaluation " << e;
  }
}

// runner.shuffle off: epoch 1 reads every pass and the test data as epoch 0 did, so with the pass
// cache each is served its step plan of epoch 0 (trainer/engine/step_sizes.hpp, StepPlanMemo)
// instead of planned again, and the run equals one without the cache bit for bit.
TEST_P(PassPrefetch, UnshuffledPassesTheCacheServesAreServedTheirStepPlans) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  const RunResult off = run(cards, 0, {"runner.shuffle=false", "runner.pass_cache_mb=0"});
  ::testing::internal::CaptureStderr();
  const RunResult on = run(cards, 1, {"runner.shuffle=false", "runner.pass_cache_mb=64"});
  const std::string log = ::testing::internal::GetCapturedStderr();
  expect_identical(on, off, "shuffle=false, prefetch_passes=1, pass_cache_mb=64");
  // Epoch 1's 4 passes and its evaluation.
  EXPECT_NE(log.find("pass data cache: 5 loads (3000 instances) served instead of read; it "
                     "holds 5 file lists"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find(" unique keys, 5 their step plans\n"), std::string::npos) << log;
}

// Issue 31: nothing grows between a pass's steps, in the first pass either. The trainer plans
// the next pass's staging during the pass (the pipeline starts reading it after
// expect_next_pass), so expect_next_pass sizes the cards' tables and pools at the pass boundary
// for as many new keys as the pass beginning brought (the first pass: all of its keys) and an
// eighth; inserts that would not fit are left to begin_pass, never grown into between the steps
// (before: the first pass's first insert chunk on each card waited twice, allocated 3 times, and
// the steps captured their graphs again). The passes have mostly new keys (a vocabulary of 10^6
// a slot), so each pass's inserts outgrow the tables. The trainer's test hook makes each pass
// wait, before its steps, for the next pass's staging: its work between the steps always finds
// the next pass's keys and rows, and every pass after the first has rows inserted early (before
// the hook, a busy machine planned a pass only after the one before ended, and the case skipped).
TEST_P(PassPrefetch, EveryPassInsertsTheNextPassesRowsWithoutWaitsOrAllocations) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  std::string dirs = "runner.pass_dirs=[";
  for (int p = 0; p < kPasses; ++p)
    dirs += (p ? ", " : "") + (root_ / ("fresh" + std::to_string(p))).string();
  // Batches of 8: some 75 steps a pass (37 on 2 cards), for the next pass's work to end well
  // before the pass does.
  Trainer trainer(config(1, 1, {dirs + "]", "runner.train_batch_size=8"}), env(cards));
  trainer.wait_for_next_staging_before_steps(true);
  check_early_inserts(trainer.train());
}

// The passes' reports of EveryPassInserts...: each pass's work during the pass before it
// inserted rows, without a wait or an allocation.
void PassPrefetch::check_early_inserts(const std::vector<PassReport>& reports) {
  EXPECT_EQ(reports.size(), static_cast<std::size_t>(kPasses));
  for (std::size_t p = 1; p < reports.size(); ++p) {
    const double inserted = extra(reports[p], "early_inserted");
    const double syncs = extra(reports[p], "early_host_syncs");
    const double allocations = extra(reports[p], "early_allocations");
    std::printf(
        "pass %zu: staged %.0f, early_inserted %.0f, early_host_syncs %.0f, early_allocations "
        "%.0f, steady graph captures %.0f\n",
        p, extra(reports[p], "staged"), inserted, syncs, allocations,
        extra(reports[p], "steady_graph_captures"));
    EXPECT_EQ(extra(reports[p], "pulled"), 0) << "pass " << p;
    EXPECT_GT(inserted, 0) << "pass " << p << ": no row was inserted between the steps before it";
    EXPECT_LE(inserted, extra(reports[p], "staged")) << "pass " << p;
    EXPECT_EQ(syncs, 0) << "pass " << p << ": an insert chunk waited for the card";
    EXPECT_EQ(allocations, 0) << "pass " << p << ": an insert chunk grew a table";
  }
}

// A staging whose host-tier pull fails (SparseTable::fail_pulls_after: the first pull after pass
// 0's begin_pass, which is pass 1's staging) is logged, and pass 1's begin_pass pulls the rows
// itself (the trainer hands it no staged rows): the run equals prefetch off bit for bit, with and
// without a card budget (the cards looked pass 1's keys up before its rows failed).
TEST_P(PassPrefetch, AFailedStagingGivesTheTablesOfPrefetchOff) {
  const int cards = GetParam();
  GPUBOX_REQUIRE_CARDS(cards);
  for (const char* budget : {"runner.card_memory_mb=0", "runner.card_memory_mb=12"}) {
    SCOPED_TRACE(budget);
    const std::vector<std::string> overrides = {"runner.next_pass_chunk_keys=3", budget};
    const RunResult off = run(cards, 0, overrides);
    Trainer trainer(config(1, 2, overrides), env(cards));
    auto* table = dynamic_cast<table::SparseTable*>(&trainer.host_tier());
    ASSERT_NE(table, nullptr);
    // Pass 0's begin_pass pulls once a card (its keys fit one host batch), then pass 1's
    // staging pulls.
    table->fail_pulls_after(cards, 1);
    ::testing::internal::CaptureStderr();
    std::vector<PassReport> reports;
    try {
      reports = trainer.train();
    } catch (...) {
      std::fprintf(stderr, "%s", ::testing::internal::GetCapturedStderr().c_str());
      throw;
    }
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(log.find("pass 1: staging its rows ahead failed, its begin_pass pulls them"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("fail_pulls_after"), std::string::npos) << "the warning names no cause";
    const RunResult failed = finish(trainer, std::move(reports));
    ASSERT_EQ(failed.reports.size(), 2u * kPasses);
    EXPECT_EQ(extra(failed.reports[1], "staged"), 0);
    EXPECT_EQ(extra(failed.reports[1], "prefetched"), 0);
    EXPECT_GT(extra(failed.reports[1], "pulled"), 0);
    EXPECT_GT(extra(failed.reports[2], "prefetched"), 0) << "the staging after it failed too";
    expect_identical(failed, off, "a failed staging");
  }
}

// The next pass's card work starts from the next pass's staging: without passes staged ahead
// (runner.prefetch_passes = 0) it never runs, so the card tier's plan has no scratch for it and
// its footprint is the plan's without the work (oracle: runner.next_pass_chunk_keys = 0).
TEST_F(PassPrefetch, WithoutPassesStagedAheadThePlanHasNoNextPassWork) {
  const std::string budget = "runner.card_memory_mb=12";
  Trainer staged(config(1, 1, {budget}), env(1));
  EXPECT_GT(staged.card_tier().plan().next_pass_bytes, 0u) << "the work is on by default";
  Trainer unstaged(config(0, 1, {budget}), env(1));
  Trainer off(config(1, 1, {budget, "runner.next_pass_chunk_keys=0"}), env(1));
  EXPECT_EQ(unstaged.card_tier().plan().next_pass_bytes, 0u);
  EXPECT_EQ(unstaged.card_tier().plan().rows, off.card_tier().plan().rows);
  EXPECT_EQ(unstaged.card_tier().plan().total_bytes(), off.card_tier().plan().total_bytes());
}

// --mode infer never trains, so the next pass's card work never runs: infer_job builds its
// schedule from infer_config (the work off), whose plan has neither the work's card term nor its
// pinned one and is a plan without the work (the rows the budget holds included), and its plan
// line says nothing is pinned for it; the same config training has both terms and says so.
TEST_F(PassPrefetch, InferModeHasNoNextPassWork) {
  const fs::path saves = root_ / "saves_infer";
  const std::string budget = "runner.card_memory_mb=12";
  TrainerConfig training =
      config(1, 1, {budget, "runner.model_save_path=" + saves.string(), "runner.save_mode=base"});
  training.runner.pass_dirs = {(root_ / "pass0").string()};
  // The card tier's plan line, from a run's log.
  const auto plan_line = [](const std::string& log) {
    const std::size_t at = log.find("card tier per card: ");
    return at == std::string::npos ? std::string() : log.substr(at, log.find('\n', at) - at);
  };
  ::testing::internal::CaptureStderr();
  {
    Trainer trainer(training, env(1));
    EXPECT_GT(trainer.card_tier().plan().next_pass_bytes, 0u) << "the work is on by default";
    EXPECT_GT(trainer.card_tier().plan().next_pass_pinned_bytes, 0u);
    trainer.train();
  }
  const std::string trained = plan_line(::testing::internal::GetCapturedStderr());
  EXPECT_NE(trained.find("next pass's card work pins "), std::string::npos) << trained;
  ASSERT_TRUE(fs::exists(saves / "0"));
  // infer_job itself: its schedule's plan line.
  ::testing::internal::CaptureStderr();
  InferJob job;
  job.load = (saves / "0").string();
  const EvalResult result = infer_job(training, env(1), job);
  const std::string inferred = plan_line(::testing::internal::GetCapturedStderr());
  EXPECT_GT(result.metrics.examples, 0);
  ASSERT_FALSE(inferred.empty()) << "no plan line";
  EXPECT_EQ(inferred.find("pins"), std::string::npos) << inferred;
  // The config it builds from, and that config's plan against a run with the work off.
  const TrainerConfig inferring = infer_config(training);
  EXPECT_EQ(inferring.runner.next_pass_chunk_keys, 0);
  Trainer infer(inferring, env(1));
  const pass::CardTierPlan& plan = infer.card_tier().plan();
  EXPECT_EQ(plan.next_pass_bytes, 0u);
  EXPECT_EQ(plan.next_pass_pinned_bytes, 0u);
  EXPECT_EQ(inferred, plan.to_string()) << "infer_job's plan is infer_config's";
  Trainer off(config(1, 1, {budget, "runner.next_pass_chunk_keys=0"}), env(1));
  EXPECT_EQ(plan.rows, off.card_tier().plan().rows);
  EXPECT_EQ(plan.total_bytes(), off.card_tier().plan().total_bytes());
}

// A pass read ahead that cannot be read (every line malformed) fails where reading it in place
// would: when its turn comes, naming it, after the pass before it trained and was saved.
TEST_F(PassPrefetch, APassThatCannotBeReadFailsAtItsTurnNamingIt) {
  const fs::path bad = root_ / "bad";
  fs::create_directories(bad);
  {
    std::ofstream out(bad / "part-0");
    for (int i = 0; i < 10; ++i) out << "not a slot line " << i << "\n";
  }
  const fs::path saves = root_ / "saves_bad";
  TrainerConfig cfg = config(1, 1,
                             {"runner.model_save_path=" + saves.string(), "runner.save_mode=base",
                              "runner.test_data_dir="});
  cfg.runner.pass_dirs = {(root_ / "pass0").string(), bad.string()};
  Trainer trainer(cfg, env(1));
  try {
    trainer.train();
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("pass 1"), std::string::npos) << what;
    EXPECT_NE(what.find(bad.string()), std::string::npos) << what;
  }
  EXPECT_EQ(trainer.passes_done(), 1);
  EXPECT_TRUE(fs::exists(saves / "0")) << "pass 0 was not saved before the failure";
}

// prepare_pass keeps the reader's keys, shared, when they are ascending (the data set and the
// pass cache hold the same object), sorts a reader's that are not into a copy (slots along, a
// repeated key keeping its first slot) leaving the reader's unchanged, and refuses a reader that
// gave none, naming the pass.
TEST(PreparePass, AscendingKeysAreSharedNotCopied) {
  auto given = std::make_shared<dataset::UniqueKeys>();
  given->keys = {2, 5, 9};
  given->slots = {0, 1, 2};
  const auto prepared = prepare_pass([&](int64_t, PreparedPass* into) { into->keys = given; }, 4);
  EXPECT_EQ(prepared->keys.get(), given.get());
  ASSERT_NE(prepared->sorted_keys, nullptr);
  EXPECT_EQ(prepared->sorted_keys.get(), &given->keys) << "sorted_keys aliases the shared keys";
}

TEST(PreparePass, KeysNotAscendingAreSortedIntoACopy) {
  const std::vector<uint64_t> keys = {9, 2, 5, 2, 7};
  const std::vector<int32_t> slots = {1, 2, 3, 4, 5};
  std::weak_ptr<const dataset::UniqueKeys> read;
  // The reader keeps no reference: the copy replaces the only owner of what it gave.
  const auto prepared = prepare_pass(
      [&](int64_t, PreparedPass* into) {
        auto given = std::make_shared<dataset::UniqueKeys>(dataset::UniqueKeys{keys, slots});
        read = given;
        into->keys = std::move(given);
      },
      0);
  EXPECT_TRUE(read.expired());
  EXPECT_EQ(prepared->keys->keys, (std::vector<uint64_t>{2, 5, 7, 9}));
  EXPECT_EQ(prepared->keys->slots, (std::vector<int32_t>{2, 3, 5, 1}));
  EXPECT_EQ(prepared->sorted_keys.get(), &prepared->keys->keys);

  auto shared = std::make_shared<dataset::UniqueKeys>(dataset::UniqueKeys{keys, slots});
  const auto again = prepare_pass([&](int64_t, PreparedPass* into) { into->keys = shared; }, 1);
  EXPECT_NE(again->keys.get(), shared.get());
  EXPECT_EQ(again->keys->keys, (std::vector<uint64_t>{2, 5, 7, 9}));
  EXPECT_EQ(shared->keys, keys) << "the reader's keys were changed";
  EXPECT_EQ(shared->slots, slots);
}

TEST(PreparePass, AReaderThatGivesNoKeysFailsNamingThePass) {
  try {
    prepare_pass([](int64_t, PreparedPass*) {}, 3);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pass 3: the reader gave no keys"), std::string::npos)
        << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Cards, PassPrefetch, ::testing::Values(1, 2),
                         [](const auto& info) { return std::to_string(info.param) + "cards"; });

}  // namespace
}  // namespace gpubox::trainer
