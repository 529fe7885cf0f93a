// A run into a runner.model_save_path that holds an earlier run's saves
// (trainer/schedule/earlier_saves.hpp): its saves replace those of its passes, and once its job
// ends (its last save made) the earlier run's later saves are removed, so a rerun with fewer
// epochs leaves none for --mode infer, export or a resume to take as this run's result; a run
// stopped before its end removes nothing, and its resume continues it; a save folder holding
// files a save does not write is refused at start, naming it; the save the run starts from is
// kept however it is spelled.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "table/io/model_manifest.hpp"
#include "tests/integration/resume_fixture.hpp"
#include "trainer/engine/trainer.hpp"
#include "trainer/schedule/earlier_saves.hpp"
#include "trainer/schedule/saved_models.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;
namespace io = table::io;

class FreshRunSaves : public testing::ResumeFixture {
 protected:
  static io::ModelManifest manifest_of(const fs::path& save) {
    auto m = io::read_model_manifest(io::FileEnv::posix(), save.string());
    throw_if_error(m.status());
    return m.value();
  }
  // The saves --mode infer evaluates in [first, end) (end -1: through the last).
  static std::vector<std::string> evaluated_until(const fs::path& dir, int64_t end,
                                                  int64_t first = 0) {
    std::vector<std::string> out;
    for (const SaveToEvaluate& s : saves_to_evaluate(dir.string(), first, end)) {
      out.push_back(fs::path(s.dir).filename().string());
    }
    return out;
  }
  static std::vector<std::string> evaluated(const fs::path& dir) {
    return evaluated_until(dir, -1);
  }
};

// 3 epochs, then the same job with 1: the rerun trains afresh (the earlier run ended its job),
// and --mode infer's folder of saves (and export's last save) is its epoch 0 alone, not the
// earlier run's epochs 1 and 2 after it. Then another config with resume off: the same.
TEST_F(FreshRunSaves, ARerunWithFewerEpochsLeavesNoLaterSaveOfTheEarlierRun) {
  const fs::path dir = root_ / "fewer";
  Trainer(config(dir, {"runner.epochs=3"}), env()).train();
  ASSERT_EQ(evaluated(dir), (std::vector<std::string>{"0", "1", "2"}));
  ASSERT_EQ(manifest_of(dir / "0").job_passes, 3);
  const uint64_t earlier_last = manifest_of(dir / "2").sequence;
  fs::create_directories(dir / "notes");  // not a save: kept
  std::ofstream(dir / "notes" / "run.txt") << "kept\n";

  Trainer(config(dir, {"runner.epochs=1"}), env()).train();
  EXPECT_EQ(evaluated(dir), (std::vector<std::string>{"0"}));
  EXPECT_EQ(manifest_of(dir / "0").job_passes, 1);           // this run's
  EXPECT_GT(manifest_of(dir / "0").sequence, earlier_last);  // sequences still order runs
  EXPECT_FALSE(fs::exists(dir / "1"));
  EXPECT_FALSE(fs::exists(dir / "2"));
  EXPECT_TRUE(fs::exists(dir / "notes" / "run.txt"));

  Trainer(config(dir, {"runner.epochs=2"}), env()).train();  // resumes: pass 1 added
  ASSERT_EQ(evaluated(dir), (std::vector<std::string>{"0", "1"}));
  Trainer(config(dir, {"runner.epochs=1", "runner.resume=off", "hyper_parameters.fc_sizes=[4]"}),
          env())
      .train();
  EXPECT_EQ(evaluated(dir), (std::vector<std::string>{"0"}));
}

// The same with test data: every save of the earlier run holds its evaluation mark, which the
// rerun refused as "not written by a save" (a helper's probe): the documented flow worked only
// without test data.
TEST_F(FreshRunSaves, ARerunWithFewerEpochsAndTestDataRemovesTheMarkedSaves) {
  const fs::path dir = root_ / "fewer_evaluated";
  const std::string test = "runner.test_data_dir=" + (root_ / "train").string();
  Trainer(config(dir, {"runner.epochs=3", test}), env()).train();
  ASSERT_TRUE(fs::exists(dir / "2" / kEvaluatedMark));
  Trainer(config(dir, {"runner.epochs=2", test}), env()).train();
  EXPECT_EQ(evaluated(dir), (std::vector<std::string>{"0", "1"}));
  EXPECT_FALSE(fs::exists(dir / "2"));
}

// A save folder of the earlier run that also holds a file no save writes: refused before any
// pass, naming the folder and the file, and nothing is removed.
TEST_F(FreshRunSaves, ASaveFolderHoldingOtherFilesIsRefusedAndNothingRemoved) {
  const fs::path dir = root_ / "foreign";
  Trainer(config(dir, {"runner.epochs=2"}), env()).train();
  std::ofstream(dir / "1" / "eval_notes.txt") << "mine\n";
  try {
    Trainer(config(dir, {"runner.epochs=1", "runner.resume=off"}), env()).train();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find((dir / "1").string() + " holds a save of an earlier run"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("'eval_notes.txt'"), std::string::npos) << what;
    EXPECT_NE(what.find("another runner.model_save_path"), std::string::npos) << what;
  }
  EXPECT_EQ(evaluated(dir), (std::vector<std::string>{"0", "1"}));
  EXPECT_TRUE(fs::exists(dir / "1" / "eval_notes.txt"));

  // Inside a half, beside the files its MANIFEST lists: refused alike, naming it.
  fs::remove(dir / "1" / "eval_notes.txt");
  std::ofstream(dir / "1" / "dense" / "mine.txt") << "mine\n";
  const std::string what = error_of([&] {
    Trainer(config(dir, {"runner.epochs=1", "runner.resume=off"}), env()).train();
  });
  EXPECT_NE(what.find("'dense/mine.txt'"), std::string::npos) << what;
  EXPECT_TRUE(fs::exists(dir / "1" / "dense" / "mine.txt"));
}

// The save a fresh run starts from (--load) inside its own save folder is kept.
TEST_F(FreshRunSaves, TheSaveTheRunStartsFromIsKept) {
  const fs::path earlier = root_ / "start_earlier";
  const fs::path dir = root_ / "start";
  Trainer(config(earlier, {"runner.epochs=1"}), env()).train();
  fs::create_directories(dir);
  fs::copy(earlier / "0", dir / "5", fs::copy_options::recursive);
  Trainer(config(dir, {"runner.epochs=1", "runner.resume=off"}), env()).train((dir / "5").string());
  EXPECT_TRUE(fs::exists(dir / "5" / io::kModelManifestName));
  EXPECT_TRUE(fs::exists(dir / "0" / io::kModelManifestName));
}

// The save a fresh run starts from is kept however it is spelled: --load with a trailing
// slash, or a runner.model_save_path that is a symbolic link to the folder holding it.
TEST_F(FreshRunSaves, TheSaveTheRunStartsFromIsKeptUnderAnySpelling) {
  const fs::path earlier = root_ / "spell_earlier";
  Trainer(config(earlier, {"runner.epochs=1"}), env()).train();
  const fs::path slash = root_ / "spell_slash";
  fs::create_directories(slash);
  fs::copy(earlier / "0", slash / "5", fs::copy_options::recursive);
  Trainer(config(slash, {"runner.epochs=1", "runner.resume=off"}), env())
      .train((slash / "5").string() + "/");
  EXPECT_TRUE(fs::exists(slash / "5" / io::kModelManifestName));
  // One origin however spelled: the run resumes with --load without the slash.
  EXPECT_EQ(
      passes(Trainer(config(slash, {"runner.epochs=2"}), env()).train((slash / "5").string())),
      (std::vector<int64_t>{1}));

  const fs::path real = root_ / "spell_real";
  const fs::path link = root_ / "spell_link";
  fs::create_directories(real);
  fs::copy(earlier / "0", real / "5", fs::copy_options::recursive);
  fs::create_directory_symlink(real, link);
  Trainer(config(link, {"runner.epochs=1", "runner.resume=off"}), env())
      .train((real / "5").string());
  EXPECT_TRUE(fs::exists(real / "5" / io::kModelManifestName));
  EXPECT_TRUE(fs::exists(real / "0" / io::kModelManifestName));
}

// A fresh run removes the earlier run's saves only at its end, once its own last save is made:
// stopped after pass 0, it leaves the earlier run's saves 1 and 2 beside its 0; its resume
// continues it (its save 0 is the newest) and, at the job's end, removes the earlier run's 2.
TEST_F(FreshRunSaves, TheEarlierRunsSavesStayUntilTheFreshRunEnds) {
  const fs::path dir = root_ / "deferred";
  Trainer(config(dir, {"runner.epochs=3"}), env()).train();
  const uint64_t earlier_last = manifest_of(dir / "2").sequence;
  const std::vector<std::string> rerun = {"runner.epochs=2", "hyper_parameters.fc_sizes=[4]"};
  std::vector<std::string> fresh = rerun;
  fresh.push_back("runner.resume=off");
  RunHooks stop;
  stop.stop_requested = [] { return true; };  // before pass 1
  EXPECT_EQ(passes(Trainer(config(dir, fresh), env()).train("", stop)), (std::vector<int64_t>{0}));
  EXPECT_GT(manifest_of(dir / "0").sequence, earlier_last);
  EXPECT_LT(manifest_of(dir / "1").sequence, earlier_last);  // the earlier run's, kept
  EXPECT_EQ(manifest_of(dir / "2").sequence, earlier_last);

  EXPECT_EQ(passes(Trainer(config(dir, rerun), env()).train()), (std::vector<int64_t>{1}));
  EXPECT_EQ(evaluated(dir), (std::vector<std::string>{"0", "1"}));
  EXPECT_GT(manifest_of(dir / "1").sequence, manifest_of(dir / "0").sequence);
  EXPECT_FALSE(fs::exists(dir / "2"));
}

// The end's removal itself: skipped while the folder's lock is not held; then each removed
// folder goes through a hidden name (one a removal killed midway left is deleted); a numbered
// save whose model manifest is of another pass (copied there) is not the earlier run's: kept.
TEST_F(FreshRunSaves, TheEndsRemovalNeedsTheLockAndProvableSaves) {
  const fs::path dir = root_ / "removal";
  Trainer(config(dir, {"runner.epochs=3"}), env()).train();
  io::ModelManifest rerun = manifest_of(dir / "0");  // as a rerun's pass 0, the newest save
  rerun.sequence = manifest_of(dir / "2").sequence + 1;
  throw_if_error(io::write_model_manifest(io::FileEnv::posix(), (dir / "0").string(), rerun));
  fs::copy(dir / "2", dir / "7", fs::copy_options::recursive);
  const fs::path leftover = dir / ".gpubox_removing_4";
  fs::create_directories(leftover / "dense");

  remove_earlier_saves(dir.string(), "", 1, /*locked=*/false);
  EXPECT_TRUE(fs::exists(dir / "1"));
  EXPECT_TRUE(fs::exists(dir / "2"));
  EXPECT_TRUE(fs::exists(leftover));

  remove_earlier_saves(dir.string(), "", 1, /*locked=*/true);
  EXPECT_TRUE(fs::exists(dir / "0"));
  EXPECT_FALSE(fs::exists(dir / "1"));
  EXPECT_FALSE(fs::exists(dir / "2"));
  EXPECT_TRUE(fs::exists(dir / "7" / io::kModelManifestName));  // of pass 2, not 7
  EXPECT_FALSE(fs::exists(leftover));
  for (const auto& entry : fs::directory_iterator(dir)) {
    EXPECT_NE(entry.path().filename().string().rfind(".gpubox_removing_", 0), 0u) << entry.path();
  }
}

// What an interrupted removal left (.gpubox_removing_<pass>) is deleted only with the folder's
// lock held, only as a real folder holding a save's entries: a user's folder or file of that name
// and a symbolic link named so are kept.
TEST_F(FreshRunSaves, ARemovalsLeftoversAreDeletedOnlyWhenTheyAreSaves) {
  const fs::path dir = root_ / "leftovers";
  Trainer(config(dir, {"runner.epochs=2"}), env()).train();
  const fs::path save = dir / ".gpubox_removing_5";
  fs::copy(dir / "1", save, fs::copy_options::recursive);
  const fs::path mine = dir / ".gpubox_removing_mine";
  fs::create_directories(mine);
  std::ofstream(mine / "notes.txt") << "mine\n";
  const fs::path file = dir / ".gpubox_removing_file";
  std::ofstream(file) << "mine\n";
  const fs::path link = dir / ".gpubox_removing_link";
  fs::create_directory_symlink(dir / "0", link);

  delete_removal_leftovers(dir.string(), /*locked=*/false);
  EXPECT_TRUE(fs::exists(save));
  delete_removal_leftovers(dir.string(), /*locked=*/true);
  EXPECT_FALSE(fs::exists(save));
  EXPECT_TRUE(fs::exists(mine / "notes.txt"));
  EXPECT_TRUE(fs::exists(file));
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_TRUE(fs::exists(dir / "0" / io::kModelManifestName));
  check_earlier_saves(dir.string(), "", 1);  // keeps them too (no lock asked there)
  EXPECT_TRUE(fs::exists(mine / "notes.txt"));
  EXPECT_TRUE(fs::exists(file));
}

// A complete save under a hidden name (here pass 0's, the newest by sequence) is no resume
// candidate: the resume continues the run's save 1.
TEST_F(FreshRunSaves, AHiddenSaveIsNoResumeCandidate) {
  const fs::path dir = root_ / "hidden";
  Trainer(config(dir, {"runner.epochs=3"}), env()).train();
  fs::remove_all(dir / "2");
  io::ModelManifest newest = manifest_of(dir / "0");
  newest.sequence = manifest_of(dir / "1").sequence + 1;
  fs::copy(dir / "0", dir / ".copy", fs::copy_options::recursive);
  throw_if_error(io::write_model_manifest(io::FileEnv::posix(), (dir / ".copy").string(), newest));
  EXPECT_EQ(passes(Trainer(config(dir, {"runner.epochs=3"}), env()).train()),
            (std::vector<int64_t>{2}));
}

// Saves the end keeps anyway are not refused at start, and a numbered folder's name is a pass as
// a save spells it: a save of two servers with a server's half staged by a killed save
// (sparse/server-1.tmp/) is the earlier run's; 0002 and a save of another pass holding a file
// of the user's are not refused; <pass>.tmp is removed only holding halves being written.
TEST_F(FreshRunSaves, WhatTheEndKeepsIsNotRefusedAndStagingIsChecked) {
  const fs::path dir = root_ / "kept";
  Trainer(config(dir, {"runner.epochs=3"}), env()).train();
  io::ModelManifest two = manifest_of(dir / "2");
  ASSERT_EQ(two.sparse.size(), 1u);
  two.sparse.push_back(two.sparse.front());
  const fs::path sparse = dir / "2" / io::kSparseHalf;
  fs::rename(sparse, dir / "2" / "server-0");
  fs::create_directories(sparse);
  fs::rename(dir / "2" / "server-0", sparse / "server-0");
  fs::copy(sparse / "server-0", sparse / "server-1", fs::copy_options::recursive);
  throw_if_error(io::write_model_manifest(io::FileEnv::posix(), (dir / "2").string(), two));
  fs::create_directories(sparse / "server-1.tmp");
  std::ofstream(sparse / "server-1.tmp" / "part-00000") << "half written\n";
  fs::copy(dir / "1", dir / "0001", fs::copy_options::recursive);  // not pass 1's folder: kept
  fs::copy(dir / "1", dir / "7", fs::copy_options::recursive);     // of pass 1: kept
  std::ofstream(dir / "7" / "notes.txt") << "mine\n";
  fs::create_directories(dir / "5.tmp" / "dense");
  std::ofstream(dir / "5.tmp" / "dense" / "notes.txt") << "mine\n";
  fs::create_directories(dir / "6.tmp" / "dense.tmp");
  std::ofstream(dir / "6.tmp" / "dense.tmp" / "part") << "half written\n";
  check_earlier_saves(dir.string(), "", 1);  // nothing refused

  io::ModelManifest rerun = manifest_of(dir / "0");  // as a rerun's pass 0, the newest save
  rerun.sequence = two.sequence + 1;
  throw_if_error(io::write_model_manifest(io::FileEnv::posix(), (dir / "0").string(), rerun));
  remove_earlier_saves(dir.string(), "", 1, /*locked=*/true);
  EXPECT_FALSE(fs::exists(dir / "1"));
  EXPECT_FALSE(fs::exists(dir / "2"));
  EXPECT_FALSE(fs::exists(dir / "6.tmp"));
  EXPECT_TRUE(fs::exists(dir / "0001" / io::kModelManifestName));
  EXPECT_TRUE(fs::exists(dir / "7" / "notes.txt"));
  EXPECT_TRUE(fs::exists(dir / "5.tmp" / "dense" / "notes.txt"));
}

// A folder that still mixes two runs (left by a GPUBox before fresh runs removed the earlier
// run's saves: a rerun's save 0 newer than the earlier run's 1 and 2): --mode infer's and
// export's folder of saves refuses it, naming the first save of the earlier run and the ways
// out; the range of the last run alone is evaluated.
TEST_F(FreshRunSaves, AFolderMixingTwoRunsIsRefusedByInferAndExport) {
  const fs::path dir = root_ / "mixed";
  Trainer(config(dir, {"runner.epochs=3"}), env()).train();
  io::ModelManifest rerun = manifest_of(dir / "0");
  rerun.sequence = manifest_of(dir / "2").sequence + 1;  // as an older GPUBox's rerun left it
  throw_if_error(io::write_model_manifest(io::FileEnv::posix(), (dir / "0").string(), rerun));
  try {
    saves_to_evaluate(dir.string(), 0, -1);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("mixes the saves of two runs: " + (dir / "1").string()), std::string::npos)
        << what;
    EXPECT_NE(what.find("was saved before " + (dir / "0").string()), std::string::npos) << what;
    EXPECT_NE(what.find("runner.infer_end_epoch 1"), std::string::npos) << what;
  }
  EXPECT_EQ(evaluated_until(dir, 1), (std::vector<std::string>{"0"}));
  EXPECT_EQ(evaluated_until(dir, 3, 1), (std::vector<std::string>{"1", "2"}));  // the earlier's
}

}  // namespace
}  // namespace gpubox::trainer
