#include "dataset/line_parser.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.hpp"
#include "dataset/paddlerec_readers.hpp"
#include "dataset/text_number.hpp"

namespace gpubox::dataset {
namespace {

// Names up to this value use the direct numeric lookup table.
constexpr std::uint64_t kMaxNumericSlotName = 1 << 16;

// PaddleRec's Criteo preprocessing constants (models/rank/dnn): (x - min) / diff.
constexpr float kCriteoMin[13] = {0, -3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
constexpr float kCriteoDiff[13] = {20, 603, 100, 50, 64000, 500, 100, 50, 500, 10, 10, 10, 50};

constexpr int kCriteoFields = 1 + 13 + 26;

inline bool is_blank_char(char c) { return c == ' ' || c == '\t'; }

// Splits on runs of blanks: returns the next token and advances *pos; empty at the end.
inline std::string_view next_token(std::string_view line, std::size_t* pos) {
  std::size_t i = *pos;
  const std::size_t n = line.size();
  const char* p = line.data();
  while (i < n && is_blank_char(p[i])) ++i;
  std::size_t j = i;
  while (j < n && !is_blank_char(p[j])) ++j;
  *pos = j;
  return line.substr(i, j - i);
}

inline bool parse_label(std::string_view text, float* label) {
  if (text.size() != 1 || (text[0] != '0' && text[0] != '1')) return false;
  *label = text[0] == '1' ? 1.0f : 0.0f;
  return true;
}

// Only whitespace (blank or trailing CR) is left.
inline bool is_blank_line(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

// A slot text or MultiSlot dense value through `transform` (a PaddleRec reader's, computed in
// double from the text and rounded once, as the reader does); false when it is not a finite
// number before or after.
inline bool parse_dense(std::string_view text, config::DenseTransform transform, float* out) {
  if (transform == config::DenseTransform::kNone || transform == config::DenseTransform::kAuto) {
    return parse_float(text, out);
  }
  double x = 0.0;
  return parse_double(text, &x) && transformed_dense(x, transform, out);
}

// A plain decimal name without leading zeros ("0", "17"), as the numeric lookup expects.
inline bool numeric_name(std::string_view name, std::uint64_t* value) {
  if (name.empty() || name.size() > 6) return false;
  if (name.size() > 1 && name[0] == '0') return false;
  std::uint64_t v = 0;
  for (char c : name) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  *value = v;
  return true;
}

const DatasetConfig& validated(const DatasetConfig& config) {
  throw_if_error(validate(config));
  return config;
}

ParseResult fail(ParseReason reason, std::string_view token = {}) {
  ParseResult r;
  r.reason = reason;
  r.token = token;
  return r;
}

ParseResult fail_note(ParseReason reason, const char* note) {
  ParseResult r;
  r.reason = reason;
  r.note = note;
  return r;
}

}  // namespace

namespace {

// The length of the well-formed UTF-8 sequence at `s` (RFC 3629: no overlong form, no
// surrogate, nothing past U+10FFFF), 0 when there is none.
std::size_t utf8_sequence(std::string_view s) {
  const auto at = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = at(0);
  std::size_t n = 0;
  unsigned char low = 0x80, high = 0xbf;  // the second byte's range
  if (lead >= 0xc2 && lead <= 0xdf) {
    n = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    n = 3;
    if (lead == 0xe0) low = 0xa0;
    if (lead == 0xed) high = 0x9f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    n = 4;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;
  }
  if (n == 0 || s.size() < n || at(1) < low || at(1) > high) return 0;
  for (std::size_t i = 2; i < n; ++i) {
    if (at(i) < 0x80 || at(i) > 0xbf) return 0;
  }
  return n;
}

}  // namespace

std::string printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    const std::size_t n = byte < 0x80 ? 1 : utf8_sequence(text.substr(i));
    // C0 controls, DEL, C1 controls (U+0080..U+009F, which some terminals obey as ESC [ and
    // the like) and bytes that are not UTF-8 (a lone 0x9b is CSI to a Latin-1 terminal).
    const bool control = byte < 0x20 || byte == 0x7f || n == 0 ||
                         (byte == 0xc2 && static_cast<unsigned char>(text[i + 1]) < 0xa0);
    if (control) {
      out += {'\\', 'x', kHex[byte >> 4], kHex[byte & 0xf]};
      ++i;
    } else {
      out.append(text, i, n);
      i += n;
    }
  }
  return out;
}

std::string describe(const ParseResult& result) {
  if (result.token.empty()) return result.note == nullptr ? "" : result.note;
  std::string out = "'" + printable(result.token.substr(0, 64)) + "'";
  if (result.token.size() > 64) out += "...";
  return out;
}

SlotIndex::SlotIndex(const std::vector<std::string>& slots) {
  for (std::size_t s = 0; s < slots.size(); ++s) {
    std::uint64_t value = 0;
    if (numeric_name(slots[s], &value) && value < kMaxNumericSlotName) {
      if (numeric_.size() <= value) numeric_.resize(value + 1, -1);
      numeric_[value] = static_cast<int>(s);
    } else {
      named_.emplace(slots[s], static_cast<int>(s));
    }
  }
}

int SlotIndex::find(std::string_view name) const {
  std::uint64_t value = 0;
  if (numeric_name(name, &value) && value < kMaxNumericSlotName) {
    return value < numeric_.size() ? numeric_[value] : -1;
  }
  if (named_.empty()) return -1;
  auto it = named_.find(std::string(name));
  return it == named_.end() ? -1 : it->second;
}

LineParser::LineParser(const DatasetConfig& config)
    : LineParser(validated(config), std::make_shared<const SlotIndex>(config.slots)) {}

LineParser::LineParser(const DatasetConfig& config, std::shared_ptr<const SlotIndex> slots)
    : config_(config), num_slots_(static_cast<int>(config.slots.size())), slots_(std::move(slots)) {
  GPUBOX_EXPECTS(slots_ != nullptr, "LineParser needs its slot index");
  dense_.reserve(config_.dense_dim);
  slot_sizes_.resize(num_slots_);
  GPUBOX_EXPECTS(config_.data_format != DataFormat::kAuto,
                 "LineParser needs a format: detect it first (format_detect.hpp)");
  if (config_.data_format == DataFormat::kMultiSlot) {
    multislot_fields_ = multislot_fields(config_, *slots_);
  }
}

std::vector<int> multislot_fields(const DatasetConfig& config, const SlotIndex& slots) {
  const int num_slots = static_cast<int>(config.slots.size());
  std::vector<int> fields;
  if (config.multislot_order.empty()) {
    fields.push_back(kMultiSlotLabel);
    for (int s = 0; s < num_slots; ++s) fields.push_back(s);
    if (config.dense_dim > 0) fields.push_back(kMultiSlotDense);
    return fields;
  }
  for (const std::string& name : config.multislot_order) {
    if (name == config.label_name) {
      fields.push_back(kMultiSlotLabel);
    } else if (name == config.dense_name) {
      fields.push_back(kMultiSlotDense);
    } else {
      const int slot = slots.find(name);
      fields.push_back(slot >= 0 ? slot : kMultiSlotSkipped);
    }
  }
  return fields;
}

ParseResult LineParser::parse(std::string_view line, InstanceBlock* out) {
  GPUBOX_EXPECTS(out->num_slots == num_slots_ && out->dense_dim == config_.dense_dim,
                 "InstanceBlock shape (", out->num_slots, " slots, dense ", out->dense_dim,
                 ") does not match the config");
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (is_blank_line(line)) {
    ParseResult r;
    r.blank = true;
    return r;
  }
  switch (config_.data_format) {
    case DataFormat::kSlot:
      return parse_slot(line, out);
    case DataFormat::kMultiSlot:
      return parse_multislot(line, out);
    case DataFormat::kCriteo:
      return parse_criteo(line, out);
    case DataFormat::kFeatIdx:
      return parse_feat_idx(line, out);
    case DataFormat::kIdxValue:
      return parse_idx_value(line, out);
    case DataFormat::kAvazu:
      return parse_avazu(line, out);
    case DataFormat::kAuto:
      break;
  }
  GPUBOX_FAIL("unknown data format");
}

void LineParser::commit(float label, InstanceBlock* out) {
  out->append(label, dense_.data(), keys_.data(), keys_.size(), slot_sizes_.data());
}

namespace {

// Adds `name` to the line's distinct unknown slot names unless it is there or the list is full.
// Tokens of one slot are usually adjacent, so the last name is compared first.
void note_unknown_name(std::string_view name, ParseResult* result) {
  const std::uint32_t n = result->unknown_name_count;
  if (n == kMaxUnknownSlotNames || (n > 0 && result->unknown_names[n - 1] == name)) return;
  for (std::uint32_t k = 0; k + 1 < n; ++k) {
    if (result->unknown_names[k] == name) return;
  }
  result->unknown_names[n] = name;
  result->unknown_name_count = n + 1;
}

}  // namespace

ParseResult LineParser::parse_slot(std::string_view line, InstanceBlock* out) {
  pending_.clear();
  dense_.clear();
  bool has_label = false;
  float label = 0.0f;
  bool in_order = true;
  std::uint32_t last_slot = 0;
  ParseResult result;
  const std::string_view label_name = config_.label_name;
  const std::string_view dense_name = config_.dense_name;
  const std::size_t dense_dim = static_cast<std::size_t>(config_.dense_dim);
  const char* p = line.data();
  const std::size_t n = line.size();
  std::size_t i = 0;
  for (;;) {
    // One pass per token finds its end and its ':' (a memchr call per short token costs more).
    while (i < n && is_blank_char(p[i])) ++i;
    if (i == n) break;
    const std::size_t start = i;
    std::size_t colon = std::string_view::npos;
    bool extra_colon = false;
    for (; i < n && !is_blank_char(p[i]); ++i) {
      if (p[i] == ':') {
        extra_colon = extra_colon || colon != std::string_view::npos;
        if (colon == std::string_view::npos) colon = i - start;
      }
    }
    const std::string_view token(p + start, i - start);
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == token.size() || extra_colon) {
      return fail(ParseReason::kBadToken, token);
    }
    std::string_view name = token.substr(0, colon);
    std::string_view value = token.substr(colon + 1);
    if (config_.feasign_first) std::swap(name, value);

    const int slot = slots_->find(name);
    if (slot >= 0) {
      std::uint64_t key = 0;
      if (!parse_u64(value, &key)) return fail(ParseReason::kBadKey, token);
      if (key == 0) {
        ++result.zero_keys;
        continue;
      }
      const auto s = static_cast<std::uint32_t>(slot);
      in_order = in_order && s >= last_slot;
      last_slot = s;
      pending_.emplace_back(s, key);
    } else if (name == dense_name) {
      if (dense_.size() >= dense_dim) return fail(ParseReason::kTooManyDense, token);
      float v = 0.0f;
      if (!parse_dense(value, config_.dense_transform, &v)) {
        return fail(ParseReason::kBadDense, token);
      }
      dense_.push_back(v);
    } else if (name == label_name) {
      if (has_label || !parse_label(value, &label)) return fail(ParseReason::kBadLabel, token);
      has_label = true;
    } else if (!config_.ignore_unknown_slots) {
      return fail(ParseReason::kUnknownSlot, token);
    } else {
      ++result.unknown_tokens;
      note_unknown_name(name, &result);
    }
  }
  if (!has_label) return fail_note(ParseReason::kBadLabel, "missing label");
  if (dense_.size() < dense_dim)
    return fail_note(ParseReason::kTooFewDense, "fewer dense values than dense_dim");

  group_pending(in_order);
  commit(label, out);
  return result;
}

void LineParser::group_pending(bool in_order) {
  std::fill(slot_sizes_.begin(), slot_sizes_.end(), 0u);
  for (const auto& [s, key] : pending_) ++slot_sizes_[s];
  keys_.resize(pending_.size());
  if (in_order) {
    for (std::size_t k = 0; k < pending_.size(); ++k) keys_[k] = pending_[k].second;
    return;
  }
  cursor_.assign(num_slots_, 0);
  for (int s = 1; s < num_slots_; ++s) cursor_[s] = cursor_[s - 1] + slot_sizes_[s - 1];
  for (const auto& [s, key] : pending_) keys_[cursor_[s]++] = key;
}

ParseResult LineParser::parse_multislot(std::string_view line, InstanceBlock* out) {
  dense_.clear();
  keys_.clear();
  pending_.clear();
  ParseResult result;
  std::size_t pos = 0;
  bool in_order = true;
  std::uint32_t last_slot = 0;
  float label = 0.0f;
  for (const int field : multislot_fields_) {
    std::string_view token = next_token(line, &pos);
    std::uint64_t count = 0;
    if (token.empty()) return fail_note(ParseReason::kFieldCount, "fewer fields than expected");
    if (!parse_u64(token, &count)) return fail(ParseReason::kFieldCount, token);
    if (field == kMultiSlotLabel) {
      if (count != 1) return fail(ParseReason::kFieldCount, token);
      token = next_token(line, &pos);
      if (token.empty()) return fail_note(ParseReason::kFieldCount, "label value missing");
      if (!parse_label(token, &label)) return fail(ParseReason::kBadLabel, token);
      continue;
    }
    if (field == kMultiSlotDense) {
      const auto dense_dim = static_cast<std::uint64_t>(config_.dense_dim);
      if (count > dense_dim) return fail(ParseReason::kTooManyDense, token);
      if (count < dense_dim) return fail(ParseReason::kTooFewDense, token);
    }
    for (std::uint64_t k = 0; k < count; ++k) {
      token = next_token(line, &pos);
      if (token.empty()) return fail_note(ParseReason::kFieldCount, "field values missing");
      if (field == kMultiSlotDense) {
        float v = 0.0f;
        if (!parse_dense(token, config_.dense_transform, &v)) {
          return fail(ParseReason::kBadDense, token);
        }
        dense_.push_back(v);
      } else if (field >= 0) {
        std::uint64_t key = 0;
        if (!parse_u64(token, &key)) return fail(ParseReason::kBadKey, token);
        if (key == 0) {
          ++result.zero_keys;
          continue;
        }
        const auto s = static_cast<std::uint32_t>(field);
        in_order = in_order && s >= last_slot;
        last_slot = s;
        pending_.emplace_back(s, key);
      }
    }
  }
  const std::string_view extra = next_token(line, &pos);
  if (!extra.empty()) return fail(ParseReason::kFieldCount, extra);
  group_pending(in_order);
  commit(label, out);
  return result;
}

std::uint64_t LineParser::criteo_key(std::string_view value, int slot) {
  const std::uint64_t key = XXH64(value.data(), value.size(), static_cast<XXH64_hash_t>(slot));
  return key == 0 ? 1 : key;
}

float LineParser::criteo_dense(std::int64_t value, int index, CriteoDense transform) {
  const double x = static_cast<double>(value);
  switch (transform) {
    case CriteoDense::kMinMax:
      return static_cast<float>((x - kCriteoMin[index]) / kCriteoDiff[index]);
    case CriteoDense::kLog:
      return static_cast<float>(std::log1p(std::max(x, 0.0)));
    case CriteoDense::kNone:
      return static_cast<float>(x);
  }
  return 0.0f;
}

ParseResult LineParser::parse_criteo(std::string_view line, InstanceBlock* out) {
  // Spaces at the line's end (an editor's, a paste's: Criteo's values hold none) would end up in
  // the last categorical and hash it as another key, or make a missing one a key.
  while (!line.empty() && line.back() == ' ') line.remove_suffix(1);
  dense_.assign(13, 0.0f);
  keys_.clear();
  std::fill(slot_sizes_.begin(), slot_sizes_.end(), 0u);
  float label = 0.0f;
  std::size_t start = 0;
  int field = 0;
  for (;; ++field) {
    const void* tab = std::memchr(line.data() + start, '\t', line.size() - start);
    const std::size_t stop =
        tab == nullptr ? line.size() : static_cast<const char*>(tab) - line.data();
    const std::string_view value = line.substr(start, stop - start);
    if (field >= kCriteoFields) return fail_note(ParseReason::kFieldCount, "more than 40 fields");
    if (field == 0) {
      if (!parse_label(value, &label)) {
        return value.empty() ? fail_note(ParseReason::kBadLabel, "missing label")
                             : fail(ParseReason::kBadLabel, value);
      }
    } else if (field <= 13) {
      if (!value.empty()) {
        std::int64_t x = 0;
        if (!parse_i64(value, &x)) return fail(ParseReason::kBadDense, value);
        dense_[field - 1] = criteo_dense(x, field - 1, config_.criteo_dense);
      }
    } else if (!value.empty()) {
      const int slot = field - 14;
      keys_.push_back(criteo_key(value, slot));
      slot_sizes_[slot] = 1;
    }
    if (tab == nullptr) break;
    start = stop + 1;
  }
  if (field + 1 != kCriteoFields) return fail_note(ParseReason::kFieldCount, "too few fields");
  commit(label, out);
  return ParseResult{};
}

// PaddleRec's LR/FM sample text: the line's feat_idx tokens and its feat_value tokens pair up
// field by field (PaddleRec's readers zip the two lists). The first dense_dim fields are the
// dense values (their feat_idx is only the field's number); each later field is one sparse slot
// whose key is its feat_idx. A value of 0 contributes nothing to PaddleRec's LR and FM (weight
// times value), so such a field is an empty slot; feat_idx 0 is Paddle's padding, like key 0.
ParseResult LineParser::parse_feat_idx(std::string_view line, InstanceBlock* out) {
  feat_idx_.clear();
  feat_value_.clear();
  ParseResult result;
  bool has_label = false;
  float label = 0.0f;
  std::size_t pos = 0;
  for (std::string_view token = next_token(line, &pos); !token.empty();
       token = next_token(line, &pos)) {
    const std::size_t colon = token.find(':');
    if (colon == std::string_view::npos) return fail(ParseReason::kBadToken, token);
    const std::string_view name = token.substr(0, colon);
    const std::string_view value = token.substr(colon + 1);
    if (name == "feat_idx") {
      std::uint64_t index = 0;
      if (!parse_u64(value, &index)) return fail(ParseReason::kBadKey, token);
      feat_idx_.push_back(index);
    } else if (name == "feat_value") {
      float v = 0.0f;
      if (!parse_float(value, &v)) return fail(ParseReason::kBadDense, token);
      feat_value_.push_back(v);
    } else if (name == "label") {
      if (has_label || !parse_label(value, &label)) return fail(ParseReason::kBadLabel, token);
      has_label = true;
    } else {
      return fail(ParseReason::kBadToken, token);
    }
  }
  if (!has_label) return fail_note(ParseReason::kBadLabel, "missing label");
  const std::size_t fields = static_cast<std::size_t>(config_.dense_dim + num_slots_);
  if (feat_idx_.size() != fields || feat_value_.size() != fields) {
    return fail_note(ParseReason::kFieldCount,
                     "the feat_idx and feat_value counts differ from dense_input_dim plus the "
                     "sparse slots");
  }
  commit_fields(label, &result, out);
  return result;
}

constexpr const char* kIdxValueShape =
    "not the label and dense_input_dim plus the sparse slots' indices, then as many values";

// PaddleRec autoint's Criteo text (its criteo_reader.py): the label, the fields' indices, then
// their values, one space-separated line; the fields pair up as feat_idx text's do.
ParseResult LineParser::parse_idx_value(std::string_view line, InstanceBlock* out) {
  feat_idx_.clear();
  feat_value_.clear();
  ParseResult result;
  const std::size_t fields = static_cast<std::size_t>(config_.dense_dim + num_slots_);
  std::size_t pos = 0;
  std::string_view token = next_token(line, &pos);
  float label = 0.0f;
  if (!parse_label(token, &label)) return fail(ParseReason::kBadLabel, token);
  // The count first: a short or long line is told by its count, not by a value read as an index.
  std::size_t tokens = 0;
  for (std::size_t at = pos; !next_token(line, &at).empty();) ++tokens;
  if (tokens != 2 * fields) return fail_note(ParseReason::kFieldCount, kIdxValueShape);
  for (token = next_token(line, &pos); !token.empty(); token = next_token(line, &pos)) {
    if (feat_idx_.size() < fields) {
      std::uint64_t index = 0;
      if (!parse_u64(token, &index)) return fail(ParseReason::kBadKey, token);
      feat_idx_.push_back(index);
    } else {
      float v = 0.0f;
      if (!parse_float(token, &v)) return fail(ParseReason::kBadDense, token);
      feat_value_.push_back(v);
    }
  }
  if (feat_idx_.size() != fields || feat_value_.size() != fields) {
    return fail_note(ParseReason::kFieldCount, kIdxValueShape);
  }
  commit_fields(label, &result, out);
  return result;
}

constexpr const char* kAvazuShape = "not an id, one integer per sparse slot and the label";

// PaddleRec flen's Avazu text (its avazu_reader.py): comma-separated integers, the first an id
// its net never reads (FLENLayer starts at sparse_inputs[1]), then one index per sparse slot, then
// the label (dygraph_model.py takes the last). Every slot looks its index up in one embedding
// table, so an index means one row whatever its slot: the key is the index + 1 (key 0 is "no
// feature"; index 0 is a row of Paddle's table like any other). avazu_reader.py skips a line of
// another field count silently; here it is a bad line, counted and named.
ParseResult LineParser::parse_avazu(std::string_view line, InstanceBlock* out) {
  const auto fields = static_cast<std::size_t>(num_slots_) + 2;
  if (static_cast<std::size_t>(std::count(line.begin(), line.end(), ',')) + 1 != fields) {
    return fail_note(ParseReason::kFieldCount, kAvazuShape);
  }
  keys_.clear();
  std::size_t start = 0;
  for (std::size_t f = 0; f < fields; ++f) {
    const std::size_t comma = std::min(line.find(',', start), line.size());
    std::string_view value = line.substr(start, comma - start);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t'))
      value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    start = comma + 1;
    if (f + 1 == fields) {
      float label = 0.0f;
      if (!parse_label(value, &label)) return fail(ParseReason::kBadLabel, value);
      commit(label, out);
      return ParseResult{};
    }
    std::uint64_t index = 0;
    if (!parse_u64(value, &index) || index == ~std::uint64_t{0}) {
      return fail(ParseReason::kBadKey, value);
    }
    if (f == 0) continue;  // the id
    keys_.push_back(index + 1);
    slot_sizes_[f - 1] = 1;
  }
  return fail_note(ParseReason::kFieldCount, kAvazuShape);
}

// The first dense_dim fields are the dense values (their index is only the field's number);
// each later field is one sparse slot whose key is its index. A value of 0 contributes nothing
// to PaddleRec's networks (embedding times value), so such a field is an empty slot; index 0 is
// Paddle's padding, like key 0. Other values scale nothing here: a present key counts once.
void LineParser::commit_fields(float label, ParseResult* result, InstanceBlock* out) {
  dense_.assign(feat_value_.begin(), feat_value_.begin() + config_.dense_dim);
  keys_.clear();
  for (int s = 0; s < num_slots_; ++s) {
    const std::size_t f = static_cast<std::size_t>(config_.dense_dim + s);
    const bool present = feat_idx_[f] != 0 && feat_value_[f] != 0.0f;
    if (feat_idx_[f] == 0) ++result->zero_keys;
    if (present) keys_.push_back(feat_idx_[f]);
    slot_sizes_[s] = present ? 1 : 0;
  }
  commit(label, out);
}

}  // namespace gpubox::dataset
