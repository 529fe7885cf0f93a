// ConfigDocument::parse: the builder that reads a config's YAML map and its -o overrides into a
// ConfigDocument (config_document.hpp), key by key against the key table.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "common/config/config_document.hpp"
#include "common/config/detail/paddlerec_tables.hpp"
#include "common/config/detail/parse_value.hpp"
#include "common/config/detail/value_text.hpp"
#include "common/config/detail/yaml_document.hpp"
#include "common/config/slot_dims.hpp"

namespace gpubox::config {
namespace {

using detail::describe;
using detail::ValueText;

}  // namespace

// Fills a ConfigDocument from YAML and overrides, stopping at the first error.
class DocumentBuilder {
 public:
  explicit DocumentBuilder(std::string source) { doc_.source_ = std::move(source); }

  // Keys an override (-o key=value) replaces: the file's value of such a key is not checked, so
  // `-o runner.sync_mode=gpubox` runs a PaddleRec config whose value GPUBox does not take.
  void set_overridden(const std::vector<std::string>& overrides) {
    for (const std::string& o : overrides) {
      const auto eq = o.find('=');
      if (eq == std::string::npos) continue;
      const std::string name = o.substr(0, eq);
      const KeyAlias* alias = find_alias(name);
      // A conditional alias's override may not apply (apply_conditional): the file's value of
      // its key stays read until it does.
      if (alias != nullptr && !alias->only_when.empty()) continue;
      overridden_.insert(alias != nullptr && !alias->key.empty() ? alias->key : name);
    }
  }

  Status apply_root(const YAML::Node& root, const std::string& base_dir) {
    if (root.IsNull() || (root.IsMap() && root.size() == 0)) {
      return Status::InvalidArgument(
          doc_.source_ +
          ": the config is empty (expected a map of keys such as runner: and hyper_parameters:)");
    }
    if (!root.IsMap()) {
      return Status::InvalidArgument(
          doc_.source_ + ": expected a map of keys at the top level, got " + describe(root));
    }
    base_dir_ = base_dir;
    apply_map(root, "", base_dir);
    return file_errors();
  }

  Status apply_override(const std::string& text) {
    const auto eq = text.find('=');
    if (eq == std::string::npos || eq == 0) {
      return error("-o '" + text + "': expected key=value");
    }
    const std::string name = text.substr(0, eq);
    const std::string value = text.substr(eq + 1);
    const KeySpec* key = find_key(name);
    const KeyAlias* alias = key == nullptr ? find_alias(name) : nullptr;
    const bool table = key == nullptr && name.rfind("table_parameters.", 0) == 0;
    if (alias != nullptr || table) {
      YAML::Node node;
      try {
        node = YAML::Load(value);
      } catch (const YAML::Exception& e) {
        return error("-o: " + name + ": cannot parse '" + value + "': " + e.msg);
      }
      if (table) return apply_table_override(name, node);
      const KeySpec* target = nullptr;
      YAML::Node translated;
      GPUBOX_RETURN_IF_ERROR(translate(*alias, node, &target, &translated).with_context("-o"));
      note_output_width(*alias, node);
      if (target == nullptr) return Status::OK();
      if (!alias->only_when.empty()) {
        conditional_.push_back({alias, translated, 0, ""});
        return Status::OK();
      }
      ConfigValue parsed;
      const Status st = detail::parse_value(*target, translated, "", &parsed);
      if (!st.ok()) return error("-o: " + name + " (" + target->name + "): " + st.message());
      drop_earlier_conditional_overrides(target->name);
      doc_.values_[target->name] = std::move(parsed);
      return Status::OK();
    }
    if (key == nullptr && find_ignored(name) != nullptr) {
      doc_.ignored_set_.insert(name);
      return Status::OK();
    }
    if (key == nullptr) return error("-o: " + unknown_key(name));
    ConfigValue parsed;
    const Status st = parse_value_text(*key, value, &parsed);
    if (!st.ok()) return error("-o: " + st.message());
    drop_earlier_conditional_overrides(key->name);
    resolve_data_folders(*key, value, &parsed);
    doc_.values_[key->name] = std::move(parsed);
    return Status::OK();
  }

  // An -o data folder given relative is the working directory's (GPUBox's rule), but PaddleRec
  // joins it with the config's folder: where only the config's folder has it, that is read (a
  // PaddleRec command line failed, "does not exist"); where both have one, the working
  // directory's is, and said (a data/ folder there trained silently while the test data came
  // from the config's folder).
  void resolve_data_folders(const KeySpec& key, const std::string& text, ConfigValue* value) {
    if (base_dir_.empty() ||
        (key.name != "runner.train_data_dir" && key.name != "runner.test_data_dir" &&
         key.name != "runner.pass_dirs")) {
      return;
    }
    // The paths as written (parse_value_text made them the working directory's, absolute).
    std::vector<std::string> written;
    if (!text.empty() && text.front() == '[') {
      try {
        for (const YAML::Node& item : YAML::Load(text)) written.push_back(item.as<std::string>());
      } catch (const YAML::Exception&) {
        return;  // parsed above; nothing to say
      }
    } else {
      written.push_back(text);
    }
    std::size_t index = 0;
    const auto resolve = [&](std::string* path) {
      namespace fs = std::filesystem;
      const std::string as_written = index < written.size() ? written[index] : "";
      ++index;
      if (as_written.empty() || fs::path(as_written).is_absolute()) return;
      const fs::path beside = fs::path(base_dir_) / as_written;
      std::error_code ec;
      const bool here = fs::exists(*path, ec);
      const bool there = fs::exists(beside, ec);
      if (!there || (here && fs::equivalent(*path, beside, ec))) return;
      if (here) {
        doc_.override_path_notes_.emplace_back(
            true, "-o " + key.name + "=" + as_written + " reads " + *path +
                      " (the working directory's), not " + beside.lexically_normal().string() +
                      " beside the config, which PaddleRec would read");
        return;
      }
      doc_.override_path_notes_.emplace_back(
          false, "-o " + key.name + "=" + as_written + " reads " +
                     beside.lexically_normal().string() +
                     ", beside the config, as PaddleRec does (the working directory has no " +
                     as_written + ")");
      *path = beside.lexically_normal().string();
    };
    if (auto* one = std::get_if<std::string>(value)) resolve(one);
    if (auto* list = std::get_if<std::vector<std::string>>(value)) {
      for (std::string& path : *list) resolve(&path);
    }
  }

  // Overrides apply in order, the last of a key winning; a conditional alias's override waits
  // for apply_conditional, so a later override of its key drops it (`-o low_rank=8 -o
  // cross_rank=4` trains rank 4, with or without the mixture).
  void drop_earlier_conditional_overrides(const std::string& key_name) {
    conditional_.erase(std::remove_if(conditional_.begin(), conditional_.end(),
                                      [&](const Conditional& c) {
                                        return c.line == 0 && c.alias->key == key_name;
                                      }),
                       conditional_.end());
  }

  // Every unknown key of the file in one error (one alone keeps the one-line form; past
  // kUnknownKeysListed, a count), then the first other error of the file.
  Status file_errors() const {
    if (unknown_.empty()) return first_error_;
    if (unknown_.size() == 1 && first_error_.ok()) return unknown_[0];
    std::string text = doc_.source_ + ": " + std::to_string(unknown_.size() + unknown_unlisted_) +
                       " unknown keys (gpubox_train --print_config_keys lists the valid ones):";
    for (const Status& s : unknown_) text += "\n  " + s.message();
    if (unknown_unlisted_ > 0) {
      text += "\n  ... and " + std::to_string(unknown_unlisted_) + " more unknown keys";
    }
    if (!first_error_.ok()) text += "\n  " + first_error_.message();
    return Status::InvalidArgument(text);
  }

  // The aliases that apply only when another key is true (KeyAlias::only_when), now that the
  // file and every override are read: each sets its key, as it would have in file order, or is
  // listed as having no effect, with why.
  Status apply_conditional() {
    for (const Conditional& c : conditional_) {
      const KeyAlias& alias = *c.alias;
      if (!std::get<bool>(doc_.value_of(*find_key(alias.only_when)))) {
        doc_.paddlerec_notes_.emplace_back(
            alias.name, alias.reason + "; it applies with " + alias.only_when + " true only");
        continue;
      }
      const KeySpec& key = *find_key(alias.key);
      if (c.line > 0) {
        set_value(key, c.value, alias.name, c.line, c.base_dir);
        continue;
      }
      ConfigValue parsed;
      const Status st = detail::parse_value(key, c.value, "", &parsed);
      if (!st.ok()) return error("-o: " + alias.name + " (" + key.name + "): " + st.message());
      doc_.values_[key.name] = std::move(parsed);
    }
    return first_error_;
  }

  // Rules that tie keys together, checked after every value is in.
  Status check_rules() {
    const std::string so = "hyper_parameters.sparse_optimizer.";
    for (const char* prefix : {"", "mf_"}) {
      const std::string lo = so + prefix + "min_bound";
      const std::string hi = so + prefix + "max_bound";
      const double lower = std::get<double>(doc_.value_of(*find_key(lo)));
      const double upper = std::get<double>(doc_.value_of(*find_key(hi)));
      if (lower > upper) {
        std::ostringstream msg;
        msg << lo << " (" << lower << ") is greater than " << hi << " (" << upper << ")";
        return error(msg.str());
      }
    }
    const auto& names =
        std::get<std::vector<std::string>>(doc_.value_of(*find_key("hyper_parameters.slot_names")));
    const int64_t slots =
        std::get<int64_t>(doc_.value_of(*find_key("hyper_parameters.sparse_inputs_slots")));
    if (!names.empty() && static_cast<int64_t>(names.size()) != slots - 1) {
      return error("hyper_parameters.slot_names has " + std::to_string(names.size()) +
                   " names but hyper_parameters.sparse_inputs_slots = " + std::to_string(slots) +
                   " means " + std::to_string(slots - 1) +
                   " sparse slots (the label counts as one)");
    }
    // slot_dims names slots of the data and stays within the table's bounds (slot_dims.hpp:
    // the rules the table part reads it by).
    const auto dims = resolve_slot_dims(
        std::get<IntMap>(doc_.value_of(*find_key("hyper_parameters.slot_dims"))), names, slots,
        std::get<int64_t>(doc_.value_of(*find_key("hyper_parameters.sparse_feature_dim"))) - 1);
    if (!dims.ok()) return error(dims.status().message());
    return check_output_width();
  }

  ConfigDocument take() { return std::move(doc_); }

 private:
  // hyper_parameters.dlrm_output softmax2 (a 2-wide output layer) asked for beside PaddleRec's
  // top_layer_sizes ending in 1 (one logit): which one was meant is the user's to say.
  Status check_output_width() const {
    const std::string output = "hyper_parameters.dlrm_output";
    const std::string top = "hyper_parameters.top_layer_sizes";
    const auto asked = doc_.values_.find(output);
    const auto width = doc_.output_widths_.find(top);
    if (asked == doc_.values_.end() || std::get<std::string>(asked->second) != "softmax2" ||
        width == doc_.output_widths_.end() || width->second != 1) {
      return Status::OK();
    }
    const auto fc_line = lines_.find("hyper_parameters.fc_sizes");
    const std::string top_where =
        overridden_.count("hyper_parameters.fc_sizes") > 0 || fc_line == lines_.end()
            ? "-o"
            : "line " + std::to_string(fc_line->second.line);
    const auto output_line = lines_.find(output);
    const bool output_in_file = overridden_.count(output) == 0 && output_line != lines_.end();
    return error((output_in_file ? "" : "-o: ") + output +
                     ": softmax2 builds a 2-wide output layer, but " + top + " (" + top_where +
                     ") ends in 1, one logit; end " + top + " in 2 or set " + output + " logit",
                 output_in_file ? output_line->second.line : 0);
  }

  Status error(const std::string& what, int line = 0) const {
    const std::string where = line > 0 ? doc_.source_ + ":" + std::to_string(line) : doc_.source_;
    return Status::InvalidArgument(where + ": " + what);
  }

  static std::string unknown_key(const std::string& name) {
    if (is_section(name)) {
      for (const KeySpec& k : config_keys()) {
        if (k.name.compare(0, name.size() + 1, name + ".") == 0) {
          return "'" + name + "' is a section, not a key (set one of its keys, e.g. " + k.name +
                 ")";
        }
      }
    }
    const std::vector<std::string> close = key_suggestions(name);
    std::string text = "unknown key '" + name + "'";
    for (std::size_t i = 0; i < close.size(); ++i) {
      text += (i == 0 ? " (did you mean '" : " or '") + close[i] + "'";
    }
    return close.empty() ? text : text + "?)";
  }

  // Walks the whole map: unknown keys are collected (unknown_), the first other error is kept
  // (first_error_) and ends nothing, so that one run reports every unknown key.
  void apply_map(const YAML::Node& map, const std::string& prefix, const std::string& base_dir) {
    for (const auto& item : map) {
      const int line = item.first.Mark().line + 1;  // yaml-cpp lines are 0-based
      if (!item.first.IsScalar()) {
        keep(error("a key that is not a name", line));
        continue;
      }
      const std::string name =
          prefix.empty() ? item.first.Scalar() : prefix + "." + item.first.Scalar();
      const YAML::Node& value = item.second;
      if (const KeySpec* key = find_key(name)) {
        // A choice left empty (`sync_mode:`) is shown but not set: its default applies and
        // is_set says no (configs/config_collective.yaml shows runner.sync_mode that way, since
        // Collective mode is use_fleet without a sync_mode).
        if (value.IsNull() && key->type == KeyType::kEnum && lines_.count(name) == 0) {
          lines_[name] = {line, ""};
          continue;
        }
        set_value(*key, value, "", line, base_dir);
      } else if (const KeyAlias* alias = find_alias(name)) {
        const KeySpec* target = nullptr;
        YAML::Node translated;
        if (const Status st = translate(*alias, value, &target, &translated); !st.ok()) {
          keep(error(st.message(), line));
          continue;
        }
        note_output_width(*alias, value);
        if (target != nullptr && !alias->only_when.empty()) {
          conditional_.push_back({alias, translated, line, base_dir});
        } else if (target != nullptr) {
          set_value(*target, translated, name, line, base_dir);
        }
      } else if (name == "table_parameters") {
        apply_table_parameters(value, base_dir);
      } else if (find_ignored(name) != nullptr) {
        doc_.ignored_set_.insert(name);  // any value, a whole ignored section included
      } else if (is_section(name)) {
        if (value.IsNull()) continue;  // an empty section
        if (!value.IsMap()) {
          keep(error(name + ": expected a map of keys, got " + describe(value), line));
          continue;
        }
        apply_map(value, name, base_dir);
      } else if (unknown_.size() < kUnknownKeysListed) {
        unknown_.push_back(error(unknown_key(name), line));
      } else {
        ++unknown_unlisted_;
      }
    }
  }

  // Sets `key` from `value`, read at `line` of the file; `from` is the PaddleRec name that sets it
  // ("" for the key itself). A key set twice is an error, unless a PaddleRec name sets it to the
  // value it has (slot_dnn gives both emb_dim and sparse_feature_dim, and its table's
  // embedx_dim). A key an override replaces is not read here (the override's value is checked).
  void set_value(const KeySpec& key, const YAML::Node& value, const std::string& from, int line,
                 const std::string& base_dir) {
    const auto first = lines_.find(key.name);
    if (first != lines_.end() && from.empty() && first->second.from.empty()) {
      keep(
          error(key.name + ": set twice (first on line " + std::to_string(first->second.line) + ")",
                line));
      return;
    }
    if (overridden_.count(key.name) > 0) {
      lines_.emplace(key.name, SetBy{line, from});
      return;
    }
    ConfigValue parsed;
    if (const Status st = detail::parse_value(key, value, base_dir, &parsed); !st.ok()) {
      keep(
          error(from.empty() ? st.message() : from + " (" + key.name + "): " + st.message(), line));
      return;
    }
    if (first != lines_.end()) {
      const auto it = doc_.values_.find(key.name);
      if (it == doc_.values_.end() || it->second != parsed) {
        const std::string value = std::visit(ValueText{}, parsed);
        const std::string by = first->second.from.empty() ? "" : " by " + first->second.from;
        const std::string before =
            it == doc_.values_.end() ? "" : " to " + std::visit(ValueText{}, it->second);
        keep(error((from.empty() ? key.name + " is " : from + " sets " + key.name + " to ") +
                       value + ", set already on line " + std::to_string(first->second.line) + by +
                       before,
                   line));
      }
      return;
    }
    lines_.emplace(key.name, SetBy{line, from});
    doc_.values_[key.name] = std::move(parsed);
  }

  // PaddleRec's table_parameters: each leaf sets a sparse-rule key, or has no effect (noted).
  void apply_table_parameters(const YAML::Node& section, const std::string& base_dir) {
    std::vector<detail::TableSetting> settings;
    std::vector<detail::TableNote> notes;
    int line = 0;
    if (const Status st = detail::translate_table_parameters(section, &settings, &notes, &line);
        !st.ok()) {
      keep(error(st.message(), line));
      return;
    }
    for (const detail::TableSetting& s : settings) {
      set_value(*find_key(s.key), s.value, s.from, s.line, base_dir);
    }
    for (detail::TableNote& n : notes) doc_.paddlerec_notes_.emplace_back(n.from, n.reason);
  }

  // -o table_parameters.<table>.<leaf>=value: as the leaf in the file, replacing its key.
  Status apply_table_override(const std::string& name, const YAML::Node& value) {
    YAML::Node section = value;
    const std::string path = name.substr(std::string("table_parameters.").size());
    for (std::size_t end = path.size(); end != std::string::npos && end > 0;) {
      const std::size_t dot = path.rfind('.', end - 1);
      const std::size_t start = dot == std::string::npos ? 0 : dot + 1;
      YAML::Node parent(YAML::NodeType::Map);
      parent[path.substr(start, end - start)] = section;
      section = parent;
      end = dot;
    }
    std::vector<detail::TableSetting> settings;
    std::vector<detail::TableNote> notes;
    int line = 0;
    // Named as every -o error is: the config's source first (the fuzzer found this one without).
    if (const Status st = detail::translate_table_parameters(section, &settings, &notes, &line);
        !st.ok()) {
      return error("-o: " + st.message());
    }
    for (const detail::TableSetting& s : settings) {
      const KeySpec& key = *find_key(s.key);
      ConfigValue parsed;
      const Status st = detail::parse_value(key, s.value, "", &parsed);
      if (!st.ok()) return error("-o: " + name + " (" + key.name + "): " + st.message());
      doc_.values_[key.name] = std::move(parsed);
    }
    for (detail::TableNote& n : notes) doc_.paddlerec_notes_.emplace_back(n.from, n.reason);
    return Status::OK();
  }

  // The first error of the file other than an unknown key.
  void keep(Status st) {
    if (first_error_.ok()) first_error_ = std::move(st);
  }

  // A kOutputLayerList alias's value without its last entry, which must be 2 or 1: PaddleRec's
  // two-class softmax (hyper_parameters.dlrm_output softmax2, which the 2 selects in PaddleRec's
  // dlrm folder when the key is not set: note_output_width), or one logit.
  static Status hidden_layers(const KeyAlias& alias, const YAML::Node& value, YAML::Node* out) {
    if (!value.IsSequence() || value.size() < 2) {
      return Status::InvalidArgument(
          alias.name +
          ": expected a list of at least two sizes, the hidden layers' then the output layer's "
          "(2: PaddleRec's two-class softmax, or 1: one logit), e.g. [512, 256, 2], got " +
          (value.IsSequence() ? "a list of " + std::to_string(value.size()) : describe(value)));
    }
    const YAML::Node last = value[value.size() - 1];
    long long width = 0;
    if (!last.IsScalar() || !YAML::convert<long long>::decode(last, width) ||
        (width != 1 && width != 2)) {
      return Status::InvalidArgument(
          alias.name +
          ": its last entry is the output layer, which GPUBox builds as PaddleRec's two-class "
          "softmax (2) or one logit (1); got " +
          describe(last));
    }
    YAML::Node hidden(YAML::NodeType::Sequence);
    for (std::size_t i = 0; i + 1 < value.size(); ++i) hidden.push_back(value[i]);
    *out = hidden;
    return Status::OK();
  }

  // A kOutputLayerList alias's output width (its value's last entry, once translate took it):
  // ConfigDocument::output_layer_width.
  void note_output_width(const KeyAlias& alias, const YAML::Node& value) {
    if (alias.kind != KeyAlias::Kind::kOutputLayerList) return;
    doc_.output_widths_[alias.name] = value[value.size() - 1].as<int>();
  }

  // The value `alias` gives its key (*target; nullptr when it sets none), or why it is refused.
  static Status translate(const KeyAlias& alias, const YAML::Node& value, const KeySpec** target,
                          YAML::Node* out) {
    *target = alias.key.empty() ? nullptr : find_key(alias.key);
    if (alias.kind == KeyAlias::Kind::kSame) {
      *out = value;
      return Status::OK();
    }
    if (alias.kind == KeyAlias::Kind::kOffset) {
      long long v = 0;
      if (!value.IsScalar() || !YAML::convert<long long>::decode(value, v)) {
        return Status::InvalidArgument(alias.name + ": expected an integer, got " +
                                       describe(value));
      }
      *out = YAML::Node(std::to_string(v + alias.offset));
      return Status::OK();
    }
    if (alias.kind == KeyAlias::Kind::kOutputLayerList) return hidden_layers(alias, value, out);
    bool flag = false;
    if (alias.kind == KeyAlias::Kind::kRefuseUnlessOff) {
      double amount = 0;
      const bool off =
          (detail::decode_bool(value, &flag) && !flag) ||
          (value.IsScalar() && YAML::convert<double>::decode(value, amount) && amount == 0);
      if (!off) {
        return Status::InvalidArgument(alias.name + " is " + describe(value) + ", but " +
                                       alias.reason);
      }
      return Status::OK();
    }
    if (!detail::decode_bool(value, &flag)) {
      return Status::InvalidArgument(alias.name + ": expected true or false, got " +
                                     describe(value));
    }
    *out = YAML::Node(flag ? alias.if_true : alias.if_false);
    return Status::OK();
  }

  ConfigDocument doc_;
  std::string base_dir_;  // the config file's folder ("" for a config parsed from text)
  struct SetBy {
    int line = 0;
    std::string from;  // the PaddleRec name that set the key; "" for the key itself
  };
  std::map<std::string, SetBy> lines_;  // where the file sets each key
  std::set<std::string> overridden_;    // keys an override replaces
  // The first unknown keys of the file, in file order; past kUnknownKeysListed only counted.
  static constexpr std::size_t kUnknownKeysListed = 20;
  std::vector<Status> unknown_;
  std::size_t unknown_unlisted_ = 0;
  struct Conditional {
    const KeyAlias* alias;
    YAML::Node value;  // translated for alias->key
    int line;          // in the file; 0 for an override
    std::string base_dir;
  };
  std::vector<Conditional> conditional_;  // aliases with only_when, in the order read
  Status first_error_;                    // the file's first error of another kind
};

StatusOr<ConfigDocument> ConfigDocument::parse(const std::string& yaml_text,
                                               const std::string& base_dir,
                                               const std::vector<std::string>& overrides,
                                               const std::string& source) {
  DocumentBuilder builder(source);
  StatusOr<YAML::Node> root = detail::read_one_document(yaml_text, source);
  if (!root.ok()) return root.status();
  builder.set_overridden(overrides);
  GPUBOX_RETURN_IF_ERROR(builder.apply_root(*root, base_dir));
  for (const std::string& o : overrides) GPUBOX_RETURN_IF_ERROR(builder.apply_override(o));
  GPUBOX_RETURN_IF_ERROR(builder.apply_conditional());
  GPUBOX_RETURN_IF_ERROR(builder.check_rules());
  return builder.take();
}

}  // namespace gpubox::config
