// Issue 32: the async mode's read-ahead inside PsTrainer's pass loop (ps_trainer_pass.cpp): a
// stopped pass trains the batch it read ahead.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/status.hpp"
#include "dataset/generator.hpp"
#include "table/sparse_row/accessor.hpp"
#include "tests/dataset/planted_data.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/schedule/schedule.hpp"
#include "trainer/schedule/trainer_env.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

namespace fs = std::filesystem;

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
                      "hyper_parameters.sparse_optimizer.embedx_threshold=0"});
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
