// ConfigDocument: a config_gpubox.yaml file plus `-o key=value` overrides, checked against THE
// key table (config_keys.hpp) and held as typed values. Every binary loads its config through
// it, so they all accept the same keys, apply the same defaults and report the same errors:
//   - a YAML syntax error, an empty config or a top level that is not a map of keys;
//   - unknown keys (all of a file's in one error, each with its line and the valid keys close to
//     it, when some are), a key set twice, a section that is not a map;
//   - a wrong type, a value out of range, a name not among an enum's choices;
//   - the cross-key rules (min_bound <= max_bound, slot_names matching sparse_inputs_slots).
// Errors are InvalidArgument "<file>:<line>: <key>: <what>" (NotFound for a missing file), or
// "<file>: -o: <key>: <what>" for an override. Keys that PaddleRec reads and GPUBox ignores
// (config::ignored_paddlerec_keys) are accepted with any value and reported by no_effect_note. Each
// part of GPUBox then fills its own struct with the typed getters, whose defaults come from the
// table:
//   trainer::trainer_config_from, dataset::dataset_config_from, table::sparse_config_from.
//
// Thread-safety: const after load; the getters record which keys were read (keys_read()), so
// one document is read by one thread at a time.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/config/config_keys.hpp"
#include "common/enum_names.hpp"
#include "common/error.hpp"
#include "common/status.hpp"

namespace gpubox::config {

class ConfigDocument {
 public:
  // Reads `path`, then applies `overrides` ("runner.epochs=3", "hyper_parameters.fc_sizes=[64,
  // 32]") in order. Relative paths in the file resolve against the file's folder, in overrides
  // against the working directory.
  static StatusOr<ConfigDocument> load(const std::string& path,
                                       const std::vector<std::string>& overrides = {});
  // The same from YAML text; relative paths in it resolve against `base_dir`; `source` names it
  // in errors.
  static StatusOr<ConfigDocument> parse(const std::string& yaml_text, const std::string& base_dir,
                                        const std::vector<std::string>& overrides = {},
                                        const std::string& source = "<config>");

  // A document that sets no key: every getter returns the table's default.
  static ConfigDocument defaults();

  // The file it was loaded from, or the `source` given to parse().
  const std::string& source() const { return source_; }
  // The absolute path of the file it was loaded from; "" when parsed from text.
  const std::string& file_path() const { return file_path_; }
  // True when the file or an override sets `key` (to any value, its default included).
  bool is_set(std::string_view key) const;
  // True when `key` is unset or set to the table's default (paths compared once resolved).
  bool is_default(std::string_view key) const;

  // Typed getters: the value set, else the table's default. Asking for a key that is not in
  // the table, or with the wrong type, is a programming error (throws).
  bool get_bool(std::string_view key) const;
  // kInt keys; T must hold the key's whole range.
  template <class T = int>
  T get_int(std::string_view key) const {
    const KeySpec& spec = spec_of(key, KeyType::kInt);
    GPUBOX_EXPECTS(static_cast<long double>(spec.int_min) >= std::numeric_limits<T>::lowest() &&
                       static_cast<long double>(spec.int_max) <= std::numeric_limits<T>::max(),
                   "config key ", key, " does not fit the type asked for");
    return static_cast<T>(std::get<int64_t>(value_of(spec)));
  }
  uint64_t get_uint64(std::string_view key) const;
  double get_float(std::string_view key) const;
  // kString, kPath and kWorkPath keys (paths resolved; "" when not set).
  const std::string& get_string(std::string_view key) const;
  // kIntList keys.
  std::vector<int> get_int_list(std::string_view key) const;
  // kStringList and kPathList keys.
  const std::vector<std::string>& get_string_list(std::string_view key) const;
  // kPath keys that also take a list (KeySpec::also_list): the paths given, in order; none when
  // the key is "". get_string on such a key holding a list is a programming error (throws).
  std::vector<std::string> get_paths(std::string_view key) const;
  // kIntMap keys.
  const IntMap& get_int_map(std::string_view key) const;
  // kEnum keys, through the enum's name table (config_enums.hpp).
  template <class E, std::size_t N>
  E get_enum(std::string_view key, const EnumName<E> (&names)[N]) const {
    const std::string& name = std::get<std::string>(value_of(spec_of(key, KeyType::kEnum)));
    StatusOr<E> value = parse_enum(names, name);
    GPUBOX_EXPECTS(value.ok(), "config key ", key, " read with another enum's name table");
    return value.value();
  }

  // The value of `key` (set, else the default) as a config would write it: "true", "512",
  // "0.05", "[512, 256]", "[a, b]", a resolved path. For describing a config (a save names the
  // keys of its model); unlike the getters it does not count as reading the key.
  std::string value_text(std::string_view key) const;

  // The output layer's width a PaddleRec layer list gave (the last entry of
  // hyper_parameters.top_layer_sizes, which sets fc_sizes without it: 2 for PaddleRec's two-class
  // softmax, or 1); nullopt when the config (file or -o) does not set `paddlerec_name`.
  std::optional<int> output_layer_width(std::string_view paddlerec_name) const;

  // Keys accepted for PaddleRec compatibility that have no effect in GPUBox: the table's
  // no-effect keys this config sets to another value than their default, then the ignored
  // PaddleRec keys it sets (to any value), in table order, then its table_parameters leaves that
  // have none (the others set hyper_parameters.sparse_optimizer.*), in file order, then the
  // PaddleRec names that apply only beside another key's true (low_rank with
  // use_low_rank_mixture) set without it.
  std::vector<std::string> no_effect_keys() const;
  // What the binaries say at start of an -o data folder (runner.train_data_dir, test_data_dir,
  // pass_dirs) given relative: read from the config's folder where the working directory has no
  // such path (PaddleRec joins it with the config's folder), or, where both have one, that the
  // working directory's is read (a warning: `first` true). Empty when there is nothing to say.
  const std::vector<std::pair<bool, std::string>>& override_path_notes() const {
    return override_path_notes_;
  }
  // The same with one line per key saying why ("" when there are none), for the binaries to
  // print once at start:
  //   <file>: 2 PaddleRec keys have no effect in GPUBox:
  //     runner.use_gpu: PaddleRec's device switch; cards come from FLAGS_selected_gpus
  //     runner.num_workers: PaddleRec DataLoader's worker processes; ...
  std::string no_effect_note() const;
  // A warning ("" when none) naming each of `overrides` (the command line's -o key=value) whose
  // key is one of no_effect_keys(): a key typed to change this run, which no_effect_note only
  // lists at INFO (-o runner.batch_size=64 trained at runner.train_batch_size, unsaid).
  std::string no_effect_overrides(const std::vector<std::string>& overrides) const;

  // Every key a getter was asked for since load (tests check each part reads exactly the keys
  // the table says it reads).
  const std::set<std::string>& keys_read() const { return keys_read_; }

 private:
  ConfigDocument() = default;
  const KeySpec& spec_of(std::string_view key, KeyType type) const;
  const KeySpec& spec_of(std::string_view key, KeyType type, KeyType or_type) const;
  const ConfigValue& value_of(const KeySpec& spec) const;

  friend class DocumentBuilder;
  std::string source_;
  std::string file_path_;
  std::map<std::string, ConfigValue, std::less<>> values_;  // keys set by the file or -o
  std::set<std::string> ignored_set_;  // ignored PaddleRec keys set by the file or -o
  // PaddleRec names with no effect in this config, and why: table_parameters leaves GPUBox has
  // no knob for (in file order), then aliases whose KeyAlias::only_when key is false.
  std::vector<std::pair<std::string, std::string>> paddlerec_notes_;
  std::vector<std::pair<bool, std::string>> override_path_notes_;
  mutable std::set<std::string> keys_read_;
  std::map<std::string, int, std::less<>> output_widths_;  // output_layer_width's
};

// Reads `text` as `key` says (type, range, choices), as an `-o key=value` override is read:
// the raw text for string, path and enum keys, else a YAML scalar or list; relative paths
// resolve against the working directory. Every binary's flags that take a number are checked
// by it too (common/cli_args.hpp), so a flag and a key share one reading and one range check.
// Errors are InvalidArgument "<key.name>: ...".
Status parse_value_text(const KeySpec& key, const std::string& text, ConfigValue* out);

}  // namespace gpubox::config
