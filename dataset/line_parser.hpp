// Parses one text line of any input format into an InstanceBlock. No allocation per line once
// the scratch buffers have grown.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dataset/dataset_types.hpp"
#include "dataset/instance_block.hpp"

namespace gpubox::dataset {

// Outcome of one line. `token` points into the parsed line (valid as long as the line is).
struct ParseResult {
  ParseReason reason = ParseReason::kOk;
  bool blank = false;           // empty / whitespace-only line: neither instance nor error
  std::string_view token;       // the offending token, when there is one
  const char* note = nullptr;   // or a short explanation ("missing label")
  std::uint32_t zero_keys = 0;  // feasigns equal to 0 that were dropped ("no feature")
  // Slot format: tokens of slots not in the config, skipped (ignore_unknown_slots), and the
  // distinct slot names among them, the first kMaxUnknownSlotNames of the line.
  std::uint32_t unknown_tokens = 0;
  std::uint32_t unknown_name_count = 0;
  std::array<std::string_view, kMaxUnknownSlotNames> unknown_names;
  bool ok() const { return reason == ParseReason::kOk; }
};

// `text` for a terminal or a log: control bytes (C0, DEL, C1 as UTF-8) and bytes that are not
// well-formed UTF-8 written \xNN; other UTF-8 as it is. A data file's bytes (a compressed
// file's escape sequences) in a message would otherwise act on the terminal showing it.
std::string printable(std::string_view text);

// "bad_key: '12a'" style detail for a rejected line (token cut to 64 bytes, then printable).
std::string describe(const ParseResult& result);

// Slot name -> slot index of a config's slots: a direct table for plain numbers ("17"), a hash
// map for the other names. Built once per load and shared by the parsers of every reader thread
// and candidate format (immutable, so thread-safe).
class SlotIndex {
 public:
  explicit SlotIndex(const std::vector<std::string>& slots);
  // The slot named `name`, -1 when there is none.
  int find(std::string_view name) const;

 private:
  std::vector<int> numeric_;                    // by numeric name up to kMaxDirect, -1 if none
  std::unordered_map<std::string, int> named_;  // the other names (larger numbers included)
};

// MultiSlot: what each field of a line is, in line order (config.multislot_order, or the
// default label, slots, dense): a slot index, or one of these.
inline constexpr int kMultiSlotLabel = -1;
inline constexpr int kMultiSlotDense = -2;
inline constexpr int kMultiSlotSkipped = -3;  // a named field the config does not use
std::vector<int> multislot_fields(const DatasetConfig& config, const SlotIndex& slots);

// Not thread-safe (scratch buffers): one parser per reader thread.
class LineParser {
 public:
  // `config` must pass validate() and name a format (not kAuto: see format_detect.hpp); it is
  // copied.
  explicit LineParser(const DatasetConfig& config);
  // The same with the slot index of config.slots built by the caller, who also checked that
  // the config passes validate() (not checked again: many parsers share one config's names).
  LineParser(const DatasetConfig& config, std::shared_ptr<const SlotIndex> slots);
  const DatasetConfig& config() const { return config_; }

  // Parses `line` (no '\n'; a trailing '\r' is tolerated). On success appends one instance to
  // `out` (unless the line is blank); on failure leaves `out` untouched.
  ParseResult parse(std::string_view line, InstanceBlock* out);

  // Criteo categorical -> key: xxHash64 of the bytes seeded with the slot index, so one value
  // in two slots gives two keys; 0 (reserved for "no feature") maps to 1.
  static std::uint64_t criteo_key(std::string_view value, int slot);
  // Criteo integer feature `index` (0..12) -> dense float under `transform`.
  static float criteo_dense(std::int64_t value, int index, CriteoDense transform);

 private:
  ParseResult parse_slot(std::string_view line, InstanceBlock* out);
  ParseResult parse_multislot(std::string_view line, InstanceBlock* out);
  ParseResult parse_criteo(std::string_view line, InstanceBlock* out);
  ParseResult parse_feat_idx(std::string_view line, InstanceBlock* out);
  ParseResult parse_idx_value(std::string_view line, InstanceBlock* out);
  ParseResult parse_avazu(std::string_view line, InstanceBlock* out);
  // feat_idx and idx_value text: dense values, keys and slot sizes from feat_idx_/feat_value_,
  // then commit.
  void commit_fields(float label, ParseResult* result, InstanceBlock* out);
  // Fills keys_ and slot_sizes_ from pending_, grouping keys by slot in met order (`in_order`:
  // pending_ is already sorted by slot).
  void group_pending(bool in_order);
  void commit(float label, InstanceBlock* out);

  DatasetConfig config_;
  int num_slots_;
  std::shared_ptr<const SlotIndex> slots_;
  std::vector<int> multislot_fields_;  // MultiSlot: multislot_fields(config_)
  // Scratch of the line being parsed.
  std::vector<float> dense_;
  std::vector<std::pair<std::uint32_t, std::uint64_t>> pending_;  // (slot, key) as met
  std::vector<std::uint64_t> keys_;                               // grouped by slot
  std::vector<std::uint32_t> slot_sizes_;
  std::vector<std::uint32_t> cursor_;
  std::vector<std::uint64_t> feat_idx_;  // feat_idx, idx_value: the line's indices, values
  std::vector<float> feat_value_;
};

}  // namespace gpubox::dataset
