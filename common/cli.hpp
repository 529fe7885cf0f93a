// What every GPUBox binary says about itself, the same way: `--version` (version, commit,
// backend) and `--help` / `-h` (what it does, the synopsis, its options with their defaults, an
// example). Nothing here prints a path of the machine GPUBox was built on.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace gpubox::cli {

// "gpubox_train 0.1.0 (commit 1a2b3c4d5e6f, backend cpu)"; the commit is taken at build time
// ("-dirty" when tracked files differed from it, "unknown" outside a git checkout).
std::string version_text(const std::string& tool);

// Whether argv[first, argc) asks for help (--help, -h, -help, --helpfull) or for the version
// (--version, -version). Only whole arguments count: "-o key=--help" does not.
bool asks_for_help(int argc, char** argv, int first = 1);
bool asks_for_version(int argc, char** argv, int first = 1);

// When argv asks for the version or for help, prints version_text(tool) or usage() to stdout
// and returns true (the binary then exits 0); otherwise returns false and prints nothing.
bool answer_help_or_version(int argc, char** argv, const std::string& tool,
                            const std::function<std::string()>& usage);

struct Option {
  std::string name;          // "--config", "-o key=value"
  std::string default_text;  // "" when it has none worth printing
  std::string meaning;
};

struct Usage {
  std::string synopsis;  // "gpubox_data gen --out DIR --lines N [options]"
  std::string summary;   // what it does
  std::vector<Option> options;
  std::vector<std::string> examples;
  std::string notes;  // printed last, as written
};

// "usage: <synopsis>\n\n<summary>\n\noptions:\n  --name (default: D)\n      meaning...\n\n
// example:\n  ...\n", the meanings wrapped at 100 columns.
std::string render_usage(const Usage& usage);

}  // namespace gpubox::cli
