#include "common/cli_args.hpp"

#include <algorithm>
#include <cstdio>
#include <variant>

#include "common/config/config_document.hpp"
#include "common/error.hpp"

namespace gpubox::cli {
namespace {

using config::KeySpec;
using config::KeyType;

// Whether a flag of `flag` type may stand for a key of `key` type.
bool compatible(FlagType flag, KeyType key) {
  switch (flag) {
    case FlagType::kBool:
      return key == KeyType::kBool;
    case FlagType::kInt:
      return key == KeyType::kInt;
    case FlagType::kUInt64:
      return key == KeyType::kUInt64;
    case FlagType::kFloat:
      return key == KeyType::kFloat;
    case FlagType::kString:
      return key == KeyType::kString || key == KeyType::kPath || key == KeyType::kWorkPath ||
             key == KeyType::kEnum;
    case FlagType::kLoose:
      return false;
  }
  return false;
}

// The config reader's view of a flag: its key's spec (type, range, choices) narrowed to the
// flag's own range, or a spec made from the flag alone. Its name is how errors name the flag.
KeySpec key_spec_of(const FlagSpec& flag) {
  KeySpec k;
  if (!flag.key.empty()) {
    const KeySpec* table = config::find_key(flag.key);
    GPUBOX_EXPECTS(table != nullptr, "flag --", flag.name, " mirrors ", flag.key,
                   ", which is not in the config key table");
    GPUBOX_EXPECTS(compatible(flag.type, table->type), "flag --", flag.name,
                   " has another type than the config key ", flag.key);
    k = *table;
    k.int_min = std::max(k.int_min, flag.int_min);
    k.int_max = std::min(k.int_max, flag.int_max);
    k.float_min = std::max(k.float_min, flag.float_min);
    k.float_max = std::min(k.float_max, flag.float_max);
  } else {
    k.type = flag.type == FlagType::kBool     ? KeyType::kBool
             : flag.type == FlagType::kInt    ? KeyType::kInt
             : flag.type == FlagType::kUInt64 ? KeyType::kUInt64
             : flag.type == FlagType::kFloat  ? KeyType::kFloat
                                              : KeyType::kString;
    k.int_min = flag.int_min;
    k.int_max = flag.int_max;
    k.float_min = flag.float_min;
    k.float_max = flag.float_max;
  }
  k.name = "--" + flag.name + (flag.key.empty() ? "" : " (" + flag.key + ")");
  return k;
}

// A typed value as text that the flag's own parser (gflags, strtod) reads back exactly.
struct CanonicalText {
  std::string operator()(bool v) const { return v ? "true" : "false"; }
  std::string operator()(int64_t v) const { return std::to_string(v); }
  std::string operator()(uint64_t v) const { return std::to_string(v); }
  std::string operator()(double v) const {
    char text[40];
    std::snprintf(text, sizeof(text), "%.17g", v);
    return text;
  }
  template <class T>
  std::string operator()(const T&) const {
    return "";  // strings keep the text given
  }
};

std::string canonical_name(std::string name) {
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

}  // namespace

std::string FlagSpec::range_text() const {
  const bool numeric = type == FlagType::kInt || type == FlagType::kFloat;
  if (!numeric && key.empty()) return "";
  // No bound worth stating (a flag whose range is its variable's whole type).
  const bool unbounded_int = type == FlagType::kInt &&
                             int_min <= std::numeric_limits<int32_t>::min() &&
                             int_max >= std::numeric_limits<int32_t>::max();
  const bool unbounded_float = type == FlagType::kFloat &&
                               float_min <= -std::numeric_limits<double>::max() &&
                               float_max >= std::numeric_limits<double>::max();
  if (key.empty() && (unbounded_int || unbounded_float)) return "";
  return config::type_text(key_spec_of(*this)) + (key.empty() ? "" : " (" + key + ")");
}

// One pass over the arguments of a command (parse_args).
class ArgParser {
 public:
  ArgParser(const CommandSpec& spec, const std::vector<std::string>& args)
      : spec_(spec), args_(args) {}

  StatusOr<ParsedArgs> run() {
    bool only_positionals = false;
    for (i_ = 0; i_ < args_.size(); ++i_) {
      const std::string& a = args_[i_];
      if (only_positionals || a.size() < 2 || a[0] != '-') {
        GPUBOX_RETURN_IF_ERROR(positional(a));
      } else if (a == "--") {
        only_positionals = true;
      } else {
        GPUBOX_RETURN_IF_ERROR(dashed(a));
      }
    }
    return std::move(out_);
  }

 private:
  // `a` starts with '-': a flag, a negated true/false flag, or an override.
  Status dashed(const std::string& a) {
    const bool two_dashes = a[1] == '-';
    const std::string body = a.substr(two_dashes ? 2 : 1);
    const std::size_t eq = body.find('=');
    const std::string name = canonical_name(body.substr(0, eq));
    std::optional<std::string> value;
    if (eq != std::string::npos) value = body.substr(eq + 1);
    if (const FlagSpec* flag = find(name)) return take_flag(*flag, value);
    if (const FlagSpec* flag = name.rfind("no", 0) == 0 ? find(name.substr(2)) : nullptr;
        flag != nullptr && flag->type == FlagType::kBool && !value) {
      return set(*flag, "false");
    }
    if (name == "o") {
      if (!value && i_ + 1 < args_.size()) value = args_[++i_];
      return override_of(value.value_or(""));
    }
    // -okey=value: config keys hold a '.', flag names never do.
    if (!two_dashes && body.size() > 1 && body[0] == 'o' && eq != std::string::npos) {
      return override_of(body.substr(1));
    }
    return unknown(a);
  }

  Status take_flag(const FlagSpec& flag, std::optional<std::string> value) {
    if (flag.type == FlagType::kBool) {
      std::string text = value.value_or("true");
      if (text == "1" || text == "0") text = text == "1" ? "true" : "false";
      return set(flag, text);
    }
    if (!value && i_ + 1 < args_.size() &&
        (flag.type != FlagType::kLoose || args_[i_ + 1].empty() || args_[i_ + 1][0] != '-')) {
      value = args_[++i_];
    }
    if (!value && flag.type != FlagType::kLoose) {
      return Status::InvalidArgument("--" + flag.name + " needs a value");
    }
    return set(flag, value.value_or(""));
  }

  Status set(const FlagSpec& flag, const std::string& text) {
    // A flag given twice would be read as its last value, the first dropped unsaid (a config
    // key given twice in a YAML file is refused alike).
    if (const auto given = out_.text_.find(flag.name); given != out_.text_.end()) {
      return Status::InvalidArgument("--" + flag.name + " given twice (" + given->second +
                                     ", then " + text + "): give it once");
    }
    config::ConfigValue value;
    GPUBOX_RETURN_IF_ERROR(config::parse_value_text(key_spec_of(flag), text, &value));
    if (flag.type == FlagType::kString || flag.type == FlagType::kLoose) value = text;
    std::string canonical = std::visit(CanonicalText{}, value);
    out_.text_[flag.name] = canonical.empty() ? text : canonical;
    out_.values_[flag.name] = std::move(value);
    return Status::OK();
  }

  Status override_of(const std::string& text) {
    if (!spec_.takes_overrides) {
      return Status::InvalidArgument("-o " + text + ": " + spec_.tool +
                                     " reads no config, so it takes no -o key=value");
    }
    if (text.empty() || text.find('=') == std::string::npos || text[0] == '=') {
      return Status::InvalidArgument("-o needs key=value, got '" + text + "'");
    }
    out_.overrides.push_back(text);
    return Status::OK();
  }

  Status positional(const std::string& a) {
    if (!spec_.takes_positionals) return Status::InvalidArgument("unexpected argument '" + a + "'");
    out_.positionals.push_back(a);
    return Status::OK();
  }

  Status unknown(const std::string& a) const {
    const std::size_t start = a.find_first_not_of('-');
    const std::string name = canonical_name(start == std::string::npos ? "" : a.substr(start));
    std::string text = "unknown flag '" + a + "'";
    const std::size_t bound = std::max<std::size_t>(1, name.size() / 3);
    std::vector<std::string> close;
    for (const FlagSpec& f : spec_.flags) {
      if (close.size() < 3 &&
          config::edit_distance_within(name.substr(0, name.find('=')), f.name, bound) <= bound) {
        close.push_back("--" + f.name);
      }
    }
    for (std::size_t k = 0; k < close.size(); ++k) {
      text += (k == 0 ? " (did you mean " : " or ") + close[k];
    }
    return Status::InvalidArgument(close.empty() ? text : text + "?)");
  }

  const FlagSpec* find(const std::string& name) const {
    for (const FlagSpec& f : spec_.flags) {
      if (f.name == name) return &f;
    }
    return nullptr;
  }

  const CommandSpec& spec_;
  const std::vector<std::string>& args_;
  std::size_t i_ = 0;
  ParsedArgs out_;
};

StatusOr<ParsedArgs> parse_args(const CommandSpec& spec, const std::vector<std::string>& args) {
  return ArgParser(spec, args).run();
}

CommandLine parse_command_line(const CommandSpec& spec, int argc, char** argv, int first) {
  CommandLine out;
  if (asks_for_version(argc, argv, first)) {
    std::printf("%s\n", version_text(spec.tool.substr(0, spec.tool.find(' '))).c_str());
    out.exit_code = 0;
    return out;
  }
  if (asks_for_help(argc, argv, first)) {
    std::fputs(spec.usage ? spec.usage().c_str() : "", stdout);
    out.exit_code = 0;
    return out;
  }
  const std::vector<std::string> args(argv + std::min(first, argc), argv + argc);
  StatusOr<ParsedArgs> parsed = parse_args(spec, args);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s: %s (%s --help lists its flags)\n", spec.tool.c_str(),
                 parsed.status().message().c_str(), spec.tool.c_str());
    out.exit_code = 2;
    return out;
  }
  out.args = std::move(parsed).value();
  return out;
}

std::vector<Option> options_of(const std::vector<FlagSpec>& flags) {
  std::vector<Option> out;
  for (const FlagSpec& f : flags) {
    const std::string range = f.range_text();
    out.push_back({"--" + f.name + (f.value_name.empty() ? "" : " " + f.value_name), f.default_text,
                   f.meaning + (range.empty() ? "" : " [" + range + "]")});
  }
  return out;
}

bool ParsedArgs::get_bool(std::string_view name, bool fallback) const {
  auto it = values_.find(std::string(name));
  return it == values_.end() ? fallback : std::get<bool>(it->second);
}

int64_t ParsedArgs::get_int(std::string_view name, int64_t fallback) const {
  auto it = values_.find(std::string(name));
  return it == values_.end() ? fallback : std::get<int64_t>(it->second);
}

uint64_t ParsedArgs::get_uint64(std::string_view name, uint64_t fallback) const {
  auto it = values_.find(std::string(name));
  return it == values_.end() ? fallback : std::get<uint64_t>(it->second);
}

double ParsedArgs::get_float(std::string_view name, double fallback) const {
  auto it = values_.find(std::string(name));
  return it == values_.end() ? fallback : std::get<double>(it->second);
}

std::string ParsedArgs::get_string(std::string_view name, const std::string& fallback) const {
  auto it = values_.find(std::string(name));
  return it == values_.end() ? fallback : std::get<std::string>(it->second);
}

}  // namespace gpubox::cli
