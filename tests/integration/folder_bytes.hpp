// folder_bytes: every file under a folder with its bytes, for tests that compare saves byte for
// byte (a re-save of a loaded model, a save taken twice). Test-only.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

namespace gpubox::testing {

// Every regular file under `dir` (its path relative to `dir`) with its bytes.
inline std::map<std::string, std::string> folder_bytes(const std::filesystem::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::ostringstream bytes;
    bytes << in.rdbuf();
    files[std::filesystem::relative(entry.path(), dir).string()] = bytes.str();
  }
  return files;
}

}  // namespace gpubox::testing
