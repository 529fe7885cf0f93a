// Plain data types of the dataset module: configuration, parse outcomes, load statistics.
// Host-only; no device headers (the trainer includes this from host code).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace gpubox::dataset {

// Input formats (config `runner.data_format`).
enum class DataFormat {
  kSlot,       // PaddleRec slot text: `click:1 dense_feature:0.5 ... 1:737395 ... 26:306163`
  kMultiSlot,  // Paddle MultiSlot: `1 <label>  <dense_dim> <v>...  (<n> <k1>..<kn>) per slot`
  kCriteo,     // raw Criteo TSV: label, 13 integers, 26 hex categoricals, tab separated
};

// How raw Criteo integer features become dense floats.
enum class CriteoDense {
  kMinMax,  // (x - min) / diff with PaddleRec's Criteo constants (what the shipped sample holds)
  kLog,     // log(1 + max(x, 0))
  kNone,    // x as is
};

const char* format_name(DataFormat format);
StatusOr<DataFormat> parse_format(const std::string& name);
const char* criteo_dense_name(CriteoDense transform);
StatusOr<CriteoDense> parse_criteo_dense(const std::string& name);

// Everything that decides how text becomes instances. Filled by the trainer from YAML
// (dataset/dataset_config_yaml.hpp reads the keys) or by hand in tests.
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

// Checks sizes and format constraints; the message names the offending field.
Status validate(const DatasetConfig& config);

// PaddleRec's convention for `sparse_inputs_slots: N`: N counts the label too, the sparse
// slots are named "1" .. "N-1".
std::vector<std::string> numbered_slots(int sparse_inputs_slots);

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

// Stable snake_case name used in stat output and JSON: "bad_key".
const char* reason_name(ParseReason reason);

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
