// The options of a gflags binary for its --help (common/cli.hpp): only the flags it defines
// itself, not gflags' own (--flagfile, --fromenv, ...) and without the file they are defined in.
#pragma once

#include <vector>

#include "common/cli.hpp"

namespace gpubox::cli {

// The flags defined in `defining_file` (pass the main file's __FILE__), sorted by name, with
// gflags' default values ("" shown as "").
std::vector<Option> gflags_options(const char* defining_file);

}  // namespace gpubox::cli
