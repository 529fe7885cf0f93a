// runner.shrink_every in the gpubox mode (trainer/schedule/table_shrink.hpp): the epoch loop
// shrinks the sparse table after a pass's end_pass (its rows written back, the cards emptied)
// and before the next begin_pass. The oracle of which rows a shrink deletes: each pass's keys
// (the rows a from-scratch run of that pass alone creates) and the unseen-days rule applied
// pass by pass in an std::unordered_map. A run that never shrinks is bit-identical to one
// without the key (its default).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "dataset/generator.hpp"
#include "table/sparse_table.hpp"
#include "tests/common/test_data_config.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/engine/trainer.hpp"
#include "trainer/schedule/table_shrink.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;

constexpr int kPasses = 3;

struct RunResult {
  std::vector<float> dense;
  std::map<uint64_t, std::vector<float>> rows;
  int64_t day = 0;
  std::vector<PassReport> reports;
};

class ShrinkSchedule : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("gpubox_shrink_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    // Passes over one large vocabulary: the popular keys recur, most others are new each pass.
    for (int p = 0; p < kPasses; ++p) {
      dataset::GeneratorOptions gen;
      gen.out_dir = (root_ / ("pass" + std::to_string(p))).string();
      gen.lines = 400;
      gen.seed = 70 + p;
      gen.slots = 4;
      gen.dense = 2;
      gen.vocab = 2000;
      dataset::OracleSummary oracle;
      throw_if_error(dataset::generate(gen, &oracle));
    }
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  // Passes `passes` (folders pass<i>) once each, one card, no shuffle, plus `extra`.
  static TrainerConfig config(const std::vector<int>& passes,
                              const std::vector<std::string>& extra) {
    std::string dirs = "runner.pass_dirs=[";
    for (std::size_t i = 0; i < passes.size(); ++i)
      dirs += (i ? ", " : "") + (root_ / ("pass" + std::to_string(passes[i]))).string();
    std::vector<std::string> overrides = {dirs + "]",
                                          "runner.test_data_dir=",
                                          "runner.epochs=1",
                                          "runner.train_batch_size=64",
                                          "runner.shuffle=false",
                                          "runner.metrics_path=",
                                          "runner.model_save_path=",
                                          "runner.thread_num=1",
                                          "hyper_parameters.sparse_inputs_slots=5",
                                          "hyper_parameters.sparse_feature_dim=5",
                                          "hyper_parameters.dense_input_dim=2",
                                          "hyper_parameters.fc_sizes=[8]",
                                          "hyper_parameters.sparse_optimizer.embed_threshold=0",
                                          "hyper_parameters.sparse_optimizer.embedx_threshold=0"};
    return testing::load_test_config(std::move(overrides), extra);
  }

  static RunResult run(const std::vector<int>& passes, const std::vector<std::string>& extra) {
    TrainerEnv env;
    env.selected_cards = "0";
    env.threads_per_card = 1;
    Trainer trainer(config(passes, extra), env);
    RunResult out;
    out.reports = trainer.train();
    out.dense = trainer.dense_values(0);
    auto* table = dynamic_cast<table::SparseTable*>(&trainer.host_tier());
    EXPECT_NE(table, nullptr);
    if (table == nullptr) return out;
    out.day = table->day();
    const int stride = trainer.host_tier().layout().stride();
    throw_if_error(table->for_each_row([&](uint64_t key, const float* row) {
      out.rows[key] = std::vector<float>(row, row + stride);
    }));
    return out;
  }

  // Pass report `p`'s counter `name` (rows staged ahead: "prefetched").
  static double extra(const RunResult& result, std::size_t p, const std::string& name) {
    if (p >= result.reports.size()) {
      ADD_FAILURE() << "no pass " << p;
      return -1;
    }
    for (const auto& [key, value] : result.reports[p].extra)
      if (key == name) return value;
    ADD_FAILURE() << "pass report has no " << name;
    return -1;
  }

  static fs::path root_;
};

fs::path ShrinkSchedule::root_;

// Deletion by unseen days only (no score deletion, no decay): a row is deleted by the shrink
// that makes it unseen for more than 2 shrinks, so after passes 0, 1, 2 each followed by a shrink
// the table holds exactly the keys of passes 1 and 2 (unseen 2 and 1 shrinks); the oracle
// replays the rule.
TEST_F(ShrinkSchedule, EachPassShrinksAsTheOracleSays) {
  const std::vector<std::string> rule = {
      "hyper_parameters.sparse_optimizer.delete_threshold=-1",
      "hyper_parameters.sparse_optimizer.show_click_decay_rate=1",
      "hyper_parameters.sparse_optimizer.delete_after_unseen_days=2"};
  std::unordered_map<uint64_t, int> unseen;  // the oracle: key -> shrinks since last seen
  for (int p = 0; p < kPasses; ++p) {
    for (const auto& entry : run({p}, {}).rows) unseen[entry.first] = 0;  // seen in pass p
    for (auto it = unseen.begin(); it != unseen.end();) {
      it = ++it->second > 2 ? unseen.erase(it) : std::next(it);
    }
  }
  std::vector<std::string> shrinking = rule;
  shrinking.push_back("runner.shrink_every=pass");
  const RunResult got = run({0, 1, 2}, shrinking);
  EXPECT_EQ(got.day, kPasses);
  const RunResult kept = run({0, 1, 2}, rule);  // never: nothing deleted
  EXPECT_EQ(kept.day, 0);
  ASSERT_GT(kept.rows.size(), unseen.size()) << "the passes' keys must not all recur";
  EXPECT_EQ(got.rows.size(), unseen.size());
  for (const auto& [key, days] : unseen) {
    ASSERT_TRUE(got.rows.count(key)) << "key " << key << " deleted";
    EXPECT_EQ(got.rows.at(key)[table::RowLayout::kUnseenDays], static_cast<float>(days))
        << "key " << key;
  }
}

// A row the shrink deleted is not kept on the cards: seen again, it starts afresh. Passes 0, 1,
// 0: the keys of pass 0 that pass 1 lacks are deleted by the shrink after pass 1 (unseen 2 > 1);
// in the third pass (pass 0's data again) their rows are new, so their show and click are
// those of one pass over that data (a run of pass 0 alone: the counts depend on the data only),
// not of two (what a card still holding the deleted row would write back).
TEST_F(ShrinkSchedule, ADeletedRowSeenAgainStartsAfresh) {
  const std::vector<std::string> rule = {
      "hyper_parameters.sparse_optimizer.delete_threshold=-1",
      "hyper_parameters.sparse_optimizer.show_click_decay_rate=1",
      "hyper_parameters.sparse_optimizer.delete_after_unseen_days=1", "runner.shrink_every=pass"};
  const RunResult once = run({0}, {});
  const RunResult second = run({1}, {});
  const RunResult got = run({0, 1, 0}, rule);
  std::size_t checked = 0;
  for (const auto& [key, row] : once.rows) {
    if (second.rows.count(key)) continue;
    ASSERT_TRUE(got.rows.count(key)) << "key " << key;
    EXPECT_EQ(got.rows.at(key)[table::RowLayout::kShow], row[table::RowLayout::kShow])
        << "key " << key;
    EXPECT_EQ(got.rows.at(key)[table::RowLayout::kClick], row[table::RowLayout::kClick])
        << "key " << key;
    ++checked;
  }
  EXPECT_GT(checked, 0u);
}

// delete_after_unseen_days 0 deletes every row at each shrink, the pass's own included (a shrink
// counts a row one more first, as PaddleRec's accessor): the table ends empty, and it is warned.
TEST_F(ShrinkSchedule, AShrinkThatEmptiesTheTableIsWarned) {
  // Pass 0 shrunk with rows unseen for more than `days` deleted: its rows and its log.
  const auto shrunk = [](const std::string& days) {
    ::testing::internal::CaptureStderr();
    RunResult result =
        run({0}, {"hyper_parameters.sparse_optimizer.delete_threshold=-1",
                  "hyper_parameters.sparse_optimizer.delete_after_unseen_days=" + days,
                  "runner.shrink_every=pass"});
    return std::make_pair(std::move(result), ::testing::internal::GetCapturedStderr());
  };
  const auto [emptied, log] = shrunk("0");
  EXPECT_TRUE(emptied.rows.empty());
  EXPECT_NE(log.find("the shrink after pass 0 deleted every sparse row"), std::string::npos) << log;
  // A shrink that keeps rows says nothing of the kind.
  const auto [kept, quiet] = shrunk("1");
  EXPECT_FALSE(kept.rows.empty());
  EXPECT_EQ(quiet.find("deleted every sparse row"), std::string::npos) << quiet;
}

// The shrink comes before the pass's save, and the save keeps the table's day counter: a run
// resumed from it counts on (pass 0 and its shrink saved, then pass 1 and its shrink: day 2).
TEST_F(ShrinkSchedule, AResumedRunCountsDaysOn) {
  const std::vector<std::string> saving = {"runner.shrink_every=pass",
                                           "runner.model_save_path=" + (root_ / "saves").string(),
                                           "runner.save_mode=checkpoint", "runner.resume=auto"};
  EXPECT_EQ(run({0}, saving).day, 1);
  std::vector<std::string> again = saving;
  again.push_back("runner.epochs=2");
  EXPECT_EQ(run({0}, again).day, 2);
}

// runner.shrink_every=epoch over one epoch of 3 passes: one shrink, after the last pass, so
// every row (each seen in some pass of the epoch) is unseen for exactly one day (a shrink after
// an earlier pass would leave the later passes' keys at 0). The passes after the first were
// staged ahead (none follows a shrink).
TEST_F(ShrinkSchedule, EpochShrinksOncePerEpoch) {
  const RunResult got =
      run({0, 1, 2},
          {"runner.shrink_every=epoch", "hyper_parameters.sparse_optimizer.delete_threshold=-1",
           "hyper_parameters.sparse_optimizer.show_click_decay_rate=1"});
  EXPECT_EQ(got.day, 1);
  ASSERT_FALSE(got.rows.empty());
  for (const auto& [key, row] : got.rows)
    EXPECT_EQ(row[table::RowLayout::kUnseenDays], 1.0f) << "key " << key;
  for (std::size_t p = 1; p < kPasses; ++p) EXPECT_GT(extra(got, p, "prefetched"), 0) << p;
}

// Which passes may be staged ahead while pass k trains: up to the next shrink (the oracle:
// the passes after k up to the first shrink point at or after k).
TEST(ShrinkStagedAhead, StopsAtTheNextShrink) {
  RunnerConfig runner;
  for (const auto every : {ShrinkEvery::kNever, ShrinkEvery::kPass, ShrinkEvery::kEpoch}) {
    runner.shrink_every = every;
    constexpr int64_t kPerEpoch = 3;
    constexpr int64_t kTotal = 7;  // the last epoch cut short
    for (int64_t k = 0; k < kTotal; ++k) {
      int64_t want = kTotal;
      for (int64_t j = k; j < kTotal; ++j) {
        if (shrinks_after(runner, (j + 1) % kPerEpoch == 0)) {
          want = j + 1;
          break;
        }
      }
      EXPECT_EQ(staged_ahead_end(runner, kPerEpoch, kTotal, k), want)
          << "pass " << k << " shrink_every " << static_cast<int>(every);
    }
  }
}

// never (the default) changes nothing: the same weights and rows as a run without the key.
TEST_F(ShrinkSchedule, NeverIsTheDefaultBitForBit) {
  const RunResult never = run({0, 1, 2}, {"runner.shrink_every=never"});
  const RunResult plain = run({0, 1, 2}, {});
  ASSERT_EQ(never.dense.size(), plain.dense.size());
  EXPECT_EQ(std::memcmp(never.dense.data(), plain.dense.data(), plain.dense.size() * sizeof(float)),
            0);
  EXPECT_EQ(never.rows, plain.rows);
  EXPECT_EQ(never.day, 0);
  // never stages every pass after the first ahead (config_gpubox.yaml: prefetch_passes 1); a
  // shrink after every pass stages none.
  const RunResult each = run({0, 1, 2}, {"runner.shrink_every=pass"});
  for (std::size_t p = 1; p < kPasses; ++p) {
    EXPECT_GT(extra(never, p, "prefetched"), 0) << "pass " << p;
    EXPECT_EQ(extra(each, p, "prefetched"), 0) << "pass " << p;
  }
}

}  // namespace
}  // namespace gpubox::trainer
