// Issue 32, training level: a gpubox-mode job whose server takes several runner.server_timeout_s
// to SAVE and to LOAD (every file operation slowed, tests/table/server/slow_io_tier.hpp) still
// writes its pass's save, and a new job loads that save from such a server: the trainer bounds a
// SAVE or LOAD by the time its server reports no progress, not by the call's total time
// (table/server/transport.hpp, run_with_progress).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "table/io/model_manifest.hpp"
#include "table/server/server.hpp"
#include "table/sparse_table.hpp"
#include "tests/common/test_data_config.hpp"
#include "tests/dataset/planted_data.hpp"
#include "tests/table/server/slow_io_tier.hpp"
#include "trainer/engine/trainer.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;
using table::server::testing::SlowIoTier;

constexpr double kServerTimeoutS = 1.5;
constexpr std::chrono::milliseconds kOpDelay{250};  // each file operation of the server's calls

// One gpubox_server over an in-process table whose saves and loads are slowed; saves stay
// inside `data_dir`.
class SlowServer {
 public:
  SlowServer(const TrainerConfig& config, const fs::path& data_dir) {
    auto table = table::SparseTable::open(config.sparse, config.host_tier.table);
    throw_if_error(table.status());
    table_ = std::move(table).value();
    slow_ = std::make_unique<SlowIoTier>(*table_, kOpDelay);
    table::server::ServerOptions options;
    options.data_dir = data_dir.string();
    options.progress_interval_s = 0.1;
    auto server = table::server::Server::start(slow_.get(), options);
    throw_if_error(server.status());
    server_ = std::move(server).value();
  }
  std::string endpoint() const { return server_->endpoint(); }
  // The seconds the server's calls spent in their slowed file operations alone so far.
  double slowed_s() const {
    return static_cast<double>(slow_->ops()) * std::chrono::duration<double>(kOpDelay).count();
  }

 private:
  std::unique_ptr<table::SparseTable> table_;
  std::unique_ptr<SlowIoTier> slow_;
  std::unique_ptr<table::server::Server> server_;
};

TEST(SlowServerSaves, AJobSavesAndANewJobLoadsThroughAServerSlowerThanItsTimeout) {
  const fs::path root =
      fs::temp_directory_path() / ("gpubox_slow_server_saves_" + std::to_string(::getpid()));
  fs::remove_all(root);
  gpubox::testing::write_small_train_test(root, 3000, 300, 11, 8, 3, 2000, 2);
  const std::string saves = (root / "saves").string();
  const std::vector<std::string> keys = {
      "runner.train_data_dir=" + (root / "train").string(),
      "runner.test_data_dir=",
      "runner.print_interval=1000000",
      "runner.host_table_shards=4",
      "runner.save_mode=checkpoint",
      "runner.server_timeout_s=" + std::to_string(kServerTimeoutS),
      "hyper_parameters.fc_sizes=[16, 8]"};
  std::vector<std::string> saving = keys;
  saving.push_back("runner.model_save_path=" + saves);
  const TrainerConfig save_cfg = testing::load_test_config(testing::test_data_overrides(), saving);
  {
    SlowServer server(save_cfg, root);
    TrainerEnv env;
    env.servers = server.endpoint();
    env.threads_per_card = 1;
    Trainer trainer(save_cfg, env);
    const double before = server.slowed_s();
    EXPECT_EQ(trainer.train().size(), 1u);  // pass 0, saved under saves/0
    const double save_s = server.slowed_s() - before;
    std::printf("the pass's SAVE: at least %.2f s on the server, runner.server_timeout_s %.1f\n",
                save_s, kServerTimeoutS);
    EXPECT_GE(save_s, 2 * kServerTimeoutS);
  }
  const std::string save = saves + "/0";
  ASSERT_TRUE(fs::exists(fs::path(save) / table::io::kModelManifestName));
  const TrainerConfig load_cfg = testing::load_test_config(testing::test_data_overrides(), keys);
  {
    SlowServer server(load_cfg, root);
    TrainerEnv env;
    env.servers = server.endpoint();
    env.threads_per_card = 1;
    Trainer trainer(load_cfg, env);
    const double before = server.slowed_s();
    EXPECT_NO_THROW(trainer.load(save));
    const double load_s = server.slowed_s() - before;
    std::printf("the job's LOAD: at least %.2f s on the server\n", load_s);
    EXPECT_GE(load_s, 2 * kServerTimeoutS);
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace gpubox::trainer
