// folder_bytes: every file under a folder with its bytes, for tests that compare saves byte for
// byte (a re-save of a loaded model, a save taken twice); folder_tree: every entry, for tests
// and probes that check nothing under a folder was written, removed or relinked. Test-only.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
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

// Everything under `root` (its path relative to `root`): a folder as "<dir>", a link as
// "-> target" (not followed), a file as its bytes.
inline std::map<std::string, std::string> folder_tree(const std::filesystem::path& root) {
  namespace fs = std::filesystem;
  std::map<std::string, std::string> out;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
       ++it) {
    const std::string name = fs::relative(it->path(), root).string();
    if (it->is_symlink()) {
      out[name] = "-> " + fs::read_symlink(it->path()).string();
    } else if (it->is_directory()) {
      out[name] = "<dir>";
    } else {
      std::ifstream in(it->path(), std::ios::binary);
      out[name] = std::string(std::istreambuf_iterator<char>(in), {});
    }
  }
  return out;
}

}  // namespace gpubox::testing
