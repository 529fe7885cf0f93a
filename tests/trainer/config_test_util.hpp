// The fixture of gpubox_train's config tests (config_test.cpp, config_paddlerec_test.cpp: the
// binary trainer_config_test): a fresh folder per test to write configs into and load them from.
// One class for both files (in a named namespace), so that gtest sees one fixture type for the
// suite ConfigTest.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "trainer/config/config_loader.hpp"

namespace gpubox::trainer::config_test {

class ConfigTest : public ::testing::Test {
 protected:
  ConfigTest() {
    std::random_device rd;
    dir_ = std::filesystem::temp_directory_path() / ("gpubox_config_test_" + std::to_string(rd()));
    std::filesystem::create_directories(dir_ / "sub");
  }
  ~ConfigTest() override { std::filesystem::remove_all(dir_); }

 public:
  // `text` as the file `name` under the test's folder; its path.
  std::string write(const std::string& name, const std::string& text) {
    const std::filesystem::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  // `text` as `folder`/config.yaml under the test's folder, loaded with `overrides`.
  StatusOr<TrainerConfig> load_in(const std::string& folder, const std::string& text,
                                  const std::vector<std::string>& overrides = {}) {
    std::filesystem::create_directories(dir_ / folder);
    return load_trainer_config(write(folder + "/config.yaml", text), overrides);
  }
  // The test's folder.
  const std::filesystem::path& dir() const { return dir_; }

 protected:
  std::filesystem::path dir_;
};

}  // namespace gpubox::trainer::config_test
