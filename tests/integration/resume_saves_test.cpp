// Which saves a resume reads (trainer/schedule/checkpoint.hpp), beside resume_test.cpp's runs:
// a save of a config built in code records no model keys and is not compared; a key newer than
// a save reads as its default there; a save of before the table read runner.sync_mode (filed
// with the job's keys) resumes; an incomplete newest save is skipped for the one before it; saves
// that none restores are refused unless runner.resume is off.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/config/config_document.hpp"
#include "common/error.hpp"
#include "table/io/model_manifest.hpp"
#include "tests/integration/resume_fixture.hpp"
#include "trainer/engine/trainer.hpp"

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;
namespace io = table::io;

class ResumeSaves : public testing::ResumeFixture {};

TEST_F(ResumeSaves, ASaveOfAConfigBuiltInCodeRecordsNoModelKeysAndIsNotCompared) {
  const fs::path dir = root_ / "in_code";
  TrainerConfig in_code = config(dir, {"runner.epochs=1"});
  in_code.model_keys.clear();  // what a TrainerConfig filled in code holds
  Trainer(in_code, env()).train();
  auto m = io::read_model_manifest(io::FileEnv::posix(), (dir / "0").string());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_TRUE(m->model_keys.empty());
  // Nothing recorded to compare with: the loaded config's run resumes from it.
  Trainer again(config(dir, {"runner.epochs=2"}), env());
  EXPECT_EQ(passes(again.train()), (std::vector<int64_t>{1}));
}

TEST_F(ResumeSaves, AKeyNewerThanTheSaveReadsAsItsDefault) {
  const fs::path dir = root_ / "newer_key";
  TrainerConfig older = config(dir, {"runner.epochs=1"});
  // A save made before hyper_parameters.cross_layers existed records no value for it.
  ASSERT_EQ(older.model_keys.erase("hyper_parameters.cross_layers"), 1u);
  Trainer(older, env()).train();
  // Set to something else it is a difference, named with the default the save had.
  const std::string default_layers =
      config::ConfigDocument::defaults().value_text("hyper_parameters.cross_layers");
  const std::string what = error_of([&] {
    Trainer(config(dir, {"runner.epochs=2", "hyper_parameters.cross_layers=5"}), env()).train();
  });
  EXPECT_NE(what.find("hyper_parameters.cross_layers: saved (not recorded; its default is " +
                      default_layers + "), now 5"),
            std::string::npos)
      << what;
  // At its default the key changes nothing the save was made with: the run resumes.
  Trainer again(config(dir, {"runner.epochs=2"}), env());
  EXPECT_EQ(passes(again.train()), (std::vector<int64_t>{1}));
}

// A save made before the table read runner.sync_mode (main's MODEL_MANIFEST: the schedule among
// the job's keys, no adam_bias_correction) resumes: where a key is filed is the save's format.
TEST_F(ResumeSaves, ASaveMadeBeforeTheTableReadTheScheduleResumes) {
  const fs::path dir = root_ / "before_table_steps";
  Trainer(config(dir, {"runner.epochs=1"}), env()).train();
  const std::string correction = "hyper_parameters.sparse_optimizer.adam_bias_correction";
  auto m = io::read_model_manifest(io::FileEnv::posix(), (dir / "0").string());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  m->model_keys.erase("runner.sync_mode");
  m->model_keys.erase(correction);
  m->job["runner.sync_mode"] = "gpubox";
  throw_if_error(io::write_model_manifest(io::FileEnv::posix(), (dir / "0").string(), *m));
  Trainer again(config(dir), env());
  EXPECT_EQ(passes(again.train()), (std::vector<int64_t>{1, 2}));
  // Its saves file the keys as that one did, and the correction the rows used.
  m = io::read_model_manifest(io::FileEnv::posix(), (dir / "2").string());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->job.at("runner.sync_mode"), "gpubox");
  EXPECT_EQ(m->model_keys.count("runner.sync_mode"), 0u);
  EXPECT_EQ(m->model_keys.at(correction), "per_row");
}

TEST_F(ResumeSaves, AnIncompleteNewestSaveIsSkippedForTheOneBefore) {
  const fs::path dir = root_ / "incomplete";
  Trainer(config(dir, {"runner.epochs=2"}), env()).train();
  // Pass 1's dense half replaced by pass 0's: its halves no longer match its manifest.
  fs::remove_all(dir / "1" / "dense");
  fs::copy(dir / "0" / "dense", dir / "1" / "dense", fs::copy_options::recursive);
  Trainer again(config(dir, {"runner.epochs=2"}), env());
  EXPECT_EQ(passes(again.train()), (std::vector<int64_t>{1}));
}

// Saves there, none of which restores (a read error, a digest mismatch, a newer format): the
// run is refused at start, naming the newest and why, rather than trained afresh beside them;
// runner.resume=off trains afresh.
TEST_F(ResumeSaves, SavesThatNoneRestoresAreRefusedUnlessResumeIsOff) {
  const fs::path dir = root_ / "none_restores";
  Trainer(config(dir, {"runner.epochs=2"}), env()).train();
  // The two passes' dense halves swapped: neither matches its MODEL_MANIFEST.
  fs::rename(dir / "0" / "dense", dir / "dense_0");
  fs::rename(dir / "1" / "dense", dir / "0" / "dense");
  fs::rename(dir / "dense_0", dir / "1" / "dense");
  const std::string what =
      error_of([&] { Trainer(config(dir, {"runner.epochs=3"}), env()).train(); });
  EXPECT_NE(what.find("no save under " + dir.string() + " restores"), std::string::npos) << what;
  EXPECT_NE(what.find((dir / "1").string()), std::string::npos) << what;
  EXPECT_NE(what.find("runner.resume=off"), std::string::npos) << what;
  Trainer fresh(config(dir, {"runner.epochs=1", "runner.resume=off"}), env());
  EXPECT_EQ(passes(fresh.train()), (std::vector<int64_t>{0}));
}

}  // namespace
}  // namespace gpubox::trainer
