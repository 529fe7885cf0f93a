// A fresh run (not a resume) into a runner.model_save_path that holds an earlier run's saves
// (trainer/schedule/earlier_saves.hpp): the earlier run's saves are removed before its first
// pass, so a rerun with fewer epochs leaves no later save of the earlier run for --mode infer,
// export or a resume to take as this run's result; a save folder holding files a save does not
// write is refused, naming it, and nothing is removed; the save the run starts from is kept;
// an interrupted run still resumes (resume_test.cpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "table/io/model_manifest.hpp"
#include "tests/integration/resume_fixture.hpp"
#include "trainer/engine/trainer.hpp"
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
