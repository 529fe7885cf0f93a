// A test binary's scratch folder under the temporary directory, shared with its death-test
// children. gtest's "threadsafe" death tests run the binary again; a child that made a folder of
// its own name would leave it behind (it ends in _Exit, past every teardown). So the first
// process names its folder in the environment, and a child process works in a subfolder of it,
// which goes when the first process removes its folder.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace gpubox::testing {

// `name`_<pid> in the temporary directory, or in a death-test child <parent's folder>/child_<pid>.
// `name` must be a valid environment variable suffix (letters, digits, underscores).
inline std::filesystem::path scratch_root(const std::string& name) {
  const std::string var = "GPUBOX_SCRATCH_" + name;
  const std::string me = std::to_string(::getpid());
  if (const char* set = std::getenv(var.c_str())) {
    const std::string value = set;  // "<pid>:<folder>" of the process that made it
    const std::size_t colon = value.find(':');
    if (colon != std::string::npos) {
      const std::filesystem::path folder = value.substr(colon + 1);
      if (value.substr(0, colon) == me) return folder;
      return folder / ("child_" + me);
    }
  }
  const std::filesystem::path folder = std::filesystem::temp_directory_path() / (name + "_" + me);
  ::setenv(var.c_str(), (me + ":" + folder.string()).c_str(), 1);
  return folder;
}

// Removes a folder when the process ends normally (a function-local static of it).
struct RemovedAtExit {
  std::filesystem::path path;
  ~RemovedAtExit() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

}  // namespace gpubox::testing
