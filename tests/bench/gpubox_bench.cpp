#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <sstream>
#include <string>
#include <variant>

#include "common/cli.hpp"
#include "common/cli_args.hpp"
#include "common/config/config_document.hpp"
#include "common/error.hpp"
#include "common/error_report.hpp"
#include "heterps/device/card.hpp"
#include "tests/bench/bench_command.hpp"

namespace gpubox::bench {

std::map<std::string, BenchCommand>& bench_commands() {
  static std::map<std::string, BenchCommand> commands;
  return commands;
}

BenchArgs::BenchArgs(std::string command, int argc, char** argv)
    : command_(std::move(command)), args_(argv, argv + argc) {}

void BenchArgs::expect_only(const std::vector<std::string>& known) const {
  cli::CommandSpec spec;
  spec.tool = "gpubox_bench " + command_;
  for (const std::string& name : known) {
    cli::FlagSpec flag;
    flag.name = name;
    std::replace(flag.name.begin(), flag.name.end(), '-', '_');  // the front end's spelling
    flag.type = cli::FlagType::kLoose;
    spec.flags.push_back(flag);
  }
  StatusOr<cli::ParsedArgs> parsed = cli::parse_args(spec, args_);
  if (!parsed.ok()) throw BenchUsageError(parsed.status().message());
  values_ = parsed->given_text();
  parsed_ = true;
}

bool BenchArgs::has(const std::string& name) const {
  GPUBOX_EXPECTS(parsed_, "gpubox_bench ", command_, ": expect_only must come first");
  std::string key = name;
  std::replace(key.begin(), key.end(), '-', '_');
  return values_.count(key) > 0;
}

std::string BenchArgs::get(const std::string& name, const std::string& fallback) const {
  if (!has(name)) return fallback;
  std::string key = name;
  std::replace(key.begin(), key.end(), '-', '_');
  return values_.at(key);
}

namespace {

// A value read as a config value of that type is (config::parse_value_text): one reading of
// numbers for every binary.
config::ConfigValue read_number(const std::string& name, const std::string& text,
                                config::KeyType type) {
  config::KeySpec spec;
  spec.name = "--" + name;
  spec.type = type;
  spec.int_min = std::numeric_limits<int64_t>::min();
  spec.int_max = std::numeric_limits<int64_t>::max();
  spec.float_min = -std::numeric_limits<double>::max();
  spec.float_max = std::numeric_limits<double>::max();
  config::ConfigValue value;
  const Status st = config::parse_value_text(spec, text, &value);
  if (!st.ok()) throw BenchUsageError(st.message());
  return value;
}

}  // namespace

long long BenchArgs::get_int(const std::string& name, long long fallback) const {
  if (!has(name)) return fallback;
  return std::get<int64_t>(read_number(name, get(name, ""), config::KeyType::kInt));
}

double BenchArgs::get_double(const std::string& name, double fallback) const {
  if (!has(name)) return fallback;
  return std::get<double>(read_number(name, get(name, ""), config::KeyType::kFloat));
}

std::vector<long long> BenchArgs::get_int_list(const std::string& name, const std::string& fallback,
                                               long long min, long long max) const {
  const std::string text = get(name, fallback);
  std::vector<long long> out;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.empty()) throw BenchUsageError("--" + name + " has an empty item in '" + text + "'");
    const auto value = std::get<int64_t>(read_number(name, item, config::KeyType::kInt));
    if (value < min || value > max) {
      throw BenchUsageError(::gpubox::detail::concat("--", name, " wants integers in [", min, ", ",
                                                     max, "], got ", value, " in '", text, "'"));
    }
    out.push_back(value);
  }
  if (out.empty()) throw BenchUsageError("--" + name + " wants a list like 1,2; got ''");
  return out;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

double load_average() {
  double load = -1.0;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = -1.0;
    std::fclose(f);
  }
  return load;
}

}  // namespace gpubox::bench

namespace {

std::string overall_usage() {
  std::string out =
      "usage: gpubox_bench <command> [options]\n\nMicro-benchmarks of GPUBox's parts (figures "
      "and their limits: BENCHMARKS.md).\n\ncommands:\n";
  for (const auto& [name, cmd] : gpubox::bench::bench_commands()) {
    out += "  " + name + " " + cmd.usage + "\n";
  }
  return out + "\nexample:\n  gpubox_bench step --json\n";
}

}  // namespace

int main(int argc, char** argv) {
  gpubox::device::use_passive_cpu_waits(argv);  // measure what gpubox_train users get
  namespace cli = gpubox::cli;
  using gpubox::bench::bench_commands;
  if (argc >= 2 && cli::asks_for_version(argc, argv, 1)) {
    std::printf("%s\n", cli::version_text("gpubox_bench").c_str());
    return 0;
  }
  const bool known = argc >= 2 && bench_commands().count(argv[1]) > 0;
  if (!known) {
    const bool help = argc >= 2 && cli::asks_for_help(argc, argv, 1);
    if (argc >= 2 && !help) std::fprintf(stderr, "gpubox_bench: unknown command '%s'\n", argv[1]);
    std::fputs(overall_usage().c_str(), help ? stdout : stderr);
    return help ? 0 : 2;
  }
  const std::string command = argv[1];
  if (cli::asks_for_help(argc, argv, 2)) {
    std::printf("usage: gpubox_bench %s %s\n", command.c_str(),
                bench_commands()[command].usage.c_str());
    return 0;
  }
  try {
    return bench_commands()[command].main(gpubox::bench::BenchArgs(command, argc - 2, argv + 2));
  } catch (const gpubox::bench::BenchUsageError& e) {
    // The front end's form (common/cli_args.hpp): the same words and exit code as every binary.
    std::fprintf(stderr, "gpubox_bench %s: %s (gpubox_bench %s --help lists its flags)\n",
                 command.c_str(), e.what(), command.c_str());
    return 2;
  } catch (const std::exception& e) {
    gpubox::report_top_level(("gpubox_bench " + command).c_str(), e);
    return 1;
  }
}
