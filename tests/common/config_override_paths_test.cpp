// An -o data folder given relative (runner.train_data_dir, test_data_dir, pass_dirs): the working
// directory's, as GPUBox reads -o paths, unless only the config's folder has it, where PaddleRec
// joins it (its command lines failed with "does not exist"); where both have one, the working
// directory's is read with a warning (a data/ folder there trained silently while the test data
// came from the config's folder).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/config/config_document.hpp"

namespace gpubox::config {
namespace {
namespace fs = std::filesystem;

TEST(OverridePaths, ARelativeDataFolderOnlyBesideTheConfigIsReadThere) {
  std::random_device rd;
  const fs::path dir =
      fs::temp_directory_path() / ("gpubox_override_paths_" + std::to_string(rd()));
  const fs::path sub = fs::absolute(dir / "sub").lexically_normal();
  fs::create_directories(sub);
  const std::string path = (sub / "c.yaml").string();
  std::ofstream(path) << "runner:\n  epochs: 1\n";
  // Unique in the working directory too, so that only this test's folder is there.
  const fs::path only_beside = "gpubox_override_paths_" + std::to_string(::getpid());
  fs::create_directories(sub / only_beside / "x");
  auto beside = ConfigDocument::load(
      path, {"runner.train_data_dir=" + (only_beside / "x").string(),
             "runner.pass_dirs=[" + (only_beside / "x").string() + ", /abs/day]"});
  ASSERT_TRUE(beside.ok()) << beside.status().to_string();
  EXPECT_EQ(beside->get_string("runner.train_data_dir"), (sub / only_beside / "x").string());
  EXPECT_EQ(beside->get_string_list("runner.pass_dirs"),
            (std::vector<std::string>{(sub / only_beside / "x").string(), "/abs/day"}));
  ASSERT_EQ(beside->override_path_notes().size(), 2u);
  EXPECT_FALSE(beside->override_path_notes()[0].first);
  EXPECT_NE(beside->override_path_notes()[0].second.find("beside the config, as PaddleRec does"),
            std::string::npos)
      << beside->override_path_notes()[0].second;
  fs::create_directories(only_beside / "x");  // the working directory's too
  auto both = ConfigDocument::load(path, {"runner.train_data_dir=" + (only_beside / "x").string()});
  fs::remove_all(only_beside);
  fs::remove_all(dir);
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(both->get_string("runner.train_data_dir"),
            (fs::current_path() / only_beside / "x").lexically_normal().string());
  ASSERT_EQ(both->override_path_notes().size(), 1u);
  EXPECT_TRUE(both->override_path_notes()[0].first);
  EXPECT_NE(both->override_path_notes()[0].second.find("which PaddleRec would read"),
            std::string::npos);
}

}  // namespace
}  // namespace gpubox::config
