#include "trainer/schedule/output_paths.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <vector>

#include "common/error.hpp"

namespace gpubox::trainer {

namespace fs = std::filesystem;

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {};
  struct stat sb {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

bool inside(const std::string& path, const std::string& dir) {
  std::error_code ec;
  const fs::path folder = fs::weakly_canonical(dir, ec);
  if (ec || !fs::is_directory(folder, ec)) return false;
  const fs::path file = fs::weakly_canonical(path, ec);
  if (ec) return false;
  const auto [in, rest] = std::mismatch(folder.begin(), folder.end(), file.begin(), file.end());
  return in == folder.end();
}

void check_metrics_path(const std::string& path, const TrainerConfig& config, const RunPlan& plan,
                        const std::string& start_from) {
  if (path.empty()) return;
  const std::string refused = "runner.metrics_path '" + path + "' is ";
  const std::string remedy = ": name a file outside the run's data, config and saves";
  GPUBOX_EXPECTS(config.config_path.empty() || !same_file(path, config.config_path), refused,
                 "the config '", config.config_path, "'", remedy);
  std::vector<std::string> files = plan.test_files;
  for (const auto& pass : plan.pass_files) files.insert(files.end(), pass.begin(), pass.end());
  for (const std::string& file : files) {
    GPUBOX_EXPECTS(!same_file(path, file), refused, "the data file '", file, "'", remedy);
  }
  const RunnerConfig& runner = config.runner;
  std::vector<std::string> folders = runner.pass_dirs;
  folders.insert(folders.end(), runner.train_data_dirs.begin(), runner.train_data_dirs.end());
  folders.insert(folders.end(), runner.test_data_dirs.begin(), runner.test_data_dirs.end());
  for (const std::string& dir : {runner.train_data_dir, runner.test_data_dir}) {
    if (!dir.empty()) folders.push_back(dir);
  }
  for (const std::string& dir : folders) {
    GPUBOX_EXPECTS(!inside(path, dir), refused, "inside the data folder '", dir,
                   "' (the next run would read its lines as data)", remedy);
  }
  // A file beside the saves (<model_save_path>/metrics.jsonl) is fine; one inside a save is not.
  const std::string& saves = runner.model_save_path;
  if (!saves.empty() && inside(path, saves)) {
    std::error_code ec_path, ec_saves;
    const fs::path folder = fs::weakly_canonical(fs::path(path), ec_path).parent_path();
    const bool beside =
        !ec_path && folder == fs::weakly_canonical(fs::path(saves), ec_saves) && !ec_saves;
    GPUBOX_EXPECTS(beside, refused, "inside a save under runner.model_save_path '", saves,
                   "' (its lines would break the save's checksums)", remedy);
  }
  GPUBOX_EXPECTS(start_from.empty() || !inside(path, start_from), refused, "inside the save '",
                 start_from, "' the run loads", remedy);
}

}  // namespace gpubox::trainer
