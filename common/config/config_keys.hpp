// THE table of config keys (PaddleRec's config_gpubox.yaml keys plus GPUBox's own): name, type,
// default, range or choices, which part of GPUBox reads it, and what it means. Every binary
// (gpubox_train, gpubox_data, gpubox_server) validates a whole config against this one table
// (config_document.hpp), so they accept the same keys with the same defaults and errors; each
// part then reads its own keys. The shipped configs' comments and the key list of
// docs/config-reference.md are rendered from it (render_* below; tests/common/config_docs_test.cpp
// checks they agree).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace gpubox::config {

enum class KeyType {
  kBool,
  kInt,         // int64 in [int_min, int_max]; 1e3-style integral numbers are accepted
  kUInt64,      // seeds: any 64-bit unsigned integer
  kFloat,       // finite, in [float_min, float_max]
  kString,      // any scalar, taken as text (-o takes the raw text)
  kPath,        // a string; relative paths resolve against the config file's folder (in -o
                // overrides: against the working directory); "" means not set
  kWorkPath,    // a string; relative paths stay relative to the working directory, as PaddleRec
                // takes its model paths (model_save_path, infer_load_path, model_init_path)
  kEnum,        // one of `choices` (case-insensitive; stored under the table's spelling)
  kIntList,     // a YAML list of integers in [int_min, int_max], at least min_items of them
  kStringList,  // a YAML list of strings
  kPathList,    // a YAML list of paths (resolved like kPath)
  kIntMap,  // a YAML map of names to integers in [int_min, int_max] (hyper_parameters.slot_dims)
};

// The part of GPUBox that reads a key (a bit set; a key may have several readers).
enum Part : unsigned {
  kTrainer = 1u << 0,  // gpubox_train's own settings (trainer_config_from)
  kDataset = 1u << 1,  // how files become instances (dataset_config_from: gpubox_train and
                       // gpubox_data)
  kTable = 1u << 2,    // the sparse row and its optimizer on every tier, and the host tier
                       // (table/sparse_config.hpp: sparse_config_from, host_tier_config_from:
                       // gpubox_train's card and host tiers, gpubox_server)
};

// A typed value: bool, int64 (kInt), uint64 (kUInt64), double (kFloat), string (kString,
// kPath, kWorkPath, kEnum), list of int64 (kIntList), list of strings (kStringList, kPathList),
// map of names to int64 (kIntMap, ordered by name).
using IntMap = std::map<std::string, int64_t>;
using ConfigValue = std::variant<bool, int64_t, uint64_t, double, std::string, std::vector<int64_t>,
                                 std::vector<std::string>, IntMap>;

struct KeySpec {
  std::string name;  // dotted: "runner.thread_num"
  KeyType type = KeyType::kString;
  std::string default_text;  // the default as written in YAML ("512", "\"\"", "[512, 256]")
  unsigned parts = 0;        // Part bits; 0: accepted for PaddleRec compatibility, no effect
  std::string meaning;       // one line: the shipped configs' comment and the reference's text
  int64_t int_min = 0, int_max = 0;  // kInt, kIntList items
  double float_min = 0, float_max = 0;
  std::size_t min_items = 0;         // lists
  std::vector<std::string> choices;  // kEnum, from the enum's name table (config_enums.hpp)
  ConfigValue default_value;         // default_text parsed (paths unresolved)
  // kPath: a YAML list of paths is accepted too (held as a list; ConfigDocument::get_paths),
  // for folders PaddleRec's configs write either way (dnn's online.yaml: train_data_dir: [...]).
  bool also_list = false;

  bool has_effect() const { return parts != 0; }
};

// Every key, in the documented order (runner, dense optimizer, model, sparse optimizer).
const std::vector<KeySpec>& config_keys();
// The key named `name`, or nullptr.
const KeySpec* find_key(std::string_view name);

// A key that PaddleRec's trainers (tools/*trainer*.py and their helpers) or its model configs
// read and GPUBox has no use for: accepted with any value, so that a PaddleRec config loads
// unchanged, and listed at start with `reason` when a config sets it. A `section` entry covers
// every key under that name (PaddleRec's `table_parameters:`).
struct IgnoredKey {
  std::string name;
  std::string reason;  // one line: what it is in PaddleRec, what GPUBox does instead
  bool section = false;
};
// In the order docs/config-reference.md lists them.
const std::vector<IgnoredKey>& ignored_paddlerec_keys();
// The entry covering `name` (the key itself, or an ignored section holding it), or nullptr.
const IgnoredKey* find_ignored(std::string_view name);

// A PaddleRec spelling of a GPUBox key (PaddleRec's models/rank configs name some settings their
// own way): a config may set `name` instead of `key`; setting both is an error unless they agree.
// The value is taken as the key's (kSame), an integer plus `offset` (kOffset), a bool chooses one
// of the key's values (kBoolChoice: true -> if_true, false -> if_false), or a switch or amount
// whose effect GPUBox does not build is refused with `reason` unless it is off (kRefuseUnlessOff,
// `key` empty: false or 0 changes nothing). Bools may be written 1/0, as PaddleRec's configs do.
// The table, with PaddleRec's ignored keys and its table_parameters: paddlerec_keys.cpp.
struct KeyAlias {
  // kOutputLayerList: a list of layer sizes whose last entry is PaddleRec's output layer (2, a
  // two-class softmax, or 1, one logit): the key takes the others, the document keeps the last
  // (ConfigDocument::output_layer_width).
  enum class Kind { kSame, kOffset, kBoolChoice, kRefuseUnlessOff, kOutputLayerList };
  std::string name;
  std::string key;
  Kind kind = Kind::kSame;
  std::string if_true, if_false;  // kBoolChoice
  std::string reason;             // one line: what it is in PaddleRec (and why refused)
  int64_t offset = 0;             // kOffset
  // A bool key that must be true, once the whole file and its overrides are read, for the alias
  // to set its key; else the alias has no effect and is listed with the keys that have none
  // ("" = always applies). PaddleRec dcn_v2 reads low_rank only for DCN-Mix, while GPUBox's
  // cross_rank makes plain cross layers low-rank too.
  std::string only_when;
};
const std::vector<KeyAlias>& key_aliases();
// The alias named `name`, or nullptr.
const KeyAlias* find_alias(std::string_view name);

// The suggestions of an "unknown key" error, best first (at most 3, possibly none): valid keys
// or sections whose edit distance to `name` is small for its length (at most a third of the
// last name part, at least 1), and keys of other sections with the same last part
// ("runner.learning_rate" -> "hyper_parameters.optimizer.learning_rate"); PaddleRec's spellings
// and its ignored keys are candidates too ("hyper_parameters.low_rnk" -> "...low_rank").
std::vector<std::string> key_suggestions(std::string_view name);
// The first of key_suggestions(name), or "" when nothing is close.
std::string closest_key(std::string_view name);
// True when `name` is a section: a proper prefix of some key ending before a '.'.
bool is_section(std::string_view name);
// Levenshtein distance.
std::size_t edit_distance(std::string_view a, std::string_view b);
// The same when it is at most `bound`, else bound + 1, found in time that grows with the bound
// rather than with the lengths (a fuzzer's 60 KB of unknown keys took minutes to answer).
std::size_t edit_distance_within(std::string_view a, std::string_view b, std::size_t bound);

// A number as a config value's messages write it (ostream's default form: 0.5, 10, 1e-06).
std::string number_text(double v);
// "integer in [1, 1024]", "one of slot|multislot|criteo", "list of paths" ...
std::string type_text(const KeySpec& key);
// "trainer, dataset", or "no effect (PaddleRec compatibility)".
std::string parts_text(const KeySpec& key);
// The comment of the key's line in a YAML config: its meaning, plus the choices of an enum.
std::string yaml_comment(const KeySpec& key);
// docs/config-reference.md's key list: a Markdown table (key, type, default, read by, meaning),
// then the PaddleRec keys accepted and ignored (key, reason).
std::string render_markdown_key_table();
// A complete config with every key at its default, commented (gpubox_train
// --print_config_template): the start of a new config.
std::string render_yaml_template();

}  // namespace gpubox::config
