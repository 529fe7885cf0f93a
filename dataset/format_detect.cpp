#include "dataset/format_detect.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "dataset/text_number.hpp"

namespace gpubox::dataset {
namespace {

constexpr int kCriteoSlots = 26;
constexpr int kCriteoDense = 13;
constexpr std::size_t kCriteoFields = 40;
// A multislot_order longer than this is described, not spelled out, in a hint.
constexpr std::size_t kMaxOrderInHint = 30;

const DatasetConfig& validated(const DatasetConfig& config) {
  throw_if_error(validate(config));
  return config;
}

bool fits_criteo(const DatasetConfig& c) {
  return static_cast<int>(c.slots.size()) == kCriteoSlots && c.dense_dim == kCriteoDense;
}

std::vector<std::string_view> tokens_of(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    const std::size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

bool is_number(std::string_view text) {
  float v = 0.0f;
  return parse_float(text, &v);
}

// The MultiSlot order of GPUBox's writer before PaddleRec's became the default.
std::vector<std::string> label_dense_sparse_order(const DatasetConfig& c) {
  std::vector<std::string> order = {c.label_name, c.dense_name};
  order.insert(order.end(), c.slots.begin(), c.slots.end());
  return order;
}

// The fields of an all-numeric line read as idx_value text (the label 0 or 1, F indices, then F
// values): F, or 0 when it cannot be (an even count of numbers, another label, an index that is
// not a non-negative integer).
std::size_t idx_value_fields(const std::vector<std::string_view>& tokens) {
  if (tokens.size() < 3 || tokens.size() % 2 == 0) return 0;
  if (tokens[0] != "0" && tokens[0] != "1") return 0;
  const std::size_t fields = (tokens.size() - 1) / 2;
  for (std::size_t i = 1; i <= fields; ++i) {
    std::uint64_t index = 0;
    if (!parse_u64(tokens[i], &index)) return 0;
  }
  return fields;
}

// Whether the numbers split into at least `min_fields` MultiSlot fields (`n v1 .. vn` each, n a
// count), ending with the line.
bool splits_as_multislot(const std::vector<std::string_view>& tokens, std::size_t min_fields) {
  std::size_t at = 0;
  std::size_t fields = 0;
  while (at < tokens.size()) {
    std::uint64_t count = 0;
    if (!parse_u64(tokens[at], &count) || count > tokens.size() - at - 1) return false;
    at += 1 + static_cast<std::size_t>(count);
    ++fields;
  }
  return fields >= min_fields;
}

// The hint for a line of numbers no candidate read: MultiSlot in another order, or idx_value
// text of another field count (what idx_value would need then), or either.
std::string describe_numbers(const std::vector<std::string_view>& tokens,
                             const DatasetConfig& config, const std::string& config_shape) {
  const std::string multislot =
      "these look like MultiSlot (`n v1 .. vn` per field) in another field order than the "
      "config's: name it in runner.multislot_order (label_name, slot names, dense_name; "
      "other names are skipped fields)";
  const std::size_t found = idx_value_fields(tokens);
  // The label, the slots and the dense field: a MultiSlot line has at least these.
  const std::size_t multislot_fields = 1 + config.slots.size() + (config.dense_dim > 0 ? 1 : 0);
  const std::size_t fields = config.slots.size() + static_cast<std::size_t>(config.dense_dim);
  // As many fields as the config's would have been read as idx_value: not the shape that failed.
  if (found == 0 || found == fields) return multislot;
  const std::string idx_value =
      "idx_value text (PaddleRec's autoint samples) with " + std::to_string(found) +
      " fields (the label, then " + std::to_string(found) + " indices and " +
      std::to_string(found) + " values), but " + config_shape + ": idx_value needs " +
      std::to_string(fields) + " fields, " + std::to_string(2 * fields + 1) +
      " numbers a line, where these have " + std::to_string(tokens.size());
  if (splits_as_multislot(tokens, multislot_fields)) return multislot + "; or, as " + idx_value;
  return "these look like " + idx_value;
}

}  // namespace

std::vector<DatasetConfig> format_candidates(const DatasetConfig& config) {
  if (config.data_format != DataFormat::kAuto) return {config};
  std::vector<DatasetConfig> out;
  // Each candidate passes validate() as `config` does: the names are the same, Criteo is only
  // added for its shape, and the label-dense-sparse order names every field once.
  const auto add = [&](DataFormat format, auto&& adjust) {
    DatasetConfig c = config;
    c.data_format = format;
    adjust(c);
    out.push_back(std::move(c));
  };
  // The slot text in either token order, or in the one the config gives: read in the other,
  // a line's keys would be taken for its slot names and its slot names for keys.
  for (const bool feasign_first : {false, true}) {
    if (config.token_order_set && feasign_first != config.feasign_first) continue;
    add(DataFormat::kSlot, [feasign_first](DatasetConfig& c) { c.feasign_first = feasign_first; });
  }
  add(DataFormat::kMultiSlot, [](DatasetConfig&) {});
  if (config.multislot_order.empty() && config.dense_dim > 0) {
    add(DataFormat::kMultiSlot,
        [](DatasetConfig& c) { c.multislot_order = label_dense_sparse_order(c); });
  }
  if (fits_criteo(config)) add(DataFormat::kCriteo, [](DatasetConfig&) {});
  add(DataFormat::kFeatIdx, [](DatasetConfig&) {});
  add(DataFormat::kIdxValue, [](DatasetConfig&) {});
  if (config.dense_dim == 0) add(DataFormat::kAvazu, [](DatasetConfig&) {});
  GPUBOX_EXPECTS(!out.empty(), "no input format fits the config");
  return out;
}

std::string describe_format(const DatasetConfig& c) {
  switch (c.data_format) {
    case DataFormat::kSlot:
      return std::string("slot text (") + (c.feasign_first ? "feasign:slot" : "slot:feasign") + ")";
    case DataFormat::kMultiSlot: {
      if (c.multislot_order.empty()) {
        return c.dense_dim > 0 ? "MultiSlot (label, sparse slots, dense)"
                               : "MultiSlot (label, sparse slots)";
      }
      // Name the fields, a run of slots as one "sparse slots".
      std::string fields;
      bool in_slots = false;
      for (const std::string& name : c.multislot_order) {
        const bool slot = std::find(c.slots.begin(), c.slots.end(), name) != c.slots.end();
        if (slot && in_slots) continue;
        in_slots = slot;
        fields += fields.empty() ? "" : ", ";
        if (slot) {
          fields += "sparse slots";
        } else if (name == c.label_name) {
          fields += "label";
        } else if (name == c.dense_name) {
          fields += "dense";
        } else {
          fields += "'" + name + "' (skipped)";
        }
      }
      return "MultiSlot (" + fields + ")";
    }
    case DataFormat::kCriteo:
      return "raw Criteo TSV";
    case DataFormat::kFeatIdx:
      return "feat_idx text (PaddleRec's LR/FM samples)";
    case DataFormat::kIdxValue:
      return "idx_value text (PaddleRec's autoint samples)";
    case DataFormat::kAvazu:
      return "avazu text (PaddleRec's flen samples: id, one index per slot, label)";
    case DataFormat::kAuto:
      break;
  }
  return "auto";
}

std::string format_setting(const DatasetConfig& c) {
  std::string out = std::string("runner.data_format: ") + name_of(kDataFormatNames, c.data_format);
  if (c.data_format == DataFormat::kSlot && c.feasign_first) {
    out += ", runner.slot_token_order: feasign:slot";
  }
  if (c.data_format == DataFormat::kMultiSlot && !c.multislot_order.empty()) {
    if (c.multislot_order.size() > kMaxOrderInHint) {
      out += ", runner.multislot_order naming its fields (label, dense, then the slots)";
    } else {
      std::string list;
      for (const std::string& name : c.multislot_order) list += (list.empty() ? "" : ", ") + name;
      out += ", runner.multislot_order: [" + list + "]";
    }
  }
  return out;
}

std::string compressed_refusal(std::string_view first_line) {
  struct Magic {
    std::string_view bytes;
    const char* name;
    const char* command;
  };
  // bzip2's "BZh" with its block size and its block header's first bytes: no text line's start.
  static const Magic kMagics[] = {
      {std::string_view("\x1f\x8b", 2), "gzip", "gzip -dc"},
      {std::string_view("\x28\xb5\x2f\xfd", 4), "zstd", "zstd -dc"},
      {std::string_view("\xfd\x37\x7a\x58\x5a\x00", 6), "xz", "xz -dc"},
      {std::string_view("\x04\x22\x4d\x18", 4), "lz4", "lz4 -dc"},
      {std::string_view("PK\x03\x04", 4), "zip", "unzip -p"},
  };
  for (const Magic& magic : kMagics) {
    if (first_line.substr(0, magic.bytes.size()) == magic.bytes) {
      return std::string("it is ") + magic.name +
             "-compressed: decompress it, or read it through runner.pipe_command: \"" +
             magic.command + "\"";
    }
  }
  if (first_line.size() >= 10 && first_line.substr(0, 3) == "BZh" && first_line[3] >= '1' &&
      first_line[3] <= '9' && first_line.substr(4, 6) == std::string_view("1AY&SY")) {
    return "it is bzip2-compressed: decompress it, or read it through runner.pipe_command: "
           "\"bzip2 -dc\"";
  }
  return "";
}

std::string describe_shape(const std::vector<std::string>& lines, const DatasetConfig& config) {
  if (lines.empty()) return "";
  // The first line speaks for the sample: inputs are one format throughout.
  const std::string_view line = lines.front();
  // A compressed file read as text (its magic bytes start the first "line").
  const std::string compressed = compressed_refusal(line);
  if (!compressed.empty()) return compressed;
  const std::size_t tab_fields =
      static_cast<std::size_t>(std::count(line.begin(), line.end(), '\t')) + 1;
  const std::string config_shape = "the config has " + std::to_string(config.slots.size()) +
                                   " sparse slots and dense_input_dim " +
                                   std::to_string(config.dense_dim);
  if (tab_fields == kCriteoFields) {
    if (fits_criteo(config)) {
      return "these look like raw Criteo TSV: set runner.data_format: criteo (or auto)";
    }
    return "these look like raw Criteo TSV, which needs hyper_parameters.sparse_inputs_slots: 27 "
           "and dense_input_dim: 13 (" +
           config_shape + ")";
  }
  const std::size_t comma_fields =
      static_cast<std::size_t>(std::count(line.begin(), line.end(), ',')) + 1;
  if (tab_fields == 1 && comma_fields > 2) {
    return "these look like avazu text (PaddleRec's flen samples) with " +
           std::to_string(comma_fields) + " fields, which needs dense_input_dim 0 and " +
           std::to_string(comma_fields - 2) + " sparse slots (an id, the slots, the label; " +
           config_shape + ")";
  }
  if (tab_fields > 2) {
    return "these are tab-separated with " + std::to_string(tab_fields) +
           " fields, which no GPUBox format is (raw Criteo TSV has 40)";
  }
  const std::vector<std::string_view> tokens = tokens_of(line);
  std::size_t feat_idx = 0;
  std::size_t with_colon = 0;
  std::size_t numbers = 0;
  bool has_label = false;
  const std::string_view label = config.label_name;
  for (std::string_view t : tokens) {
    const std::size_t colon = t.find(':');
    if (colon == std::string_view::npos) {
      numbers += is_number(t) ? 1 : 0;
      continue;
    }
    ++with_colon;
    if (t.substr(0, colon) == "feat_idx") ++feat_idx;
    has_label = has_label || t.substr(0, colon) == label || t.substr(colon + 1) == label;
  }
  if (feat_idx > 0) {
    const std::size_t fields = config.slots.size() + static_cast<std::size_t>(config.dense_dim);
    if (feat_idx != fields) {
      return "these look like feat_idx text (PaddleRec's LR/FM samples) with " +
             std::to_string(feat_idx) + " fields, but " + config_shape + " (" +
             std::to_string(fields) + " fields)";
    }
    return "these look like feat_idx text (PaddleRec's LR/FM samples): set runner.data_format: "
           "feat_idx (or auto)";
  }
  if (!tokens.empty() && numbers == tokens.size()) {
    return describe_numbers(tokens, config, config_shape);
  }
  if (with_colon > 0 && !has_label) {
    return "these look like slot text without a '" + config.label_name +
           "' label (runner.label_name; PaddleRec's slot_dnn data keeps its label in slot \"1\": "
           "runner.label_name: \"1\")";
  }
  return "";
}

FormatChooser::FormatChooser(const DatasetConfig& config)
    : FormatChooser(validated(config), std::make_shared<const SlotIndex>(config.slots)) {}

FormatChooser::FormatChooser(const DatasetConfig& config, std::shared_ptr<const SlotIndex> slots)
    : config_(config),
      slots_(std::move(slots)),
      scratch_(static_cast<int>(config.slots.size()), config.dense_dim) {
  for (const DatasetConfig& c : format_candidates(config_)) {
    parsers_.push_back(std::make_unique<LineParser>(c, slots_));
  }
}

std::size_t FormatChooser::accepted(LineParser& parser, const std::vector<std::string>& sample) {
  std::size_t ok = 0;
  for (const std::string& line : sample) ok += parser.parse(line, &scratch_).ok() ? 1 : 0;
  scratch_.clear();
  return ok;
}

std::string FormatChooser::hint_for(const std::vector<std::string>& sample) {
  if (!alternatives_) {
    DatasetConfig any = config_;
    any.data_format = DataFormat::kAuto;
    // The configured format's own name and order are what failed: look at the others.
    any.multislot_order.clear();
    alternatives_ = std::make_unique<FormatChooser>(any, slots_);
  }
  std::size_t best = 0;
  std::size_t best_ok = 0;
  for (std::size_t i = 0; i < alternatives_->size(); ++i) {
    const std::size_t ok = accepted(alternatives_->parser(i), sample);
    if (ok > best_ok) {
      best = i;
      best_ok = ok;
    }
  }
  if (best_ok == 0) return describe_shape(sample, config_);
  const DatasetConfig& found = alternatives_->parser(best).config();
  return "these look like " + describe_format(found) + ": set " + format_setting(found) +
         " (or runner.data_format: auto)";
}

std::size_t FormatChooser::choose(const std::string& file, const std::vector<std::string>& sample,
                                  FormatNote* note) {
  std::size_t best = 0;
  std::size_t best_ok = 0;
  note->tie.clear();
  if (parsers_.size() > 1) {
    std::vector<std::size_t> oks;
    for (std::size_t i = 0; i < parsers_.size(); ++i) {
      oks.push_back(accepted(*parsers_[i], sample));
      if (oks[i] > best_ok) {
        best = i;
        best_ok = oks[i];
      }
    }
    // Another reading of the same lines as good: the first tried is taken, the other said.
    const std::string taken = describe_format(parsers_[best]->config());
    for (std::size_t i = best + 1; i < parsers_.size() && best_ok > 0 && note->tie.empty(); ++i) {
      const DatasetConfig& other = parsers_[i]->config();
      if (oks[i] == best_ok && describe_format(other) != taken) {
        note->tie = describe_format(other) + " (" + format_setting(other) + ")";
      }
    }
  } else if (!sample.empty()) {
    best_ok = accepted(*parsers_[0], sample);
  }
  note->file = file;
  note->format = describe_format(parsers_[best]->config());
  note->detected = config_.data_format == DataFormat::kAuto;
  note->sample_lines = sample.size();
  note->sample_parsed = best_ok;
  note->hint.clear();
  if (!sample.empty() && best_ok == 0) {
    note->hint = note->detected ? describe_shape(sample, config_) : hint_for(sample);
  }
  return best;
}

}  // namespace gpubox::dataset
