#include "common/config/config_document.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/config/detail/value_text.hpp"

namespace gpubox::config {
namespace {

namespace fs = std::filesystem;
using detail::ValueText;

}  // namespace

StatusOr<ConfigDocument> ConfigDocument::load(const std::string& path,
                                              const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {  // an ifstream reads a folder as empty: "the config is empty"
    return Status::InvalidArgument("config file '" + path + "' is a folder, not a YAML file");
  }
  std::ifstream in(path);
  if (!in) return Status::NotFound("cannot open config file '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::IOError("cannot read config file '" + path + "'");
  const fs::path absolute = fs::absolute(fs::path(path)).lexically_normal();
  StatusOr<ConfigDocument> doc =
      parse(text.str(), absolute.parent_path().string(), overrides, path);
  if (doc.ok()) doc->file_path_ = absolute.string();
  return doc;
}

ConfigDocument ConfigDocument::defaults() {
  ConfigDocument doc;
  doc.source_ = "<defaults>";
  return doc;
}

bool ConfigDocument::is_set(std::string_view key) const {
  return values_.find(key) != values_.end();
}

std::optional<int> ConfigDocument::output_layer_width(std::string_view paddlerec_name) const {
  const auto found = output_widths_.find(paddlerec_name);
  if (found == output_widths_.end()) return std::nullopt;
  return found->second;
}

bool ConfigDocument::is_default(std::string_view key) const {
  const KeySpec* spec = find_key(key);
  GPUBOX_EXPECTS(spec != nullptr, "config key ", key, " is not in the key table");
  return value_of(*spec) == spec->default_value;
}

const KeySpec& ConfigDocument::spec_of(std::string_view key, KeyType type) const {
  return spec_of(key, type, type);
}

const KeySpec& ConfigDocument::spec_of(std::string_view key, KeyType type, KeyType or_type) const {
  const KeySpec* spec = find_key(key);
  GPUBOX_EXPECTS(spec != nullptr, "config key ", key, " is not in the key table");
  GPUBOX_EXPECTS(spec->type == type || spec->type == or_type, "config key ", key,
                 " read as another type");
  keys_read_.insert(spec->name);
  return *spec;
}

const ConfigValue& ConfigDocument::value_of(const KeySpec& spec) const {
  auto it = values_.find(spec.name);
  return it != values_.end() ? it->second : spec.default_value;
}

bool ConfigDocument::get_bool(std::string_view key) const {
  return std::get<bool>(value_of(spec_of(key, KeyType::kBool)));
}

uint64_t ConfigDocument::get_uint64(std::string_view key) const {
  return std::get<uint64_t>(value_of(spec_of(key, KeyType::kUInt64)));
}

double ConfigDocument::get_float(std::string_view key) const {
  return std::get<double>(value_of(spec_of(key, KeyType::kFloat)));
}

const std::string& ConfigDocument::get_string(std::string_view key) const {
  const KeySpec* spec = find_key(key);
  const KeyType path =
      spec != nullptr && spec->type == KeyType::kWorkPath ? KeyType::kWorkPath : KeyType::kPath;
  const ConfigValue& value = value_of(spec_of(key, KeyType::kString, path));
  GPUBOX_EXPECTS(std::holds_alternative<std::string>(value), "config key ", key,
                 " holds a list: read it with get_paths");
  return std::get<std::string>(value);
}

std::vector<int> ConfigDocument::get_int_list(std::string_view key) const {
  const KeySpec& spec = spec_of(key, KeyType::kIntList);
  GPUBOX_EXPECTS(spec.int_min >= std::numeric_limits<int>::min() &&
                     spec.int_max <= std::numeric_limits<int>::max(),
                 "config key ", key, " does not fit int");
  const auto& values = std::get<std::vector<int64_t>>(value_of(spec));
  return std::vector<int>(values.begin(), values.end());
}

const std::vector<std::string>& ConfigDocument::get_string_list(std::string_view key) const {
  return std::get<std::vector<std::string>>(
      value_of(spec_of(key, KeyType::kStringList, KeyType::kPathList)));
}

std::vector<std::string> ConfigDocument::get_paths(std::string_view key) const {
  const ConfigValue& value = value_of(spec_of(key, KeyType::kPath));
  if (const auto* list = std::get_if<std::vector<std::string>>(&value)) return *list;
  const std::string& one = std::get<std::string>(value);
  return one.empty() ? std::vector<std::string>{} : std::vector<std::string>{one};
}

const IntMap& ConfigDocument::get_int_map(std::string_view key) const {
  return std::get<IntMap>(value_of(spec_of(key, KeyType::kIntMap)));
}

std::string ConfigDocument::value_text(std::string_view key) const {
  const KeySpec* spec = find_key(key);
  GPUBOX_EXPECTS(spec != nullptr, "config key ", key, " is not in the key table");
  return std::visit(ValueText{}, value_of(*spec));
}

std::vector<std::string> ConfigDocument::no_effect_keys() const {
  std::vector<std::string> out;
  for (const KeySpec& key : config_keys()) {
    if (key.has_effect()) continue;
    auto it = values_.find(key.name);
    if (it != values_.end() && it->second != key.default_value) out.push_back(key.name);
  }
  for (const IgnoredKey& key : ignored_paddlerec_keys()) {
    for (const std::string& name : ignored_set_) {
      if (find_ignored(name) == &key) out.push_back(name);
    }
  }
  for (const auto& [name, reason] : paddlerec_notes_) out.push_back(name);
  return out;
}

std::string ConfigDocument::no_effect_note() const {
  const std::vector<std::string> keys = no_effect_keys();
  if (keys.empty()) return "";
  std::string text = source_ + ": " + std::to_string(keys.size()) + " PaddleRec key" +
                     (keys.size() == 1 ? " has" : "s have") + " no effect in GPUBox:";
  std::map<std::string, std::string> note_reasons(paddlerec_notes_.begin(), paddlerec_notes_.end());
  for (const std::string& k : keys) {
    const KeySpec* spec = find_key(k);
    const IgnoredKey* ignored = spec == nullptr ? find_ignored(k) : nullptr;
    text += "\n  " + k + ": " +
            (spec != nullptr ? spec->meaning
             : ignored       ? ignored->reason
                             : note_reasons[k]);
  }
  return text;
}

std::string ConfigDocument::no_effect_overrides(const std::vector<std::string>& overrides) const {
  const std::vector<std::string> keys = no_effect_keys();
  std::string text;
  for (const std::string& o : overrides) {
    const std::string key = o.substr(0, o.find('='));
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) continue;
    text += (text.empty() ? "" : "; ") + std::string("-o ") + o + ": " + key +
            " has no effect in GPUBox";
  }
  if (text.empty()) return "";
  return text + " (the line on the PaddleRec keys without effect says why and what to set)";
}

}  // namespace gpubox::config
