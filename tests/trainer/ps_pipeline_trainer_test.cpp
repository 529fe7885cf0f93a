// Issue 32: the async mode's read-ahead inside PsTrainer's pass loop (ps_trainer_pass.cpp): one
// trainer of two threads against two servers pushes every occurrence of every key in the pass's
// data to the servers' show counts exactly once, none lost between a read-ahead and its step,
// none counted twice, and pulls no key the data does not hold; a stopped pass trains the batch
// it read ahead.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/status.hpp"
#include "dataset/generator.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "table/sparse_row/accessor.hpp"
#include "tests/dataset/planted_data.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/trainer/ps_pipeline_util.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/schedule/schedule.hpp"
#include "trainer/schedule/trainer_env.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

namespace fs = std::filesystem;

// Every batch of `files` as one reader makes them (the order and split do not matter here).
std::vector<dataset::Batch> read_batches(const TrainerConfig& cfg,
                                         const std::vector<std::string>& files) {
  dataset::InMemoryDataset data(cfg.dataset);
  data.set_filelist(files);
  data.set_batch_size(cfg.dataset.batch_size);
  throw_if_error(data.load_into_memory());
  std::vector<dataset::Batch> batches(data.num_batches_per_card(1));
  for (std::size_t i = 0; i < batches.size(); ++i) data.fill_batch(0, 1, i, &batches[i]);
  return batches;
}

TEST(PsTrainerReadAhead, AnAsyncPassOfTwoThreadsPushesEveryOccurrenceOnce) {
  GPUBOX_REQUIRE_CARDS(2);  // a training thread a card
  const fs::path root =
      fs::temp_directory_path() / ("gpubox_ps_read_ahead_" + std::to_string(::getpid()));
  fs::remove_all(root);
  dataset::OracleSummary oracle;
  gpubox::testing::write_planted_train_test(root, &oracle);
  const TrainerConfig cfg =
      ps_test_config({"runner.sync_mode=async", "runner.thread_num=2", "runner.dense_sync_steps=3",
                      "hyper_parameters.sparse_optimizer.embed_threshold=0",
                      "hyper_parameters.sparse_optimizer.embedx_threshold=0"});
  const std::vector<std::string> train = data_files((root / "train").string());
  std::map<uint64_t, double> occurrences;
  const std::vector<dataset::Batch> batches = read_batches(cfg, train);
  for (const dataset::Batch& batch : batches) {
    for (const uint64_t key : batch.keys) occurrences[key] += 1.0;
  }
  ASSERT_GT(occurrences.size(), 100u);

  Servers shards(cfg, 2);
  {
    TrainerEnv env;
    env.servers = shards.endpoints();
    env.selected_cards = device::testing::card_list(2);  // cuda: the threads' cards
    PsTrainer trainer(cfg, env);
    ASSERT_EQ(trainer.threads(), 2);
    trainer.train_pass(train);
  }
  const std::unique_ptr<RemoteHostTier> servers = connect(shards, cfg);
  const std::map<uint64_t, std::vector<float>> rows = peek_rows(*servers, batches);
  ASSERT_EQ(rows.size(), occurrences.size());
  std::size_t wrong = 0;
  for (const auto& [key, row] : rows) {
    const double show = row[table::RowLayout::kShow];
    if (show != occurrences.at(key) && ++wrong <= 10) {
      ADD_FAILURE() << "key " << key << ": show " << show << ", occurrences "
                    << occurrences.at(key);
    }
  }
  EXPECT_EQ(wrong, 0u) << "of " << rows.size() << " keys";
  // Every row the servers hold is a key of the data (no read-ahead of a batch that was not
  // there).
  uint64_t held = 0;
  for (int s = 0; s < 2; ++s) {
    StatusOr<uint64_t> size = shards.table(s).size();
    ASSERT_TRUE(size.ok()) << size.status().to_string();
    held += *size;
  }
  EXPECT_EQ(held, occurrences.size());
  fs::remove_all(root);
}

// A pass stopped between two steps (the flag set after a step, while the next batch's rows are
// being read ahead) trains the batch it read ahead before it stops: every row on the servers
// has a show. (Discarding that batch would leave its new keys' rows, created by the pull, with
// none.)
TEST(PsTrainerReadAhead, AStoppedPassTrainsEveryBatchItPulledTheRowsOf) {
  const fs::path root =
      fs::temp_directory_path() / ("gpubox_ps_read_ahead_stop_" + std::to_string(::getpid()));
  fs::remove_all(root);
  dataset::OracleSummary oracle;
  gpubox::testing::write_planted_train_test(root, &oracle);
  const TrainerConfig cfg =
      ps_test_config({"runner.sync_mode=async", "runner.train_batch_size=64",
                      "hyper_parameters.sparse_optimizer.embed_threshold=0",
                      "hyper_parameters.sparse_optimizer.embedx_threshold=0",
                      // Progress after every step: with the fixture's interval, the first came
                      // after 0.25 s or at the last step, and a pass of one trainer that ends
                      // before its flag is seen is whole (not stopped), so the test flaked.
                      "runner.print_interval=1"});
  Servers shards(cfg, 2);
  std::atomic<bool> stop{false};
  std::size_t stopped_after = 0;
  {
    TrainerEnv env;
    env.servers = shards.endpoints();
    PsTrainer trainer(cfg, env);
    StepHooks hooks;
    hooks.stop_flag = &stop;
    hooks.on_progress = [&](const StepProgress&) { stop.store(true); };
    trainer.set_step_hooks(hooks);
    try {
      trainer.train_pass(data_files((root / "train").string()));
      ADD_FAILURE() << "the pass was not stopped";
    } catch (const PassStopped& e) {
      stopped_after = 1;
      std::printf("%s\n", e.what());
    }
  }
  ASSERT_EQ(stopped_after, 1u);
  std::size_t rows = 0;
  std::size_t without_show = 0;
  for (int s = 0; s < 2; ++s) {
    throw_if_error(shards.table(s).for_each_row([&](uint64_t key, const float* row) {
      ++rows;
      if (row[table::RowLayout::kShow] == 0.0f && ++without_show <= 5) {
        ADD_FAILURE() << "key " << key << " was pulled but never trained";
      }
    }));
  }
  EXPECT_GT(rows, 0u);
  EXPECT_EQ(without_show, 0u) << "of " << rows << " rows";
  fs::remove_all(root);
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
