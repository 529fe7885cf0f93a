#include "common/cli_flags.hpp"

#include <gflags/gflags.h>

#include <limits>
#include <map>

#include "common/error.hpp"

namespace gpubox::cli {
namespace {

struct FlagRule {
  int64_t int_min = std::numeric_limits<int64_t>::min();
  int64_t int_max = std::numeric_limits<int64_t>::max();
  double float_min = -std::numeric_limits<double>::max();
  double float_max = std::numeric_limits<double>::max();
  std::string key;
};

// Flag name -> its declared rule (filled before main by the macros).
std::map<std::string, FlagRule>& rules() {
  static std::map<std::string, FlagRule> r;
  return r;
}

bool declare_int(const char* name, int64_t min, int64_t max) {
  FlagRule& rule = rules()[name];
  rule.int_min = min;
  rule.int_max = max;
  return true;
}

// The flag's type, and the range of the variable gflags holds it in.
FlagSpec spec_of(const gflags::CommandLineFlagInfo& f) {
  FlagSpec s;
  s.name = f.name;
  s.meaning = f.description;
  s.default_text = f.type == "string" ? "\"" + f.default_value + "\"" : f.default_value;
  if (f.type == "bool") {
    s.type = FlagType::kBool;
  } else if (f.type == "double") {
    s.type = FlagType::kFloat;
  } else if (f.type == "string") {
    s.type = FlagType::kString;
  } else {
    s.type = FlagType::kInt;
    if (f.type == "int32") {
      s.int_min = std::numeric_limits<int32_t>::min();
      s.int_max = std::numeric_limits<int32_t>::max();
    } else if (f.type == "uint32") {
      s.int_min = 0;
      s.int_max = std::numeric_limits<uint32_t>::max();
    } else if (f.type == "uint64") {
      s.int_min = 0;  // and int64's max: no flag needs more
    } else {
      GPUBOX_EXPECTS(f.type == "int64", "flag --", f.name, ": gflags type ", f.type,
                     " not handled");
    }
  }
  return s;
}

// The flags of `defining_file`; `require_ranges`: a numeric flag without a declared range
// throws (the front end reads no number unchecked; --help alone shows what is declared).
std::vector<FlagSpec> specs_of(const char* defining_file, bool require_ranges) {
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);  // sorted by name
  std::vector<FlagSpec> out;
  for (const gflags::CommandLineFlagInfo& f : flags) {
    if (f.filename != defining_file) continue;
    FlagSpec s = spec_of(f);
    const auto rule = rules().find(f.name);
    const bool numeric = s.type == FlagType::kInt || s.type == FlagType::kFloat;
    GPUBOX_EXPECTS(!require_ranges || !numeric || rule != rules().end(), "flag --", f.name,
                   " has no declared range: add GPUBOX_FLAG_RANGE or GPUBOX_FLAG_KEY next to it");
    if (rule != rules().end()) {
      s.int_min = std::max(s.int_min, rule->second.int_min);
      s.int_max = std::min(s.int_max, rule->second.int_max);
      s.float_min = rule->second.float_min;
      s.float_max = rule->second.float_max;
      s.key = rule->second.key;
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

bool declare_flag_range(const char* name, const int32_t*, int64_t min, int64_t max) {
  return declare_int(name, min, max);
}
bool declare_flag_range(const char* name, const uint32_t*, int64_t min, int64_t max) {
  return declare_int(name, min, max);
}
bool declare_flag_range(const char* name, const int64_t*, int64_t min, int64_t max) {
  return declare_int(name, min, max);
}
bool declare_flag_range(const char* name, const uint64_t*, int64_t min, int64_t max) {
  return declare_int(name, min, max);
}
bool declare_flag_range(const char* name, const double*, double min, double max) {
  FlagRule& rule = rules()[name];
  rule.float_min = min;
  rule.float_max = max;
  return true;
}
bool declare_flag_key(const char* name, const void*, const char* key) {
  rules()[name].key = key;
  return true;
}

std::vector<FlagSpec> gflags_flag_specs(const char* defining_file) {
  return specs_of(defining_file, true);
}

std::vector<Option> gflags_options(const char* defining_file) {
  return options_of(specs_of(defining_file, false));
}

CommandLine parse_gflags_command_line(const CommandSpec& spec, int argc, char** argv) {
  CommandLine line = parse_command_line(spec, argc, argv);
  if (line.exit_code) return line;
  for (const auto& [name, text] : line.args.given_text()) {
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(name.c_str(), &info)) continue;  // the caller's own flag
    const std::string result = gflags::SetCommandLineOption(name.c_str(), text.c_str());
    GPUBOX_EXPECTS(!result.empty(), "--", name, ": gflags refused '", text,
                   "', which the front end accepted");
  }
  return line;
}

}  // namespace gpubox::cli
