// Issue 32, a job of 2 trainers (threads of this process; the PS async mode through the servers,
// the gpubox mode through Gloo over loopback) whose server's SAVE takes several
// runner.collective_timeout_s: the other trainer waits for trainer 0's save as long as the save
// moves (trainer/schedule/trainer_zero_work.hpp), and the job's pass is saved (likewise for
// trainer 0's LOAD as a new job resumes from that save, on a fresh server or on the one whose
// trainer0_work table the first job left); a save that stops
// moving (its server's file operation held, trainer 0's own client patient: a long
// runner.server_timeout_s) fails the other trainer within about runner.collective_timeout_s,
// naming trainer 0 and the save. Before, the other trainer waited at the meeting for
// runner.collective_timeout_s in all: it failed during a healthy long save, and named no trainer
// when the save was stuck. The server's file operations are held by
// tests/table/server/slow_io_tier.hpp: moving (the server reports PROGRESS) or stopped (it
// reports none).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "table/io/model_manifest.hpp"
#include "table/server/server.hpp"
#include "table/sparse_table.hpp"
#include "tests/common/scratch_root.hpp"
#include "tests/common/test_data_config.hpp"
#include "tests/dataset/planted_data.hpp"
#include "tests/heterps/device/test_cards.hpp"
#include "tests/table/server/slow_io_tier.hpp"
#include "trainer/engine/trainer.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;
using table::server::testing::SlowIoTier;

// Long enough that a trainer thread stalled by a loaded machine does not run out of it.
constexpr double kCollectiveTimeoutS = 4;
// Trainer 0's client's patience with a server that reports no progress (a moving hold reports).
constexpr double kServerTimeoutS = 4;
// How long a moving save is held: 2.5 runner.collective_timeout_s (the test stays near a minute).
constexpr std::chrono::seconds kMovingHold{10};

enum class Mode { kPsAsync, kGpubox };

// One gpubox_server over an in-process table whose SAVE's first file operation is held `how`
// (released by release(), or when the server goes).
class HeldSaveServer {
 public:
  HeldSaveServer(const TrainerConfig& config, const fs::path& data_dir, SlowIoTier::Hold how) {
    auto table = table::SparseTable::open(config.sparse, config.host_tier.table);
    throw_if_error(table.status());
    table_ = std::move(table).value();
    slow_ = std::make_unique<SlowIoTier>(*table_, std::chrono::milliseconds(0));
    slow_->hold_at(0, how);
    table::server::ServerOptions options;
    options.data_dir = data_dir.string();
    options.progress_interval_s = 0.1;
    auto server = table::server::Server::start(slow_.get(), options);
    throw_if_error(server.status());
    server_ = std::move(server).value();
  }
  ~HeldSaveServer() {
    slow_->release();
    server_.reset();
  }
  std::string endpoint() const { return server_->endpoint(); }
  bool holding() const { return slow_->holding(); }
  void release() { slow_->release(); }
  // The next file operation on is held moving again (a later job on the same server).
  void hold_again() { slow_->hold_again(SlowIoTier::Hold::kMoving); }

 private:
  std::unique_ptr<table::SparseTable> table_;
  std::unique_ptr<SlowIoTier> slow_;
  std::unique_ptr<table::server::Server> server_;
};

// A job of 2 trainers held by its server: whether the hold came; each trainer's error.
struct HeldJob {
  bool held = false;
  std::string errors[2];
};

class SlowJobSaves : public ::testing::TestWithParam<Mode> {
 protected:
  static void SetUpTestSuite() {
    root_ = gpubox::testing::scratch_root("gpubox_slow_job_saves");
    fs::remove_all(root_);
    gpubox::testing::write_small_train_test(root_, 3000, 300, 11, 8, 3, 2000, 2);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }
  void SetUp() override {
    if (GetParam() == Mode::kGpubox) GPUBOX_REQUIRE_CARDS(2);  // a card a trainer
  }

  // The job's config: `epochs` passes, each saved under `saves` (resuming the newest save
  // there); trainer 0's client waits
  // `server_timeout_s` for a server that reports no progress.
  static TrainerConfig config(const std::string& saves, double server_timeout_s, int epochs = 1) {
    std::vector<std::string> keys = {
        "runner.train_data_dir=" + (root_ / "train").string(),
        "runner.test_data_dir=",
        "runner.print_interval=1000000",
        "runner.epochs=" + std::to_string(epochs),
        "runner.save_mode=checkpoint",
        "runner.model_save_path=" + saves,
        "runner.server_timeout_s=" + std::to_string(server_timeout_s),
        "runner.collective_timeout_s=" + std::to_string(kCollectiveTimeoutS),
        "hyper_parameters.fc_sizes=[16, 8]"};
    if (GetParam() == Mode::kPsAsync) {
      keys.push_back("runner.sync_mode=async");
      keys.push_back("runner.split_file_list=true");
    }
    return testing::load_test_config(testing::test_data_overrides(), keys);
  }

  // Trainer w of the job of 2 against `servers`: its train() (the pass and its save); its error,
  // or "" when it ended well.
  static std::string train(const TrainerConfig& cfg, const std::string& servers, int w,
                           const std::string& rendezvous) {
    TrainerEnv env;
    env.servers = servers;
    env.trainer_id = w;
    env.trainers = 2;
    env.threads_per_card = 1;
    env.selected_cards = device::testing::trainer_card(w);
    env.rendezvous = "file://" + rendezvous;
    try {
      if (GetParam() == Mode::kPsAsync) {
        ps_modes::PsTrainer trainer(cfg, env);
        trainer.train();
      } else {
        Trainer trainer(cfg, env);
        trainer.train();
      }
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }

  // The job of 2 trainers with `cfg` on `server` (rendezvous folder `name`), its hold let go
  // kMovingHold after it came (run_held_job).
  static HeldJob train_job(const TrainerConfig& cfg, HeldSaveServer& server,
                           const std::string& name);

  static inline fs::path root_;
};

// Runs a job of 2 trainers on `server` (rendezvous folder `name`); once the server holds a file
// operation, lets it go kMovingHold later.
HeldJob run_held_job(HeldSaveServer& server, const std::string& name,
                     const std::function<std::string(int, const std::string&)>& train) {
  HeldJob job;
  std::atomic<int> ended{0};
  std::thread releaser([&] {
    while (!server.holding() && ended.load() < 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    job.held = server.holding();
    if (job.held) std::this_thread::sleep_for(kMovingHold);
    server.release();
  });
  std::vector<std::thread> trainers;
  for (int w = 0; w < 2; ++w) {
    trainers.emplace_back([&, w] {
      job.errors[w] = train(w, name);
      ++ended;
    });
  }
  for (auto& t : trainers) t.join();
  releaser.join();
  return job;
}

HeldJob SlowJobSaves::train_job(const TrainerConfig& cfg, HeldSaveServer& server,
                                const std::string& name) {
  return run_held_job(server, name, [&](int w, const std::string& n) {
    return train(cfg, server.endpoint(), w, (root_ / ("rendezvous_" + n)).string());
  });
}

// The job was held, both trainers ended well and save `pass` under `saves` is complete.
void expect_held_and_saved(const HeldJob& job, const std::string& saves, const char* pass) {
  EXPECT_TRUE(job.held);
  EXPECT_EQ(job.errors[0], "");
  EXPECT_EQ(job.errors[1], "");
  EXPECT_TRUE(fs::exists(fs::path(saves) / pass / table::io::kModelManifestName));
}

// The save's server holds its first file operation, moving (PROGRESS frames go on), for
// kMovingHold (2.5 runner.collective_timeout_s), then lets it go: both trainers end well and
// the pass's save is complete.
TEST_P(SlowJobSaves, ASaveLongerThanTheCollectiveTimeoutThatMovesIsWaitedFor) {
  const std::string name = GetParam() == Mode::kPsAsync ? "ps_moving" : "gpubox_moving";
  const std::string saves = (root_ / name).string();
  const TrainerConfig cfg = config(saves, kServerTimeoutS);
  HeldSaveServer server(cfg, root_, SlowIoTier::Hold::kMoving);
  const HeldJob job = train_job(cfg, server, name);
  expect_held_and_saved(job, saves, "0");
}

// The same for trainer 0's LOAD into the servers as a job resumes: a job saves pass 0, a new job
// of 2 trainers resumes from it on a server whose LOAD holds moving for kMovingHold, trains pass
// 1 and saves it.
TEST_P(SlowJobSaves, ALoadLongerThanTheCollectiveTimeoutThatMovesIsWaitedFor) {
  const std::string name = GetParam() == Mode::kPsAsync ? "ps_loading" : "gpubox_loading";
  const std::string saves = (root_ / name).string();
  {
    const TrainerConfig cfg = config(saves, kServerTimeoutS);
    HeldSaveServer server(cfg, root_, SlowIoTier::Hold::kMoving);
    server.release();
    const HeldJob job = train_job(cfg, server, name + "_first");
    ASSERT_EQ(job.errors[0] + job.errors[1], "");
  }
  ASSERT_TRUE(fs::exists(fs::path(saves) / "0" / table::io::kModelManifestName));
  const TrainerConfig cfg = config(saves, kServerTimeoutS, /*epochs=*/2);
  HeldSaveServer server(cfg, root_, SlowIoTier::Hold::kMoving);
  const HeldJob job = train_job(cfg, server, name + "_resumed");
  expect_held_and_saved(job, saves, "1");
}

// The same on a server that outlives its jobs: the first job leaves trainer 0's table there (its
// last part ended, numbered as the resumed job numbers its LOAD), yet the resumed job's LOAD,
// held moving for kMovingHold, is waited for: the table of another job is not this job's.
TEST_P(SlowJobSaves, ALongLoadIsWaitedForOnAServerAnEarlierJobLeftItsTableOn) {
  const std::string name = GetParam() == Mode::kPsAsync ? "ps_second_job" : "gpubox_second_job";
  const std::string saves = (root_ / name).string();
  const TrainerConfig first = config(saves, kServerTimeoutS);
  HeldSaveServer server(first, root_, SlowIoTier::Hold::kMoving);
  server.release();
  const HeldJob done = train_job(first, server, name + "_first");
  ASSERT_EQ(done.errors[0] + done.errors[1], "");
  ASSERT_TRUE(fs::exists(fs::path(saves) / "0" / table::io::kModelManifestName));
  const TrainerConfig cfg = config(saves, kServerTimeoutS, /*epochs=*/2);
  server.hold_again();
  const HeldJob job = train_job(cfg, server, name + "_resumed");
  expect_held_and_saved(job, saves, "1");
}

// The save's server holds its first file operation, stopped (no PROGRESS frame), and trainer 0's
// client would wait a minute for it: trainer 1 fails after runner.collective_timeout_s without a
// move, naming trainer 0 and the save. A death test: trainer 1 reports its error and ends the
// process (trainer 0 is still held in its SAVE).
TEST_P(SlowJobSaves, ASaveThatStopsMovingFailsTheOthersNamingTrainerZero) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string name = GetParam() == Mode::kPsAsync ? "ps_stopped" : "gpubox_stopped";
  const auto job = [&] {
    const TrainerConfig cfg = config((root_ / name).string(), 60);
    HeldSaveServer server(cfg, root_, SlowIoTier::Hold::kStopped);
    std::vector<std::thread> trainers;
    for (int w = 0; w < 2; ++w) {
      trainers.emplace_back([&, w] {
        const std::string error =
            train(cfg, server.endpoint(), w, (root_ / ("rendezvous_" + name)).string());
        if (w == 0) return;
        std::fprintf(stderr, "trainer 1's error: %s\n", error.c_str());
        std::fflush(stderr);
        std::_Exit(1);
      });
    }
    for (auto& t : trainers) t.join();
  };
  EXPECT_EXIT(job(), ::testing::ExitedWithCode(1),
              "trainer 1's error: .*trainer 0 made no progress to write the save "
              "[^ ]*/0 for 4 s \\(runner.collective_timeout_s\\): its part stopped moving");
}

INSTANTIATE_TEST_SUITE_P(Modes, SlowJobSaves, ::testing::Values(Mode::kPsAsync, Mode::kGpubox),
                         [](const ::testing::TestParamInfo<Mode>& info) {
                           return info.param == Mode::kPsAsync ? "PsAsync" : "Gpubox";
                         });

}  // namespace
}  // namespace gpubox::trainer
