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

// Input formats (runner.data_format; names: config::kDataFormatNames).
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
  DataFormat data_format = DataFormat::kSlot;
  // Sparse slot names in batch order. Slot text names slots by these strings; MultiSlot and
  // Criteo only use their count (Criteo needs 26).
  std::vector<std::string> slots;
  int dense_dim = 0;                         // dense floats per instance (Criteo needs 13)
  std::string label_name = "click";          // slot format: the label token's name
  std::string dense_name = "dense_feature";  // slot format: the dense tokens' name
  // Slot format: tokens written `value:name` (feasign first) instead of `name:value`; applies
  // to every token of the line (label, dense and sparse).
  bool feasign_first = false;
  // Slot format: a token naming a slot not in `slots` is skipped instead of making the line
  // malformed (data with more slots than the model uses).
  bool ignore_unknown_slots = false;
  // When not empty each file is read through `sh -c "(<pipe_command>) < file"`.
  std::string pipe_command;
  int thread_num = 1;                                 // reader threads; files are shared among them
  int batch_size = 1;                                 // instances per batch per card
  bool strict_parse = false;                          // the first malformed line fails the load
  std::size_t max_line_bytes = std::size_t{1} << 20;  // longer lines are malformed
  std::size_t max_reported_errors = 10;               // malformed lines kept as `file:line: reason`
  // Regular files (not piped) larger than this are read as several byte ranges in parallel.
  std::uint64_t split_bytes = std::uint64_t{32} << 20;
  CriteoDense criteo_dense = CriteoDense::kMinMax;
};

// Checks sizes and format constraints; the message names the offending config key.
// O(n log n) in the number of slots.
Status validate(const DatasetConfig& config);

// PaddleRec's convention for `sparse_inputs_slots: N`: N counts the label too, the sparse
// slots are named "1" .. "N-1".
std::vector<std::string> numbered_slots(int sparse_inputs_slots);

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
  std::uint64_t line = 0;  // 1-based
  ParseReason reason = ParseReason::kOk;
  std::string detail;  // the offending token or a short explanation
  std::string to_string() const;
};

// What one load read and what it skipped. Merged over files in file-list order.
struct LoadStats {
  std::size_t files = 0;
  std::uint64_t lines = 0;        // every line read, blank ones included
  std::uint64_t blank_lines = 0;  // empty or whitespace-only: fine, not instances
  std::uint64_t instances = 0;
  std::uint64_t positives = 0;
  std::uint64_t bytes = 0;              // bytes of text parsed (after pipe_command)
  std::uint64_t zero_keys_dropped = 0;  // feasign 0 means "no feature"; dropped at parse time
  std::array<std::uint64_t, kNumParseReasons> skipped_by_reason{};
  std::vector<ParseErrorRecord> errors;  // the first max_reported_errors, in file order
  double seconds = 0.0;

  std::uint64_t skipped_lines() const;
  // Adds `other` (a later file) into this; keeps at most `max_errors` error records.
  void merge(const LoadStats& other, std::size_t max_errors);
};

}  // namespace gpubox::dataset
