#include "common/config/detail/parse_value.hpp"

#include <cmath>
#include <filesystem>
#include <limits>
#include <sstream>

#include "common/enum_names.hpp"

namespace gpubox::config {
namespace detail {
namespace {

namespace fs = std::filesystem;

Status wrong_type(const KeySpec& key, const std::string& wanted, const YAML::Node& node) {
  return Status::InvalidArgument(key.name + ": expected " + wanted + ", got " + describe(node));
}

std::string resolve_path(const std::string& value, const std::string& base_dir) {
  if (value.empty()) return value;
  const fs::path p(value);
  if (p.is_absolute() || base_dir.empty()) return p.lexically_normal().string();
  return (fs::path(base_dir) / p).lexically_normal().string();
}

// An integer written with a leading 0 (0100, -010): YAML 1.1 readers (yaml-cpp, PyYAML, so
// PaddleRec's) take it as octal, YAML 1.2's as decimal, and a user most likely meant decimal:
// 0100 became 64 with nothing said. Refused naming the key and both readings. The advice is
// what every reader takes: YAML 1.2's 0o.. is a string to yaml-cpp and PyYAML.
Status leading_zero(const KeySpec& key, const std::string& text) {
  const std::size_t digits = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
  if (text.size() < digits + 2 || text[digits] != '0' || text[digits + 1] < '0' ||
      text[digits + 1] > '9') {
    return Status::OK();
  }
  const std::size_t first = text.find_first_not_of('0', digits);
  const std::string decimal =
      text.substr(0, digits) + (first == std::string::npos ? "0" : text.substr(first));
  return Status::InvalidArgument(key.name + ": '" + text +
                                 "' has a leading 0, which YAML 1.1 readers take as octal and "
                                 "others as decimal: write " +
                                 decimal +
                                 " for the decimal value, or 0x.. for hex (no reader "
                                 "takes 0o.. for octal)");
}

Status out_of_range(const KeySpec& key, const YAML::Node& node) {
  return Status::InvalidArgument(key.name + ": " + node.Scalar() + " is out of range [" +
                                 std::to_string(key.int_min) + ", " + std::to_string(key.int_max) +
                                 "]");
}

// An integer in [key.int_min, key.int_max]. Integral numbers written as floats (1e6, 2.0) are
// integers too, so that 1e12 is reported as out of range rather than as "not an integer".
Status parse_int(const KeySpec& key, const YAML::Node& node, int64_t* out) {
  if (!node.IsScalar()) return wrong_type(key, "an integer", node);
  GPUBOX_RETURN_IF_ERROR(leading_zero(key, node.Scalar()));
  long long v = 0;
  double d = 0;
  if (!YAML::convert<long long>::decode(node, v)) {
    if (!YAML::convert<double>::decode(node, d) || !std::isfinite(d) || d != std::floor(d)) {
      return wrong_type(key, "an integer", node);
    }
    // Past what int64 holds (2^63, a double exactly): out of range, whatever the key's range (it
    // was clamped to int64's largest, which a key whose range ends there took as given).
    constexpr double kTwoTo63 = 9223372036854775808.0;
    if (d >= kTwoTo63 || d < -kTwoTo63) return out_of_range(key, node);
    v = static_cast<long long>(d);
  }
  if (v < key.int_min || v > key.int_max) return out_of_range(key, node);
  *out = v;
  return Status::OK();
}

Status parse_uint64(const KeySpec& key, const YAML::Node& node, uint64_t* out) {
  const char* wanted = "an integer in [0, 2^64)";
  if (!node.IsScalar() || node.Scalar().empty() || node.Scalar()[0] == '-') {
    return wrong_type(key, wanted, node);
  }
  GPUBOX_RETURN_IF_ERROR(leading_zero(key, node.Scalar()));
  unsigned long long v = 0;
  if (!YAML::convert<unsigned long long>::decode(node, v)) return wrong_type(key, wanted, node);
  *out = v;
  return Status::OK();
}

Status parse_float(const KeySpec& key, const YAML::Node& node, double* out) {
  double v = 0;
  if (!node.IsScalar() || !YAML::convert<double>::decode(node, v)) {
    return wrong_type(key, "a number", node);
  }
  if (!std::isfinite(v)) return wrong_type(key, "a finite number", node);
  // Under a double's smallest (1e-400): read as 0, which a rate or range of 0 means otherwise.
  const std::string& text = node.Scalar();
  if (v == 0 && text.find_first_of("123456789") < text.find_first_of("eE")) {
    return wrong_type(key, "a number a double holds (under about 4.9e-324 it reads as 0)", node);
  }
  if (v < key.float_min || v > key.float_max) {
    std::ostringstream msg;
    msg << key.name << ": " << node.Scalar() << " is out of range [" << key.float_min << ", "
        << key.float_max << "]";
    return Status::InvalidArgument(msg.str());
  }
  *out = v;
  return Status::OK();
}

Status parse_string(const KeySpec& key, const YAML::Node& node, std::string* out) {
  if (node.IsNull()) {
    out->clear();
    return Status::OK();
  }
  if (!node.IsScalar()) return wrong_type(key, "a string", node);
  *out = node.Scalar();
  return Status::OK();
}

Status parse_choice(const KeySpec& key, const YAML::Node& node, std::string* out) {
  std::string choices;
  for (const std::string& c : key.choices) choices += (choices.empty() ? "" : "|") + c;
  if (node.IsScalar()) {
    for (const std::string& c : key.choices) {
      if (::gpubox::detail::same_ignoring_case(c, node.Scalar())) {
        *out = c;
        return Status::OK();
      }
    }
  }
  return wrong_type(key, "one of " + choices, node);
}

// A string, path or work-path key's value (a path key also a list of paths when also_list).
Status parse_text(const KeySpec& key, const YAML::Node& node, const std::string& base_dir,
                  ConfigValue* out) {
  if (key.also_list && node.IsSequence()) {
    // [] would read as "not set": an empty list is a mistake, not a way to unset the key.
    if (node.size() == 0) return wrong_type(key, "a path or a non-empty list of paths", node);
    std::vector<std::string> v;
    for (const YAML::Node& item : node) {
      if (!item.IsScalar() || item.Scalar().empty()) return wrong_type(key, "a path", item);
      v.push_back(resolve_path(item.Scalar(), base_dir));
    }
    *out = std::move(v);
    return Status::OK();
  }
  std::string v;
  GPUBOX_RETURN_IF_ERROR(parse_string(key, node, &v));
  if (key.type == KeyType::kString) {
    *out = v;
  } else {
    *out = resolve_path(v, key.type == KeyType::kPath ? base_dir : std::string());
  }
  return Status::OK();
}

Status check_min_items(const KeySpec& key, std::size_t items) {
  if (items >= key.min_items) return Status::OK();
  return Status::InvalidArgument(key.name + ": needs at least " + std::to_string(key.min_items) +
                                 " item(s)");
}

Status parse_int_list(const KeySpec& key, const YAML::Node& node, ConfigValue* out) {
  if (!node.IsNull() && !node.IsSequence()) return wrong_type(key, "a list of integers", node);
  std::vector<int64_t> v;
  for (const YAML::Node& item : node) {
    int64_t x = 0;
    GPUBOX_RETURN_IF_ERROR(parse_int(key, item, &x));
    v.push_back(x);
  }
  GPUBOX_RETURN_IF_ERROR(check_min_items(key, v.size()));
  *out = std::move(v);
  return Status::OK();
}

// A string list, or a path list (each path resolved against base_dir).
Status parse_string_list(const KeySpec& key, const YAML::Node& node, const std::string& base_dir,
                         ConfigValue* out) {
  const bool paths = key.type == KeyType::kPathList;
  if (!node.IsNull() && !node.IsSequence()) {
    return wrong_type(key, paths ? "a list of paths" : "a list of strings", node);
  }
  std::vector<std::string> v;
  for (const YAML::Node& item : node) {
    if (!item.IsScalar()) return wrong_type(key, paths ? "a path" : "a string", item);
    v.push_back(paths ? resolve_path(item.Scalar(), base_dir) : item.Scalar());
  }
  GPUBOX_RETURN_IF_ERROR(check_min_items(key, v.size()));
  *out = std::move(v);
  return Status::OK();
}

// Slot names to integers; a slot named twice is an error.
Status parse_int_map(const KeySpec& key, const YAML::Node& node, ConfigValue* out) {
  if (!node.IsNull() && !node.IsMap()) {
    return wrong_type(key, "a map of slot names to integers", node);
  }
  IntMap v;
  for (const auto& item : node) {
    if (!item.first.IsScalar() || item.first.Scalar().empty()) {
      return wrong_type(key, "a slot name", item.first);
    }
    int64_t x = 0;
    GPUBOX_RETURN_IF_ERROR(parse_int(key, item.second, &x));
    if (!v.emplace(item.first.Scalar(), x).second) {
      return Status::InvalidArgument(key.name + ": slot " + item.first.Scalar() + " is set twice");
    }
  }
  *out = std::move(v);
  return Status::OK();
}

}  // namespace

bool decode_bool(const YAML::Node& node, bool* out) {
  if (!node.IsScalar()) return false;
  if (node.Scalar() == "0" || node.Scalar() == "1") {
    *out = node.Scalar() == "1";
    return true;
  }
  return YAML::convert<bool>::decode(node, *out);
}

std::string describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "null";
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return "a list";
  return "a map";
}

Status parse_value(const KeySpec& key, const YAML::Node& node, const std::string& base_dir,
                   ConfigValue* out) {
  switch (key.type) {
    case KeyType::kBool: {
      bool v = false;
      if (!decode_bool(node, &v)) return wrong_type(key, "true or false", node);
      *out = v;
      return Status::OK();
    }
    case KeyType::kInt: {
      int64_t v = 0;
      GPUBOX_RETURN_IF_ERROR(parse_int(key, node, &v));
      *out = v;
      return Status::OK();
    }
    case KeyType::kUInt64: {
      uint64_t v = 0;
      GPUBOX_RETURN_IF_ERROR(parse_uint64(key, node, &v));
      *out = v;
      return Status::OK();
    }
    case KeyType::kFloat: {
      double v = 0;
      GPUBOX_RETURN_IF_ERROR(parse_float(key, node, &v));
      *out = v;
      return Status::OK();
    }
    case KeyType::kString:
    case KeyType::kPath:
    case KeyType::kWorkPath:
      return parse_text(key, node, base_dir, out);
    case KeyType::kEnum: {
      std::string v;
      GPUBOX_RETURN_IF_ERROR(parse_choice(key, node, &v));
      *out = v;
      return Status::OK();
    }
    case KeyType::kIntList:
      return parse_int_list(key, node, out);
    case KeyType::kStringList:
    case KeyType::kPathList:
      return parse_string_list(key, node, base_dir, out);
    case KeyType::kIntMap:
      return parse_int_map(key, node, out);
  }
  return Status::Internal(key.name + ": unknown key type");
}

}  // namespace detail

Status parse_value_text(const KeySpec& key, const std::string& text, ConfigValue* out) {
  YAML::Node node;
  const bool list_text = key.also_list && !text.empty() && text.front() == '[';
  if (!list_text && (key.type == KeyType::kString || key.type == KeyType::kPath ||
                     key.type == KeyType::kWorkPath || key.type == KeyType::kEnum)) {
    node = YAML::Node(text);  // the raw text: "slot:feasign" or "sh -c 'x: y'" stay text
  } else {
    try {
      node = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      return Status::InvalidArgument(key.name + ": cannot parse '" + text + "': " + e.msg);
    }
  }
  return detail::parse_value(key, node, std::filesystem::current_path().string(), out);
}

}  // namespace gpubox::config
