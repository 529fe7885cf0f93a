// A trainer's failure told to the others: one that fails for good is reported failed by the
// others' watches, naming what it reported; the next job on the same servers is not told of it; a
// trainer failing after another marked its failure marks none; a failed save stops the others at
// its meeting, naming it.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "table/server/remote_host_tier.hpp"
#include "tests/trainer/ps_modes_fixture.hpp"
#include "tests/trainer/ps_test_servers.hpp"
#include "trainer/config/config_loader.hpp"
#include "trainer/ps_modes/ps_peer_watch.hpp"
#include "trainer/ps_modes/ps_trainer.hpp"
#include "trainer/schedule/epoch_loop.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

namespace fs = std::filesystem;

using ps_test::PsModes;

// A trainer that fails for good (trainer 1: its share of the training data holds no valid
// instance) marks it with its heartbeat: trainer 0's watch reports it failed, naming what trainer 1
// reported, long before runner.collective_timeout_s. In sync mode trainer 0 waits at a barrier
// that cannot be woken: it is ended exit_grace_s later, as for a lost trainer, with that reason; in
// async mode its threads stop between steps with it (and the process is ended likewise). Without
// the mark, trainer 0's watch would report trainer 1 lost by its stopped heartbeat ("lost trainer
// 1"), or trainer 0 would wait out its barrier ("a trainer died or is stuck"). A death test: the
// forced exit ends the process.
TEST_F(PsModes, AFailedTrainerIsReportedFailedByTheOthersWithWhatItReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const fs::path data = root_ / "one_share_malformed";
  const fs::path bad = data / "part-1";
  for (const char* mode : {"sync", "async"}) {
    SCOPED_TRACE(mode);
    const auto job = [&] {
      fs::create_directories(data);
      fs::copy_file(data_files((root_ / "train").string()).at(0), data / "part-0",
                    fs::copy_options::overwrite_existing);
      {
        std::ofstream out(bad);
        for (int i = 0; i < 10; ++i) out << "1 0 1:" << 100 + i << "\n";
      }
      const TrainerConfig cfg =
          config({"runner.train_data_dir=" + data.string(),
                  "runner.test_data_dir=", std::string("runner.sync_mode=") + mode,
                  "runner.epochs=1", "runner.collective_timeout_s=600", "runner.peer_timeout_s=5"});
      Servers shards(cfg, 1);
      const std::vector<std::string> errors =
          ps_test::run_trainers(cfg, shards.endpoints(), 2, [](PsTrainer& trainer, int) {
            trainer.train();
          }).errors;
      // Trainer 0 stopped between steps (its train() unwound, which cancels the forced end of a
      // reported failure); one blocked in a barrier never gets here: the forced end comes.
      std::fprintf(stderr, "trainer 0's error: %s\n", errors[0].c_str());
      std::fflush(stderr);
      std::_Exit(1);
    };
    // The child's root_ is its own (its process id): the path is matched by its end. Either
    // trainer 0's error or the forced end's line ("gpubox_train: ...") names it.
    const std::string reported =
        "trainer 1 of 2 failed: pass 0: no valid instance in 1 file\\(s\\) \\(10 lines, 10 "
        "malformed\\): [^ ]*/one_share_malformed/part-1";
    EXPECT_EXIT(job(), ::testing::ExitedWithCode(1), reported);
  }
}

// Job A's trainer 1 failed, leaving its mark on the servers: job B on the same servers starts
// clean (the job's start resets the marks) and trains without anyone reported failed. (The mark
// is made after job A's train(), the run it belongs to: outside any train() nothing is marked.)
TEST_F(PsModes, AJobAfterOneWhoseTrainerFailedIsNotToldOfIt) {
  const TrainerConfig cfg = config({"runner.train_data_dir=" + (root_ / "train").string(),
                                    "runner.test_data_dir=", "runner.sync_mode=sync",
                                    "runner.epochs=1", "runner.peer_timeout_s=1"});
  Servers shards(cfg, 1);
  ps_test::TrainerJob job_a = ps_test::run_trainers(
      cfg, shards.endpoints(), 2, [](PsTrainer& trainer, int) { trainer.train(); });
  ASSERT_TRUE(job_a.trainers[0] && job_a.trainers[1]);
  job_a.trainers[1]->tell_failure(std::runtime_error("job A's trainer 1 failed"));
  auto& servers = dynamic_cast<table::server::RemoteHostTier&>(job_a.trainers[0]->host_tier());
  StatusOr<std::string> mark = PsPeerWatch::failure_of(servers, 1, 2, PsPeerWatch::kAnyRun);
  ASSERT_TRUE(mark.ok()) << mark.status().to_string();
  ASSERT_EQ(*mark, "job A's trainer 1 failed");
  // Job A ends (its trainer 0 releases the servers: servers_owner.hpp); its mark stays.
  for (auto& trainer : job_a.trainers) trainer.reset();
  const std::vector<std::string> errors =
      ps_test::run_trainers(cfg, shards.endpoints(), 2, [](PsTrainer& trainer, int) {
        trainer.train();
      }).errors;
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

// Both trainers fail (a failure they hit at once): trainer 1 tells first, so trainer 0, finding
// trainer 1's failed flag set, does not mark its own (its watch would report trainer 0 failed,
// ending its process exit_grace_s later). Told after their first train() returned, the marks
// belong to run 1: the first train() of a PsTrainer is run 1 (its flag's value).
TEST_F(PsModes, ATrainerFailingAfterAnotherMarkedItsFailureMarksNone) {
  const TrainerConfig cfg = config({"runner.train_data_dir=" + (root_ / "train").string(),
                                    "runner.test_data_dir=", "runner.sync_mode=async",
                                    "runner.epochs=1", "runner.peer_timeout_s=5"});
  Servers shards(cfg, 1);
  const ps_test::TrainerJob job = ps_test::run_trainers(
      cfg, shards.endpoints(), 2, [](PsTrainer& trainer, int) { trainer.train(); });
  ASSERT_TRUE(job.trainers[0] && job.trainers[1]);
  job.trainers[1]->tell_failure(std::runtime_error("pass 0 diverged"));
  job.trainers[0]->tell_failure(std::runtime_error("pass 0 diverged"));
  auto& servers = dynamic_cast<table::server::RemoteHostTier&>(job.trainers[0]->host_tier());
  StatusOr<int> flagged = PsPeerWatch::failed_peer(servers, 1, 2, /*run=*/1);
  ASSERT_TRUE(flagged.ok()) << flagged.status().to_string();
  EXPECT_EQ(*flagged, -1) << "trainer 0 marked its failure too";
  flagged = PsPeerWatch::failed_peer(servers, 0, 2, /*run=*/1);
  ASSERT_TRUE(flagged.ok()) << flagged.status().to_string();
  EXPECT_EQ(*flagged, 1);
  std::vector<float> alive(PsPeerWatch::kAliveSections * 2, 0.0f);
  ASSERT_TRUE(
      servers.dense(table::server::DenseAction::kRead, PsPeerWatch::kAliveTable, &alive).ok());
  ASSERT_EQ(alive.size(), PsPeerWatch::kAliveSections * 2);
  EXPECT_EQ(alive[PsPeerWatch::kFailedSection * 2 + 1], 1.0f)
      << "trainer 1's failed flag: the run of its first train()";
  StatusOr<std::string> mark = PsPeerWatch::failure_of(servers, 0, 2, PsPeerWatch::kAnyRun);
  ASSERT_TRUE(mark.ok()) << mark.status().to_string();
  EXPECT_EQ(*mark, "");
}

// Trainer 0's part of a save fails, no server restarted (the servers refuse to save outside their
// --data_dir): trainer 1 stops at the meeting it waits at, naming what trainer 0 reported.
TEST_F(PsModes, AFailedSaveStopsTheOtherTrainersAtItsMeetingNamingIt) {
  const std::string saves = (root_ / "told_failed_saves").string();
  const std::string server_data = (root_ / "told_failed_server_data").string();
  const TrainerConfig cfg = config(
      {"runner.sync_mode=async", "runner.epochs=1", "runner.collective_timeout_s=60",
       "runner.train_data_dir=" + (root_ / "train").string(),
       "runner.test_data_dir=", "runner.save_mode=checkpoint", "runner.model_save_path=" + saves});
  fs::create_directories(server_data);
  Servers shards(cfg, 2, server_data);
  const std::vector<std::string> errors =
      ps_test::run_trainers(cfg, shards.endpoints(), 2, [&](PsTrainer& trainer, int) {
        run_epochs(trainer, cfg, "", false);
      }).errors;
  EXPECT_NE(errors[0].find("saving the sparse table under " + saves + "/0"), std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("trainer 0 failed to write the save " + saves +
                           "/0; trainer 0 reported: PermissionDenied: saving the sparse table "
                           "under " +
                           saves + "/0"),
            std::string::npos)
      << errors[1];
  EXPECT_NE(errors[1].find("is outside the server's data_dir"), std::string::npos) << errors[1];
}

}  // namespace
}  // namespace gpubox::trainer::ps_modes
