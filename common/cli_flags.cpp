#include "common/cli_flags.hpp"

#include <gflags/gflags.h>

namespace gpubox::cli {

std::vector<Option> gflags_options(const char* defining_file) {
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);  // sorted by name
  std::vector<Option> out;
  for (const gflags::CommandLineFlagInfo& f : flags) {
    if (f.filename != defining_file) continue;
    std::string value = f.default_value;
    if (f.type == "string") value = "\"" + value + "\"";
    out.push_back({"--" + f.name, value, f.description});
  }
  return out;
}

}  // namespace gpubox::cli
