// THE command-line front end of every GPUBox binary and sub-command (gpubox_train, gpubox_server,
// gpubox_serve, gpubox_data gen|stat|convert, gpubox_bench <command>): one set of rules, one
// reading of values, one set of errors. A command declares its flags (CommandSpec; a gflags
// binary has its spec made from its gflags, common/cli_flags.hpp) and parse_command_line does
// the rest:
//
//   --help, -h, -help, --helpfull   print the command's usage to stdout, exit 0
//   --version, -version             print "<tool> <version> (commit ..., backend ...)", exit 0
//   --name=value, --name value      a flag (-name works too; '-' and '_' in a name are the same)
//   --flag, --flag=false, --noflag  a true/false flag (never takes the next argument)
//   -o key=value, -okey=value,      a config override, repeatable, in order (only commands that
//   -o=key=value, --o=key=value       read a config take them; others refuse every spelling)
//   --                              the arguments after it are positional
//
// Every value is read by the config's reader (config::parse_value_text): integers accept 1e6
// but not 1.5, numbers must be finite, and each value must lie in its flag's range — the key
// table's range for a flag that mirrors a config key (FlagSpec::key), else the range declared
// next to the flag. Errors name the flag and exit 2: an unknown flag (with the closest names),
// a missing or bad value, an out-of-range value, a flag given twice (-o is the repeatable one),
// -o for a command without a config, an unexpected positional argument.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/cli.hpp"
#include "common/config/config_keys.hpp"
#include "common/status.hpp"

namespace gpubox::cli {

enum class FlagType {
  kBool,
  kInt,     // int64 within [int_min, int_max]
  kUInt64,  // any 64-bit unsigned integer (seeds)
  kFloat,   // finite double within [float_min, float_max]
  kString,
  // gpubox_bench's sub-commands, which declare names only: the value after '=', else the next
  // argument unless it starts with '-', else "" (a bare switch). Read as text.
  kLoose,
};

struct FlagSpec {
  std::string name;  // "table_shards": no dashes
  FlagType type = FlagType::kString;
  std::string meaning;       // --help
  std::string default_text;  // --help ("" prints none)
  std::string value_name;    // --help: "N" in "--lines N"
  int64_t int_min = std::numeric_limits<int64_t>::min();
  int64_t int_max = std::numeric_limits<int64_t>::max();
  double float_min = -std::numeric_limits<double>::max();
  double float_max = std::numeric_limits<double>::max();
  // A config key this flag stands for (config_keys.hpp): its type and range apply (intersected
  // with the range above, which then only narrows it to what the flag's variable holds).
  std::string key;
  // "integer in [1, 65536] (runner.host_table_shards)": the range --help prints, "" for none.
  std::string range_text() const;
};

struct CommandSpec {
  std::string tool;  // "gpubox_data stat": how errors and --version name the command
  std::vector<FlagSpec> flags;
  bool takes_overrides = false;        // -o key=value (the command reads a config)
  bool takes_positionals = false;      // arguments that are not flags
  std::function<std::string()> usage;  // the --help text
};

// The arguments of one command line, checked against its CommandSpec.
class ParsedArgs {
 public:
  std::vector<std::string> overrides;    // "key=value", in command-line order
  std::vector<std::string> positionals;  // in order

  // Whether the flag was given.
  bool has(std::string_view name) const { return values_.count(std::string(name)) > 0; }
  // The value given, else `fallback`; asking with another type than declared throws.
  bool get_bool(std::string_view name, bool fallback = false) const;
  int64_t get_int(std::string_view name, int64_t fallback) const;
  uint64_t get_uint64(std::string_view name, uint64_t fallback) const;
  double get_float(std::string_view name, double fallback) const;
  std::string get_string(std::string_view name, const std::string& fallback) const;
  // Flag name -> the value given, as text a parser of its type reads back exactly ("4000000"
  // for --lines 4e6; "true"/"false"; strings as given). In name order.
  const std::map<std::string, std::string>& given_text() const { return text_; }

 private:
  friend class ArgParser;
  std::map<std::string, config::ConfigValue> values_;
  std::map<std::string, std::string> text_;
};

// Parses `args` (the arguments after the program or sub-command name) by the rules above; help
// and version requests are not handled here. Errors are InvalidArgument naming the flag.
StatusOr<ParsedArgs> parse_args(const CommandSpec& spec, const std::vector<std::string>& args);

// The whole front end: argv[first, argc) asks for help or the version -> printed, *exit_code 0;
// bad -> "<tool>: <error> (<tool> --help lists the flags)" on stderr, *exit_code 2; else the
// parsed arguments (exit_code unset).
struct CommandLine {
  std::optional<int> exit_code;
  ParsedArgs args;
};
CommandLine parse_command_line(const CommandSpec& spec, int argc, char** argv, int first = 1);

// The --help options of `flags` ("--lines N (default: 1000)", meaning + range).
std::vector<Option> options_of(const std::vector<FlagSpec>& flags);

}  // namespace gpubox::cli
