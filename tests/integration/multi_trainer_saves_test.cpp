// Several trainer processes saving with one gpubox_server: 2 x 2 saves what 1 x 4 saves (sparse
// rows and dense half within a stated tolerance: the dense all-reduce's order of summation
// differs), a save (and a delta chain) loaded into 2 trainers evaluates to the 1-trainer load's
// test AUC, trainers loading different saves refuse, a SAVE refused on trainer 0 ends every
// trainer, a job run again (also after a kill) resumes from its last complete save on every
// trainer, and several trainers with the in-process host tier refuse saves naming --servers.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "tests/integration/child_process.hpp"
#include "tests/integration/multi_trainer_fixture.hpp"

namespace gpubox {
namespace {

namespace fs = std::filesystem;
using multi_trainer_test::kLinesPerFile;
using multi_trainer_test::kRunSeconds;
using multi_trainer_test::kSteps;
using multi_trainer_test::MultiTrainer;
using testing::ChildProcess;

// The tolerance between the 2 x 2 and 1 x 4 saves: they differ only by the order in which the
// dense gradients are summed (Gloo's ring against rank order), roundings of 1e-7 relative
// that 2 passes carry into the weights (3.3e-7 measured after pass 1).
constexpr double kSaveTolerance = 1e-5;

TEST_F(MultiTrainer, TwoByTwoSavesWhatOneByFourSavesAndLoadsIt) {
  const std::vector<std::string> two_passes = {"-o", "runner.epochs=2", "-o",
                                               "runner.save_mode=checkpoint"};
  auto with_save = [&](const std::string& save) {
    std::vector<std::string> args = two_passes;
    args.insert(args.end(), {"-o", "runner.model_save_path=" + (root_ / save).string()});
    return args;
  };
  std::string endpoint;
  {
    auto server = start_server(&endpoint);
    run_job_outputs("save_one", 1, "0,1,2,3", "train_1x4", with_save("saves_1x4"), endpoint);
  }
  std::vector<std::string> two;
  {
    auto server = start_server(&endpoint);
    two = run_job_outputs("save_two", 2, "0,1", "train_2x2", with_save("saves_2x2"), endpoint);
  }
  ASSERT_EQ(two.size(), 2u);
  for (int pass : {0, 1}) {
    const fs::path one_dir = root_ / "saves_1x4" / std::to_string(pass);
    const fs::path two_dir = root_ / "saves_2x2" / std::to_string(pass);
    ASSERT_TRUE(fs::exists(two_dir / "MODEL_MANIFEST")) << two[0] << "\n" << two[1];
    const SavedModel saved_one = read_save(one_dir);
    const SavedModel saved_two = read_save(two_dir);
    EXPECT_GT(saved_one.rows.size(), 100u);
    const double worst = max_difference(saved_one, saved_two);
    std::printf("pass %d: %zu rows, %zu dense values; largest difference 2 x 2 vs 1 x 4: %.3g\n",
                pass, saved_one.rows.size(), saved_one.dense.size(), worst);
    EXPECT_LE(worst, kSaveTolerance) << "pass " << pass;
  }
  // The same save evaluated by 1 trainer x 4 cards and by 2 trainers x 2 cards: the same
  // predictions, so the same test AUC.
  const fs::path save = root_ / "saves_2x2" / "1";
  const auto [one_out, two_out] =
      one_by_four_and_two_by_two("infer", {"--mode", "infer", "--load", save.string()});
  const double auc_one = last_value(one_out, ", auc: ");
  const double auc_two = last_value(two_out, ", auc: ");
  ASSERT_FALSE(std::isnan(auc_one)) << one_out;
  ASSERT_FALSE(std::isnan(auc_two)) << two_out;
  EXPECT_GT(auc_one, 0.52) << one_out;
  std::printf("the pass 1 save evaluated: test auc 1 x 4 %.6f, 2 x 2 %.6f\n", auc_one, auc_two);
  EXPECT_NEAR(auc_two, auc_one, 1e-6) << "1 x 4:\n" << one_out << "\n2 x 2:\n" << two_out;
  EXPECT_EQ(last_value(two_out, "examples: "), 2.0 * kSteps * kLinesPerFile);
  // Training on from the save (runner.model_init_path): 2 x 2 as 1 x 4, within the dense
  // all-reduce's rounding.
  const auto [init_one, init_two] = one_by_four_and_two_by_two(
      "init", {"-o", "runner.epochs=1", "-o", "runner.model_init_path=" + save.string()});
  const double init_auc_one = last_value(init_one, "epoch: 0, test auc: ");
  ASSERT_FALSE(std::isnan(init_auc_one)) << init_one;
  std::printf("a pass from the save: test auc 1 x 4 %.6f, 2 x 2 %.6f\n", init_auc_one,
              last_value(init_two, "epoch: 0, test auc: "));
  EXPECT_NE(init_two.find("starting from runner.model_init_path"), std::string::npos) << init_two;
  EXPECT_NEAR(last_value(init_two, "epoch: 0, test auc: "), init_auc_one, 0.001) << init_one << "\n"
                                                                                 << init_two;
  // Trainers that would load different saves refuse, each naming the mismatch.
  {
    auto server = start_server(&endpoint);
    auto trainer0 = start_trainer(
        "infer_mixed", 0, 2, "0,1", "train_2x2",
        {"--mode", "infer", "--load", (root_ / "saves_2x2" / "0").string()}, endpoint);
    auto trainer1 = start_trainer("infer_mixed", 1, 2, "0,1", "train_2x2",
                                  {"--mode", "infer", "--load", save.string()}, endpoint);
    for (auto* trainer : {trainer0.get(), trainer1.get()}) {
      EXPECT_NE(trainer->wait(kRunSeconds), 0) << trainer->output();
      EXPECT_NE(trainer->output().find("every trainer must see the same save"), std::string::npos)
          << trainer->output();
    }
  }
}

TEST_F(MultiTrainer, SaveThatFailsOnTrainerZeroEndsEveryTrainerNamingIt) {
  // The server's --data_dir does not hold model_save_path: it refuses trainer 0's SAVE.
  fs::create_directories(root_ / "server_data");
  std::string endpoint;
  auto server = start_server(&endpoint, root_ / "server_data");
  const std::vector<std::string> args = {
      "-o", "runner.epochs=1", "-o",
      "runner.model_save_path=" + (root_ / "saves_outside").string()};
  auto trainer0 = start_trainer("save_refused", 0, 2, "0,1", "train_2x2", args, endpoint);
  auto trainer1 = start_trainer("save_refused", 1, 2, "0,1", "train_2x2", args, endpoint);
  EXPECT_NE(trainer0->wait(kRunSeconds), 0) << trainer0->output();
  EXPECT_NE(trainer1->wait(kRunSeconds), 0) << trainer1->output();
  EXPECT_NE(trainer0->output().find("saving the sparse table under"), std::string::npos)
      << trainer0->output();
  EXPECT_NE(trainer1->output().find("trainer 0 failed writing the save"), std::string::npos)
      << trainer1->output();
  EXPECT_FALSE(fs::exists(root_ / "saves_outside" / "0" / "MODEL_MANIFEST"));
}

TEST_F(MultiTrainer, RerunJobResumesFromItsLastDeltaChainOnEveryTrainer) {
  std::string endpoint;
  auto server = start_server(&endpoint);
  // save_mode delta: pass 0's save is a base (nothing to apply onto), pass 1's a delta on it.
  const std::vector<std::string> args = {
      "-o", "runner.save_mode=delta", "-o",
      "runner.model_save_path=" + (root_ / "saves_resume").string()};
  std::vector<std::string> first = args;
  first.insert(first.end(), {"-o", "runner.epochs=1"});
  run_job_outputs("resume_first", 2, "0,1", "train_2x2", first, endpoint);
  // The epoch's evaluation marked its save (trainer 0, in the folder every trainer shares). As if
  // the job had been killed before that evaluation ended: no mark. The rerun evaluates epoch 0
  // on every trainer before it trains pass 1 (it had left the epoch unevaluated, unsaid).
  const fs::path mark = root_ / "saves_resume" / "0" / ".gpubox_evaluated";
  ASSERT_TRUE(fs::exists(mark));
  fs::remove(mark);
  // Run again with one epoch more: every trainer loads pass 0's save and trains pass 1 only.
  std::vector<std::string> again = args;
  again.insert(again.end(), {"-o", "runner.epochs=2"});
  const auto outputs = run_job_outputs("resume_again", 2, "0,1", "train_2x2", again, endpoint);
  ASSERT_EQ(outputs.size(), 2u);
  for (const std::string& out : outputs) {
    EXPECT_NE(out.find("runner.resume: resuming from pass 0"), std::string::npos) << out;
    EXPECT_NE(out.find("epoch 0: the run before this one stopped after its last pass's save"),
              std::string::npos)
        << out;
  }
  EXPECT_EQ(outputs[0].find("pass: 0,"), std::string::npos) << outputs[0];
  EXPECT_NE(outputs[0].find("pass: 1,"), std::string::npos) << outputs[0];
  EXPECT_LT(outputs[0].find("epoch: 0, test auc"), outputs[0].find("pass: 1,")) << outputs[0];
  ASSERT_TRUE(fs::exists(root_ / "saves_resume" / "1" / "MODEL_MANIFEST")) << outputs[0];
  EXPECT_TRUE(fs::exists(mark));
  EXPECT_TRUE(fs::exists(root_ / "saves_resume" / "1" / ".gpubox_evaluated"));
  // Trainers that would start differently (one resumes, one starts afresh) refuse, naming it.
  // One epoch more again: the job's last save does not end it, so trainer 0 would resume it.
  {
    std::vector<std::string> more = args;
    more.insert(more.end(), {"-o", "runner.epochs=3"});
    std::vector<std::string> off = more;
    off.insert(off.end(), {"-o", "runner.resume=off"});
    auto trainer0 = start_trainer("resume_mixed", 0, 2, "0,1", "train_2x2", more, endpoint);
    auto trainer1 = start_trainer("resume_mixed", 1, 2, "0,1", "train_2x2", off, endpoint);
    for (auto* trainer : {trainer0.get(), trainer1.get()}) {
      EXPECT_NE(trainer->wait(kRunSeconds), 0) << trainer->output();
      EXPECT_NE(trainer->output().find("trainer 1 starts from scratch, trainer 0 by resuming"),
                std::string::npos)
          << trainer->output();
    }
    // One loads a save, the other not: the other names it as a load (its path read blank).
    std::vector<std::string> fresh = args;
    fresh.insert(fresh.end(), {"-o", "runner.model_save_path=", "-o", "runner.resume=off"});
    std::vector<std::string> loads = fresh;
    loads.insert(loads.end(), {"--load", (root_ / "saves_resume" / "1").string()});
    auto loader = start_trainer("load_mixed", 0, 2, "0,1", "train_2x2", loads, endpoint);
    auto plain = start_trainer("load_mixed", 1, 2, "0,1", "train_2x2", fresh, endpoint);
    EXPECT_NE(plain->wait(kRunSeconds), 0) << plain->output();
    EXPECT_NE(loader->wait(kRunSeconds), 0) << loader->output();
    EXPECT_NE(plain->output().find("trainer 1 starts from scratch, trainer 0 from a save it was "
                                   "given (--load or runner.model_init_path)"),
              std::string::npos)
        << plain->output();
  }
  // The delta chain loaded into 2 trainers evaluates as loaded into 1.
  const auto [one_out, two_out] = one_by_four_and_two_by_two(
      "delta", {"--mode", "infer", "--load", (root_ / "saves_resume" / "1").string()});
  const double auc_one = last_value(one_out, ", auc: ");
  ASSERT_FALSE(std::isnan(auc_one)) << one_out;
  EXPECT_NEAR(last_value(two_out, ", auc: "), auc_one, 1e-6) << one_out << "\n" << two_out;
}

TEST_F(MultiTrainer, KilledJobRerunResumesFromTheLastCompleteSave) {
  std::string endpoint;
  auto server = start_server(&endpoint);
  const fs::path saves = root_ / "saves_killed";
  auto args = [&](int epochs) {
    return std::vector<std::string>{"-o", "runner.save_mode=checkpoint",
                                    "-o", "runner.model_save_path=" + saves.string(),
                                    "-o", "runner.epochs=" + std::to_string(epochs)};
  };
  auto trainer0 = start_trainer("killed_save", 0, 2, "0,1", "train_2x2", args(200), endpoint);
  auto trainer1 = start_trainer("killed_save", 1, 2, "0,1", "train_2x2", args(200), endpoint);
  ASSERT_TRUE(trainer0->wait_for("pass: 2,", kRunSeconds)) << trainer0->output();
  trainer1->signal(SIGKILL);
  EXPECT_EQ(trainer1->wait(10), 128 + SIGKILL);
  EXPECT_NE(trainer0->wait(30), 0) << trainer0->output();
  // The newest save with a model manifest (one being written when the job died has none).
  int last = -1;
  for (const auto& entry : fs::directory_iterator(saves)) {
    if (fs::exists(entry.path() / "MODEL_MANIFEST"))
      last = std::max(last, std::stoi(entry.path().filename().string()));
  }
  ASSERT_GE(last, 1);
  const auto outputs =
      run_job_outputs("killed_rerun", 2, "0,1", "train_2x2", args(last + 2), endpoint);
  ASSERT_EQ(outputs.size(), 2u);
  for (const std::string& out : outputs) {
    EXPECT_NE(out.find("runner.resume: resuming from pass " + std::to_string(last)),
              std::string::npos)
        << out;
  }
  EXPECT_NE(outputs[0].find("pass: " + std::to_string(last + 1) + ","), std::string::npos)
      << outputs[0];
  EXPECT_TRUE(fs::exists(saves / std::to_string(last + 1) / "MODEL_MANIFEST")) << outputs[0];
}

// A gpubox-mode job on the servers of a running job trained on its rows, both exiting 0 (only
// the PS modes claimed the servers): refused now, naming it, and the running job goes on.
TEST_F(MultiTrainer, AJobOnTheServersOfARunningJobIsRefused) {
  std::string endpoint;
  auto server = start_server(&endpoint);
  const std::vector<std::string> quick = {"-o", "runner.peer_timeout_s=2"};
  std::vector<std::string> long_args = quick;
  long_args.insert(long_args.end(), {"-o", "runner.epochs=300"});
  auto running = start_trainer("owner_running", 0, 1, "0", "train2", long_args, endpoint);
  ASSERT_TRUE(running->wait_for("pass: 1,", kRunSeconds)) << running->output();
  auto second = start_trainer("owner_second", 0, 1, "0", "train2", quick, endpoint);
  EXPECT_EQ(second->wait(kRunSeconds), 1) << second->output();
  EXPECT_NE(second->output().find("serve another job that is running"), std::string::npos)
      << second->output();
  EXPECT_EQ(second->output().find("pass: 0,"), std::string::npos) << second->output();
  EXPECT_EQ(running->wait(0.1), -1) << "the running job ended:\n" << running->output();
  running->signal(SIGTERM);
  running->wait(30);
  // Ended (its claim released): the next job trains.
  run_job_outputs("owner_after", 1, "0", "train2", quick, endpoint);
}

// Trainers of one job in different modes (gpubox and a PS mode) met in different places (the
// rendezvous folder, the servers) and both waited out runner.collective_timeout_s, neither
// naming the modes. The PS trainer says its mode in the rendezvous folder: the gpubox trainer
// ends at once naming both; the PS trainer, at its start's meeting on the servers (its bound,
// here 10 s), names the gpubox trainer's failure.
TEST_F(MultiTrainer, TrainersOfOneJobInDifferentModesEndAtOnceNamingThem) {
  std::string endpoint;
  auto server = start_server(&endpoint);
  const auto started = std::chrono::steady_clock::now();
  auto gpubox = start_trainer("modes", 0, 2, "0,1", "train_2x2", {}, endpoint);
  auto async =
      start_trainer("modes", 1, 2, "0,1", "train_2x2", {"-o", "runner.sync_mode=async"}, endpoint);
  EXPECT_EQ(gpubox->wait(kRunSeconds), 1) << gpubox->output();
  EXPECT_NE(async->wait(kRunSeconds), 0) << async->output();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(30));
  EXPECT_NE(gpubox->output().find("trainer 1 of the job runs runner.sync_mode async"),
            std::string::npos)
      << gpubox->output();
  EXPECT_NE(async->output().find("trainer 0 of the job failed: "), std::string::npos)
      << async->output();
  // The other way round, trainer 1 in the gpubox mode ends at once naming trainer 0's mode.
  auto async_zero = start_trainer("modes_other", 0, 2, "0,1", "train_2x2",
                                  {"-o", "runner.sync_mode=async"}, endpoint);
  auto gpubox_one = start_trainer("modes_other", 1, 2, "0,1", "train_2x2", {}, endpoint);
  EXPECT_EQ(gpubox_one->wait(kRunSeconds), 1) << gpubox_one->output();
  EXPECT_NE(gpubox_one->output().find("trainer 0 of the job runs runner.sync_mode async"),
            std::string::npos)
      << gpubox_one->output();
  async_zero->signal(SIGKILL);
}

TEST_F(MultiTrainer, InProcessHostTierRefusesSavesNamingServers) {
  // Refused before the job meets: trainer 0 alone ends with the error.
  auto trainer = start_trainer("local_save", 0, 2, "0", "train2",
                               {"-o", "runner.model_save_path=" + (root_ / "local").string()});
  EXPECT_NE(trainer->wait(kRunSeconds), 0) << trainer->output();
  EXPECT_NE(trainer->output().find("--servers"), std::string::npos) << trainer->output();
}

}  // namespace
}  // namespace gpubox
