// runner.metrics_path across runs (trainer/schedule/metrics_file.hpp): a line a killed run cut
// short is not glued to the next run's first, and the last line is read back as an epoch's test
// line only when it is whole and that epoch's.
#include "trainer/schedule/metrics_file.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace gpubox::trainer {
namespace {

namespace fs = std::filesystem;

class MetricsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gpubox_metrics_file_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string text() const {
    std::ifstream in(path());
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::string path() const { return (dir_ / "metrics.jsonl").string(); }
  fs::path dir_;
};

TEST_F(MetricsFileTest, ACutLineIsEndedBeforeTheNextRunsLines) {
  std::ofstream(path()) << "{\"pass\": 0}\n{\"epoch\": 0, \"test_a";  // killed mid-line
  std::string run;
  {
    MetricsFile file(path(), 0);
    EXPECT_FALSE(file.ends_with_test_line(0));  // a cut line is no line
    file.append("{\"pass\": 1}");
    run = file.run();
  }
  EXPECT_EQ(text(),
            "{\"pass\": 0}\n{\"epoch\": 0, \"test_a\n{\"pass\": 1, \"run\": \"" + run + "\"}\n");
  // The run: its start in UTC and the process.
  EXPECT_EQ(run.size(), 20 + 1 + std::to_string(::getpid()).size()) << run;
  EXPECT_EQ(run.substr(run.find('/') + 1), std::to_string(::getpid()));
  {
    MetricsFile file(path(), 0);  // whole: nothing added before the next line
    file.append("{\"epoch\": 1, \"test_auc\": 0.7, \"test_logloss\": 0.5, \"test_examples\": 9}");
    EXPECT_TRUE(file.ends_with_test_line(1));
    EXPECT_FALSE(file.ends_with_test_line(0));
    EXPECT_FALSE(file.ends_with_test_line(11));
  }
  EXPECT_EQ(text().find("\n\n"), std::string::npos) << text();
}

// A pass line kept in its save before the save is made: a run killed between the save and the
// line lost it for good (a helper's kill probe); the resume after that save appends it as that run
// wrote it, once, and per trainer.
TEST_F(MetricsFileTest, APassLineKeptInItsSaveIsRestoredOnceAtTheResume) {
  const std::string save = (dir_ / "model" / "0").string();
  std::string kept;
  {
    MetricsFile killed(path(), 0);
    killed.keep_pass_line(save, "{\"pass\": 0, \"auc\": 0.7}");
    kept = "{\"pass\": 0, \"auc\": 0.7, \"run\": \"" + killed.run() + "\"}";
    MetricsFile other(path(), 1);  // trainer 1 keeps its own beside it
    other.keep_pass_line(save, "{\"pass\": 0, \"auc\": 0.6, \"trainer\": 1}");
  }  // killed before its line
  EXPECT_TRUE(fs::exists(fs::path(save) / kPassLineFile));
  EXPECT_TRUE(fs::exists(fs::path(save) / (std::string(kPassLineFile) + ".trainer1")));
  EXPECT_EQ(text(), "");
  for (int rerun = 0; rerun < 2; ++rerun) {  // the second finds it there: not written twice
    MetricsFile resumed(path(), 0);
    resumed.restore_pass_line(save);
  }
  EXPECT_EQ(text(), kept + "\n");
  MetricsFile none(path(), 0);
  none.restore_pass_line((dir_ / "model" / "1").string());  // no line kept there
  EXPECT_EQ(text(), kept + "\n");
}

TEST_F(MetricsFileTest, NoFileKeptReadsNoLine) {
  MetricsFile none("", 0);
  none.append("{\"pass\": 0}");
  EXPECT_FALSE(none.ends_with_test_line(0));
  MetricsFile empty(path(), 0);  // a new, empty file
  EXPECT_FALSE(empty.ends_with_test_line(0));
  EXPECT_EQ(text(), "");
}

}  // namespace
}  // namespace gpubox::trainer
