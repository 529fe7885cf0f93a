// SaveLineage's refusal reasons (checkpoint.hpp): why go_back() refuses as trainer 0 of a job
// tells the others, in words and as the float the PS modes carry through a server's dense table;
// and the env its manifest writes go through.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "table/io/progress_env.hpp"
#include "trainer/config/trainer_config.hpp"
#include "trainer/schedule/checkpoint.hpp"

namespace gpubox::trainer {
namespace {

using Refusal = SaveLineage::Refusal;

TEST(SaveLineageRefusal, ResumeOffThenNoSaveThenOther) {
  TrainerConfig config;
  config.runner.resume = ResumeMode::kOff;
  EXPECT_EQ(SaveLineage(config).refusal(), Refusal::kResumeOff);
  config.runner.resume = ResumeMode::kAuto;
  SaveLineage lineage(config);
  EXPECT_EQ(lineage.refusal(), Refusal::kNoSave);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("save_lineage_test_" + std::to_string(::getpid())) / "0";
  std::filesystem::create_directories(dir);
  lineage.commit_save(dir.string(), 1, table::SaveKind::kCheckpoint, {}, 0,
                      config::DensePrecision::kFp32);
  // A save and recoveries left: go_back refused for another reason (its own error says which).
  EXPECT_EQ(lineage.refusal(), Refusal::kOther);
  std::filesystem::remove_all(dir.parent_path());
}

// A folder saved into again (a rerun of a finished job) loses the evaluation mark of what it
// held: a run killed between the new save and its evaluation leaves the epoch unevaluated, and
// the rerun after it must see so (epoch_loop.cpp), not the old run's mark.
TEST(SaveLineage, ASaveIntoAFolderRemovesItsEvaluationMark) {
  TrainerConfig config;
  SaveLineage lineage(config);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("save_lineage_mark_" + std::to_string(::getpid())) / "0";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / kEvaluatedMark) << "evaluated\n";
  std::ofstream(dir / "kept") << "not the save's\n";
  lineage.begin_save(dir.string(), table::SaveKind::kCheckpoint);
  EXPECT_FALSE(std::filesystem::exists(dir / kEvaluatedMark));
  EXPECT_TRUE(std::filesystem::exists(dir / "kept"));
  lineage.begin_save(dir.string(), table::SaveKind::kCheckpoint);  // none to remove
  std::filesystem::remove_all(dir.parent_path());
}

// What a sink was told, in order: "WHAT PATH" as each file operation begins.
class BegunOps final : public table::io::ProgressSink {
 public:
  std::vector<std::string> ops;
  void begin_io(const char* what, const std::string& path) override {
    ops.push_back(std::string(what) + " " + path);
  }
  void end_io(uint64_t) override {}
  void step() override {}
  bool has(const std::string& op) const {
    return std::find(ops.begin(), ops.end(), op) != ops.end();
  }
};

// Trainer 0's writes of a save's model manifest (begin_save removes it, commit_save reads the
// manifests beside it and writes its own) go through the env it passes, the one that shows its
// part's moves to the others (trainer_zero_work.hpp), not around it.
TEST(SaveLineage, BeginAndCommitGoThroughTheGivenEnv) {
  TrainerConfig config;
  SaveLineage lineage(config);
  const std::filesystem::path root = std::filesystem::temp_directory_path() /
                                     ("save_lineage_env_test_" + std::to_string(::getpid()));
  const std::string first = (root / "0").string();
  const std::string second = (root / "1").string();
  std::filesystem::create_directories(first);
  std::filesystem::create_directories(second);
  lineage.commit_save(first, 1, table::SaveKind::kCheckpoint, {}, 0,
                      config::DensePrecision::kFp32);  // POSIX
  BegunOps sink;
  table::io::ProgressEnv shown(table::io::FileEnv::posix(), &sink);
  lineage.commit_save(second, 2, table::SaveKind::kCheckpoint, {}, 0, config::DensePrecision::kFp32,
                      &shown);
  EXPECT_TRUE(sink.has("read of " + first + "/MODEL_MANIFEST"));  // the save beside it
  EXPECT_TRUE(sink.has("create " + second + "/MODEL_MANIFEST.tmp"));
  EXPECT_TRUE(sink.has("rename of " + second + "/MODEL_MANIFEST.tmp"));
  EXPECT_TRUE(sink.has("fsync of folder " + second));
  EXPECT_TRUE(std::filesystem::exists(second + "/MODEL_MANIFEST"));
  sink.ops.clear();
  EXPECT_EQ(lineage.begin_save(second, table::SaveKind::kCheckpoint, &shown),
            table::SaveKind::kCheckpoint);
  EXPECT_EQ(sink.ops, (std::vector<std::string>{"stat of " + second + "/" + kEvaluatedMark,
                                                "stat of " + second + "/" + kEvaluatingMark,
                                                "stat of " + second + "/MODEL_MANIFEST",
                                                "remove of " + second + "/MODEL_MANIFEST",
                                                "fsync of folder " + second}));
  EXPECT_FALSE(std::filesystem::exists(second + "/MODEL_MANIFEST"));
  std::filesystem::remove_all(root);
}

TEST(SaveLineageRefusal, DescribedInWordsTheOtherNamingTrainerZerosLog) {
  const std::string log = "log/worker.0.log under scripts/run_gpubox.sh";
  EXPECT_EQ(SaveLineage::describe(Refusal::kResumeOff, log), "runner.resume is off");
  EXPECT_EQ(SaveLineage::describe(Refusal::kNoSave, log), "this run made or loaded no save yet");
  EXPECT_EQ(SaveLineage::describe(Refusal::kSpent, log),
            "the servers restarted too often in this run");
  EXPECT_EQ(SaveLineage::describe(Refusal::kOther, log),
            "trainer 0's log, log/worker.0.log under scripts/run_gpubox.sh, names why");
}

// The floats are the PS modes' (ps_trainer_recovery.cpp): kGoesBack 1, resume off 2, no save 3,
// spent 4, another failure 0; any other value reads as another failure.
TEST(SaveLineageRefusal, EncodedAsTheFloatsThePsModesTellAndBack) {
  EXPECT_EQ(SaveLineage::encode(Refusal::kNone), 1.0f);
  EXPECT_EQ(SaveLineage::encode(Refusal::kResumeOff), 2.0f);
  EXPECT_EQ(SaveLineage::encode(Refusal::kNoSave), 3.0f);
  EXPECT_EQ(SaveLineage::encode(Refusal::kSpent), 4.0f);
  EXPECT_EQ(SaveLineage::encode(Refusal::kOther), 0.0f);
  for (const Refusal why :
       {Refusal::kNone, Refusal::kResumeOff, Refusal::kNoSave, Refusal::kSpent, Refusal::kOther}) {
    EXPECT_EQ(SaveLineage::decode(SaveLineage::encode(why)), why);
  }
  EXPECT_EQ(SaveLineage::decode(7.0f), Refusal::kOther);
  EXPECT_EQ(SaveLineage::decode(-1.0f), Refusal::kOther);
}

// Whether a failure names a restarted server (a failure that does not is the trainer's own, kept
// beside the restart): its "ip:port" as a whole, not within a longer port or host name.
TEST(SaveLineageNamesServer, TheEndpointAsAWholeOnly) {
  EXPECT_TRUE(SaveLineage::names_server("h:2901", "h:2901"));
  EXPECT_TRUE(SaveLineage::names_server("server h:2901 restarted (instance 7)", "h:2901"));
  EXPECT_TRUE(SaveLineage::names_server("pulling from 10.0.0.1:6000: reset", "10.0.0.1:6000"));
  EXPECT_TRUE(SaveLineage::names_server("(ps1:6000)", "ps1:6000"));
  EXPECT_TRUE(SaveLineage::names_server("ps1:6000/table", "ps1:6000"));
  // Another port that starts with this one, another host that ends with this one.
  EXPECT_FALSE(SaveLineage::names_server("server h:29011 is down", "h:2901"));
  EXPECT_FALSE(SaveLineage::names_server("server gpu-ps1:6000 is down", "ps1:6000"));
  EXPECT_FALSE(SaveLineage::names_server("server gpups1:6000 is down", "ps1:6000"));
  EXPECT_FALSE(SaveLineage::names_server("server 110.0.0.1:6000 is down", "10.0.0.1:6000"));
  EXPECT_FALSE(SaveLineage::names_server("server a.ps1:6000 is down", "ps1:6000"));
  EXPECT_FALSE(SaveLineage::names_server("PUSH to job_ps1:6000: closed", "ps1:6000"));
  EXPECT_FALSE(SaveLineage::names_server("PUSH to fe80:1::2:6000", "1::2:6000"));
  // A later whole mention counts after a partial one.
  EXPECT_TRUE(SaveLineage::names_server("h:29011 down; h:2901 restarted", "h:2901"));
  EXPECT_FALSE(SaveLineage::names_server("card 0: an injected device fault", "h:2901"));
  EXPECT_FALSE(SaveLineage::names_server("anything", ""));
}

}  // namespace
}  // namespace gpubox::trainer
