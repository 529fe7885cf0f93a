#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "common/cli.hpp"
#include "common/error.hpp"
#include "heterps/device/card.hpp"
#include "tests/bench/bench_command.hpp"

namespace gpubox::bench {

std::map<std::string, BenchCommand>& bench_commands() {
  static std::map<std::string, BenchCommand> commands;
  return commands;
}

BenchArgs::BenchArgs(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    GPUBOX_EXPECTS(arg.rfind("--", 0) == 0, "unexpected argument '", arg,
                   "' (options are --name value)");
    arg = arg.substr(2);
    auto eq = arg.find('=');
    if (eq != std::string::npos) {
      values_[arg.substr(0, eq)] = arg.substr(eq + 1);
    } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
      values_[arg] = argv[++i];
    } else {
      values_[arg] = "";
    }
  }
}

std::string BenchArgs::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

long long BenchArgs::get_int(const std::string& name, long long fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  long long v = std::strtoll(it->second.c_str(), &end, 10);
  GPUBOX_EXPECTS(end && *end == '\0' && !it->second.empty(), "--", name, " wants an integer, got '",
                 it->second, "'");
  return v;
}

double BenchArgs::get_double(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  GPUBOX_EXPECTS(end && *end == '\0' && !it->second.empty(), "--", name, " wants a number, got '",
                 it->second, "'");
  return v;
}

void BenchArgs::expect_only(const std::vector<std::string>& known) const {
  for (const auto& [name, value] : values_) {
    GPUBOX_EXPECTS(std::find(known.begin(), known.end(), name) != known.end(), "unknown option --",
                   name);
  }
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

}  // namespace gpubox::bench

int main(int argc, char** argv) {
  gpubox::device::use_passive_cpu_waits(argv);  // measure what gpubox_train users get
  using gpubox::bench::bench_commands;
  if (argc >= 2 && gpubox::cli::asks_for_version(2, argv, 1)) {
    std::printf("%s\n", gpubox::cli::version_text("gpubox_bench").c_str());
    return 0;
  }
  const bool help = argc >= 2 && gpubox::cli::asks_for_help(argc, argv, 1);
  if (argc < 2 || help || bench_commands().count(argv[1]) == 0) {
    std::FILE* out = help ? stdout : stderr;
    std::fprintf(out,
                 "usage: gpubox_bench <command> [options]\n\nMicro-benchmarks of GPUBox's parts "
                 "(figures and their limits: BENCHMARKS.md).\n\ncommands:\n");
    for (const auto& [name, cmd] : bench_commands()) {
      std::fprintf(out, "  %s %s\n", name.c_str(), cmd.usage.c_str());
    }
    std::fprintf(out, "\nexample:\n  gpubox_bench step --json\n");
    return help ? 0 : 2;
  }
  try {
    return bench_commands()[argv[1]].main(gpubox::bench::BenchArgs(argc - 2, argv + 2));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpubox_bench %s: %s\n", argv[1], e.what());
    return 1;
  }
}
