// runner.shrink_every=pass with several trainer processes (the fixture of multi_trainer_test:
// real gpubox_train binaries, Gloo over loopback): 2 trainers x 2 cards against a gpubox_server
// (trainer 0 alone shrinks the servers' table, the other waits), and Collective mode, 2
// trainers x 1 card (each trainer shrinks its own replica of the table). Three passes over the
// folders A, B, A (runner.pass_dirs), a shrink after each; deletion by unseen days only
// (delete_threshold -1, no decay, delete_after_unseen_days 1). The oracle: the keys each pass's
// files hold (the data set as the trainer loads it) replayed through the shrink rule of
// tests/table/shrink_oracle.hpp in an std::unordered_map: the keys of A that B lacks are deleted
// by the shrink after pass 1 and created again by pass 2, those of B that A lacks by the shrink
// after pass 2. Each pass's checkpoint (taken after its shrink) holds exactly the oracle's keys
// at the oracle's unseen days, and every trainer logs the oracle's count of rows deleted.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/error.hpp"
#include "dataset/generator.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "tests/integration/multi_trainer_fixture.hpp"
#include "tests/table/shrink_oracle.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/schedule/trainer_env.hpp"

namespace gpubox {
namespace {

namespace fs = std::filesystem;
using multi_trainer_test::MultiTrainer;

constexpr int kShrinkPasses = 3;

// The shrink rule of these tests (unseen days only), as gpubox_train options.
const std::vector<std::string> kRule = {
    "-o", "runner.shrink_every=pass",
    "-o", "hyper_parameters.sparse_optimizer.delete_threshold=-1",
    "-o", "hyper_parameters.sparse_optimizer.show_click_decay_rate=1",
    "-o", "hyper_parameters.sparse_optimizer.delete_after_unseen_days=1"};

class MultiTrainerShrink : public MultiTrainer {
 protected:
  // The pass folders A (the fixture's train2), B (other data of the same shape) and A again.
  static std::vector<fs::path> pass_dirs() {
    const fs::path b = root_ / "shrink_b";
    if (!fs::exists(b)) {
      dataset::GeneratorOptions gen;
      gen.out_dir = b.string();
      gen.lines = 2 * multi_trainer_test::kSteps * multi_trainer_test::kLinesPerFile;
      gen.files = 2 * multi_trainer_test::kSteps;
      gen.seed = 11;
      gen.slots = 6;
      gen.dense = 3;
      gen.vocab = 2000;
      dataset::OracleSummary oracle;
      throw_if_error(dataset::generate(gen, &oracle));
    }
    return {root_ / "train2", b, root_ / "train2"};
  }

  // gpubox_train options: the three passes, one epoch, the rule, a checkpoint after each pass
  // under `saves`, plus `extra`.
  static std::vector<std::string> args(const fs::path& saves,
                                       const std::vector<std::string>& extra) {
    const std::vector<fs::path> dirs = pass_dirs();
    std::string list = "runner.pass_dirs=[";
    for (std::size_t i = 0; i < dirs.size(); ++i) list += (i ? ", " : "") + dirs[i].string();
    std::vector<std::string> out = {"-o", list + "]",
                                    "-o", "runner.epochs=1",
                                    "-o", "runner.test_data_dir=",
                                    "-o", "runner.save_mode=checkpoint",
                                    "-o", "runner.model_save_path=" + saves.string()};
    out.insert(out.end(), kRule.begin(), kRule.end());
    out.insert(out.end(), extra.begin(), extra.end());
    return out;
  }

  // The oracle after each pass's shrink: key -> unseen days (rows as shrink_oracle.hpp ages
  // them), and the rows each shrink deleted.
  struct Expected {
    std::vector<std::map<uint64_t, float>> unseen;
    std::vector<uint64_t> deleted;
  };
  static Expected oracle() {
    auto config = trainer::load_trainer_config(
        (root_ / "config.yaml").string(),
        {"hyper_parameters.sparse_optimizer.delete_threshold=-1",
         "hyper_parameters.sparse_optimizer.show_click_decay_rate=1",
         "hyper_parameters.sparse_optimizer.delete_after_unseen_days=1"});
    throw_if_error(config.status());
    std::unordered_map<uint64_t, std::vector<float>> rows;
    Expected expected;
    for (const fs::path& dir : pass_dirs()) {
      dataset::InMemoryDataset data(config->dataset);
      data.set_filelist(trainer::data_files(dir.string()));
      throw_if_error(data.load_into_memory());
      for (uint64_t key : data.unique_keys()) {
        auto& row = rows[key];
        row.resize(table::RowLayout::kUnseenDays + 1);  // what the rule reads
        row[table::RowLayout::kUnseenDays] = 0;         // seen in this pass
      }
      expected.deleted.push_back(table::testing::shrink_rows(&rows, config->sparse));
      std::map<uint64_t, float>& unseen = expected.unseen.emplace_back();
      for (const auto& [key, row] : rows) unseen[key] = row[table::RowLayout::kUnseenDays];
    }
    return expected;
  }

  // Each pass's checkpoint under `saves` against the oracle; every output of `outputs` logs
  // each shrink's deletions as the oracle counts them.
  static void expect_as_the_oracle(const fs::path& saves, const std::vector<std::string>& outputs) {
    const Expected expected = oracle();
    ASSERT_GT(expected.deleted[1], 0u) << "A must hold keys that B lacks";
    ASSERT_GT(expected.deleted[2], 0u) << "B must hold keys that A lacks";
    for (int pass = 0; pass < kShrinkPasses; ++pass) {
      SCOPED_TRACE("pass " + std::to_string(pass));
      const fs::path dir = saves / std::to_string(pass);
      ASSERT_TRUE(fs::exists(dir / "MODEL_MANIFEST")) << outputs.front();
      const SavedModel saved = read_save(dir);
      std::map<uint64_t, float> unseen;
      for (const auto& [key, row] : saved.rows) unseen[key] = row[table::RowLayout::kUnseenDays];
      std::printf("pass %d: %zu rows after the shrink, %llu deleted by it (oracle)\n", pass,
                  unseen.size(), static_cast<unsigned long long>(expected.deleted[pass]));
      EXPECT_EQ(unseen.size(), expected.unseen[pass].size());
      EXPECT_TRUE(unseen == expected.unseen[pass]) << "the saved rows are not the oracle's";
      const std::string line = "shrank the sparse table after pass " + std::to_string(pass) + ": " +
                               std::to_string(expected.deleted[pass]) + " rows deleted";
      for (std::size_t t = 0; t < outputs.size(); ++t)
        EXPECT_NE(outputs[t].find(line), std::string::npos) << "trainer " << t << ":\n"
                                                            << outputs[t];
    }
  }
};

// gpubox mode, 2 trainers x 2 cards, one gpubox_server: trainer 0 shrinks the server's table
// (it logs the deletions; trainer 1 waits), and the server's rows are the oracle's.
TEST_F(MultiTrainerShrink, TwoTrainersWithAServerShrinkAsTheOracleSays) {
  std::string endpoint;
  auto server = start_server(&endpoint, {}, kRule);  // the server shrinks under the rule
  const fs::path saves = root_ / "shrink_saves_servers";
  const auto outputs =
      run_job_outputs("shrink_servers", 2, "0,1", "train2", args(saves, {}), endpoint);
  ASSERT_EQ(outputs.size(), 2u);
  expect_as_the_oracle(saves, {outputs[0]});
}

// Collective mode, 2 trainers x 1 card: each trainer shrinks its own in-process table (each
// logs the oracle's deletions), and trainer 0's checkpoint holds the oracle's rows.
TEST_F(MultiTrainerShrink, CollectiveTrainersEachShrinkAsTheOracleSays) {
  const fs::path saves = root_ / "shrink_saves_collective";
  const auto outputs = run_job_outputs("shrink_collective", 2, "0", "train2",
                                       args(saves, {"-o", "runner.use_fleet=true"}));
  ASSERT_EQ(outputs.size(), 2u);
  for (const std::string& out : outputs)
    EXPECT_NE(out.find("Collective mode"), std::string::npos) << out;
  expect_as_the_oracle(saves, outputs);
}

}  // namespace
}  // namespace gpubox
