// Plain data types of the dataset module: configuration, parse outcomes, load statistics.
// Host-only; no device headers (the trainer includes this from host code).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/config/config_enums.hpp"
#include "common/enum_names.hpp"
#include "common/status.hpp"

namespace gpubox::dataset {

// Input formats (runner.data_format; names: config::kDataFormatNames). kAuto: recognised per
// input from its first lines (dataset/format_detect.hpp).
using DataFormat = config::DataFormat;
using config::kDataFormatNames;
// How raw Criteo integer features become dense floats (runner.criteo_dense; names:
// config::kCriteoDenseNames).
using CriteoDense = config::CriteoDense;
using config::kCriteoDenseNames;

// Everything that decides how text becomes instances. Filled from a config by
// dataset_config_from (dataset/dataset_config.hpp; the keys it reads are the key table's
// config::kDataset ones), or by hand in tests and tools. The defaults below serve configs built
// by hand (no slots, no dense values); a config file's defaults are the key table's.
struct DatasetConfig {
  DataFormat data_format = DataFormat::kAuto;
  // Sparse slot names in batch order. Slot text and MultiSlot name slots by these strings;
  // Criteo and feat_idx text only use their count (Criteo needs 26).
  std::vector<std::string> slots;
  int dense_dim = 0;                         // dense floats per instance (Criteo needs 13)
  std::string label_name = "click";          // slot and MultiSlot: the label's name
  std::string dense_name = "dense_feature";  // slot and MultiSlot: the dense values' name
  // Slot format: tokens written `value:name` (feasign first) instead of `name:value`; applies
  // to every token of the line (label, dense and sparse).
  bool feasign_first = false;
  // feasign_first was set by the config (runner.slot_token_order): the auto format tries that
  // order alone, else both.
  bool token_order_set = false;
  // Slot format: a token naming a slot not in `slots` is skipped and counted (PaddleRec's
  // readers skip it too) instead of making the line malformed.
  bool ignore_unknown_slots = true;
  // MultiSlot: the fields of a line by name (label_name, slot names, dense_name; another name
  // is a field read and skipped, like slot_dnn's show field "0"). Empty: label, the slots in
  // `slots` order, then dense when dense_dim > 0, the order PaddleRec's readers write.
  std::vector<std::string> multislot_order;
  // Where multislot_order came from, for errors: the key, or the PaddleRec reader whose field
  // order GPUBox took (a config that never set the key is not told to fix it).
  std::string multislot_order_from = "runner.multislot_order";
  // When not empty each file is read through
  // `sh -c "(<pipe_command> <pipe_arguments>...) < file"` in the working directory (see
  // pipe_command_line). pipe_arguments are PaddleRec's `<config> <utils>` when they apply
  // (dataset_config.hpp), pipe_arguments_note says where they came from, for messages.
  std::string pipe_command;
  std::vector<std::string> pipe_arguments;
  std::string pipe_arguments_note;
  int thread_num = 1;         // reader threads; files are shared among them
  int batch_size = 1;         // instances per batch per card
  bool strict_parse = false;  // the first malformed line fails the load
  // runner.max_malformed_share: more of a load's lines malformed stop the job (report_read).
  double max_malformed_share = 0.5;
  // With strict_parse, a blank line fails it too (a row per line: gpubox_train's
  // --predictions_out, where a line skipped would move every row after it).
  bool blank_lines_fail = false;
  // What the error of a strict load names as the reason (a caller that sets strict_parse for its
  // own purpose says it).
  std::string strict_parse_reason = "strict_parse";
  std::size_t max_line_bytes = std::size_t{1} << 20;  // longer lines are malformed
  std::size_t max_reported_errors = 10;               // malformed lines kept as `file:line: reason`
  // Regular files (not piped) larger than this are read as several byte ranges in parallel.
  std::uint64_t split_bytes = std::uint64_t{32} << 20;
  CriteoDense criteo_dense = CriteoDense::kMinMax;
  // Slot text and MultiSlot: what each dense value goes through (a PaddleRec reader's transform,
  // dataset/paddlerec_readers.hpp), computed in double from the text; kAuto reads as kNone.
  config::DenseTransform dense_transform = config::DenseTransform::kNone;
  // What GPUBox does in place of the PaddleRec reader a config names, for the start log
  // (paddlerec_readers.hpp: ReaderProfile::notes).
  std::vector<std::string> reader_notes;
};

// Checks sizes and format constraints; the message names the offending config key.
// O(n log n) in the number of slots.
Status validate(const DatasetConfig& config);

// PaddleRec's convention for `sparse_inputs_slots: N`: N counts the label too, the N-1 sparse
// slots are numbered from 1, skipping `label_name` when it is a number (slot_dnn's label is
// slot "1": its sparse slots are "2" .. "N").
std::vector<std::string> numbered_slots(int sparse_inputs_slots,
                                        const std::string& label_name = "click");

// The shell command that reads a file: pipe_command followed by its pipe_arguments, each
// quoted for sh. "" when there is no pipe_command.
std::string pipe_command_line(const DatasetConfig& config);

// The slot a sparse row carries (its `slot` field) for sparse slot `position` of `slots`: the
// slot's name when it is a whole number (PaddleRec's "1" .. "26"), else its position.
std::int32_t slot_id(const std::vector<std::string>& slots, std::size_t position);

// A pass's distinct keys and, next to each, its slot id (InMemoryDataset::unique_keys_and_slots).
struct UniqueKeys {
  std::vector<std::uint64_t> keys;
  std::vector<std::int32_t> slots;
};

// Why a line was not accepted. Order is the reporting order.
enum class ParseReason : std::uint8_t {
  kOk = 0,
  kBadToken,           // slot format: a token that is not `name:value`
  kUnknownSlot,        // slot name not in the config (unless ignore_unknown_slots)
  kBadLabel,           // missing, repeated, or not 0/1
  kBadKey,             // feasign not a uint64
  kBadDense,           // dense value not a finite number
  kTooManyDense,       // more dense values than dense_dim
  kTooFewDense,        // fewer dense values than dense_dim
  kFieldCount,         // MultiSlot / Criteo: wrong number of fields, or a bad count
  kLineTooLong,        // over max_line_bytes
  kTruncatedLastLine,  // the file ends without a newline: its last line may be cut
  kNumReasons
};
inline constexpr std::size_t kNumParseReasons = static_cast<std::size_t>(ParseReason::kNumReasons);

// Stable snake_case names used in stat output and JSON: "bad_key".
inline constexpr EnumName<ParseReason> kParseReasonNames[] = {
    {ParseReason::kOk, "ok"},
    {ParseReason::kBadToken, "bad_token"},
    {ParseReason::kUnknownSlot, "unknown_slot"},
    {ParseReason::kBadLabel, "bad_label"},
    {ParseReason::kBadKey, "bad_key"},
    {ParseReason::kBadDense, "bad_dense"},
    {ParseReason::kTooManyDense, "too_many_dense"},
    {ParseReason::kTooFewDense, "too_few_dense"},
    {ParseReason::kFieldCount, "field_count"},
    {ParseReason::kLineTooLong, "line_too_long"},
    {ParseReason::kTruncatedLastLine, "truncated_last_line"},
};
static_assert(std::size(kParseReasonNames) == kNumParseReasons, "a ParseReason has no name");

// One rejected line, reported as `file:line: reason: detail`.
struct ParseErrorRecord {
  std::string file;
  std::uint64_t line = 0;                 // 1-based
  ParseReason reason = ParseReason::kOk;  // kOk: a blank line (DatasetConfig::blank_lines_fail)
  std::string detail;                     // the offending token or a short explanation
  std::string to_string() const;
};

inline constexpr std::size_t kMaxUnknownSlotNames = 8;

// How one input's format was decided: detected (runner.data_format: auto) from its first
// lines, or configured; and, when the configured format rejected every sampled line, what
// those lines look like instead (the hint of the load's warning).
struct FormatNote {
  std::string file;
  std::string format;             // the format read, described: "slot text (slot:feasign)"
  bool detected = false;          // chosen by runner.data_format: auto
  std::size_t sample_lines = 0;   // non-blank first lines looked at
  std::size_t sample_parsed = 0;  // of them, lines the chosen format accepts
  std::string hint;               // "these look like raw Criteo TSV: set runner.data_format: ..."
  // Detected: another format that accepted as many of the first lines (the first tried was
  // taken), described with its setting ("" when none did).
  std::string tie;
};

// What one load read and what it skipped. Merged over files in file-list order.
struct LoadStats {
  std::size_t files = 0;
  std::uint64_t lines = 0;        // every line read, blank ones included
  std::uint64_t blank_lines = 0;  // empty or whitespace-only: fine, not instances
  std::uint64_t instances = 0;
  std::uint64_t positives = 0;
  std::uint64_t bytes = 0;  // bytes of text parsed (after pipe_command)
  // Of those, the malformed lines' (a file whose lines end in CR alone, or of one over-long
  // line, is one malformed line of many bytes).
  std::uint64_t skipped_bytes = 0;
  // Feasign 0 in a sparse slot is Paddle's padding ("no feature"; PaddleRec's readers write it
  // for an empty slot, Paddle's DataFeed skips it): the key is dropped, the instance kept.
  std::uint64_t zero_keys_dropped = 0;
  // Slot format: tokens of slots the model does not use, skipped (ignore_unknown_slots), and the
  // first few distinct slot names among them.
  std::uint64_t unknown_slot_tokens = 0;
  std::vector<std::string> unknown_slot_names;  // at most kMaxUnknownSlotNames
  // The config's sparse slots (DatasetConfig::slots, in order) and the keys each held over the
  // instances parsed from text (`slot_counted_instances` of them: not those from the pass data
  // cache, counted when first read): a slot of the config that no line fills, or no key in any
  // slot, is a config that does not match the data (load_report.cpp).
  std::vector<std::string> slot_names;
  std::vector<std::uint64_t> slot_keys;
  std::uint64_t slot_counted_instances = 0;
  std::vector<FormatNote> formats;  // one per file, in file order
  std::array<std::uint64_t, kNumParseReasons> skipped_by_reason{};
  std::vector<ParseErrorRecord> errors;  // the first max_reported_errors, in file order
  double seconds = 0.0;
  // Of the above, what came from the pass data cache (pass_data_cache.hpp) instead of the files,
  // and, once per run, why a load was not kept there ("" when it was, or said before).
  std::size_t cached_files = 0;
  std::uint64_t cached_instances = 0;
  std::string cache_note;
  // The load's unique keys came from the cache with it: its data set holds just this load, and
  // InMemoryDataset::unique_keys_and_slots gives them (until the instances are stored in another
  // order). A load's, not added by merge.
  bool cached_unique_keys = false;

  std::uint64_t skipped_lines() const;
  // Adds `other` (a later file) into this; keeps at most `max_errors` error records.
  void merge(const LoadStats& other, std::size_t max_errors);
};

}  // namespace gpubox::dataset
