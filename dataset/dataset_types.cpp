#include "dataset/dataset_types.hpp"

#include <algorithm>
#include <charconv>
#include <string_view>

#include "dataset/line_reader.hpp"

namespace gpubox::dataset {

namespace {

// The format's own limits: Criteo's 26 + 13 fields, Avazu's no dense values, runner.dense_transform
// only where the dense values are read as they are.
Status check_format(const DatasetConfig& config) {
  if (config.data_format == DataFormat::kCriteo) {
    if (config.slots.size() != 26 || config.dense_dim != 13) {
      return Status::InvalidArgument(
          "runner.data_format criteo needs 26 sparse slots (hyper_parameters.sparse_inputs_slots "
          "27) and 13 dense values (hyper_parameters.dense_input_dim 13), the config has " +
          std::to_string(config.slots.size()) + " slots and dense_input_dim " +
          std::to_string(config.dense_dim));
    }
  }
  if (config.data_format == DataFormat::kAvazu && config.dense_dim != 0) {
    return Status::InvalidArgument(
        "runner.data_format avazu has no dense features, but hyper_parameters.dense_input_dim "
        "is " +
        std::to_string(config.dense_dim) + ": set it to 0");
  }
  // The transform is read with the slot and multislot dense fields; the Criteo formats scale
  // theirs by runner.criteo_dense. Set for those, it would be named at start and never applied.
  if ((config.data_format == DataFormat::kCriteo || config.data_format == DataFormat::kFeatIdx ||
       config.data_format == DataFormat::kIdxValue || config.data_format == DataFormat::kAvazu) &&
      config.dense_transform != config::DenseTransform::kNone &&
      config.dense_transform != config::DenseTransform::kAuto) {
    return Status::InvalidArgument(
        std::string("runner.dense_transform ") +
        name_of(config::kDenseTransformNames, config.dense_transform) +
        " applies to slot and multislot data, but runner.data_format is " +
        name_of(kDataFormatNames, config.data_format) +
        " (its dense values follow runner.criteo_dense): set runner.dense_transform: none");
  }
  return Status::OK();
}

// `names` sorted (O(n log n) for the 100,000 slots a config may declare); the first name in it
// twice, or the end.
std::vector<std::string_view>::const_iterator sorted_repeat(std::vector<std::string_view>& names) {
  std::sort(names.begin(), names.end());
  return std::adjacent_find(names.cbegin(), names.cend());
}

// The slot and multislot formats' names: the label, the dense field, the slots (no blanks or
// ':', none twice, none the label's or the dense field's).
Status check_slot_names(const DatasetConfig& config) {
  if (config.label_name.empty() || config.dense_name.empty()) {
    return Status::InvalidArgument(
        "the slot and multislot formats need a non-empty runner.label_name and "
        "runner.dense_name");
  }
  if (config.label_name == config.dense_name) {  // every line's label read as its dense values
    return Status::InvalidArgument("runner.label_name and runner.dense_name are both '" +
                                   config.label_name +
                                   "': name the label and the dense field apart");
  }
  for (const std::string& name : config.slots) {
    if (name.empty() || name.find_first_of(": \t") != std::string::npos) {
      return Status::InvalidArgument("slot name '" + name + "' is empty or holds ':' or blanks");
    }
    if (name == config.label_name || name == config.dense_name) {
      return Status::InvalidArgument("slot name '" + name +
                                     "' clashes with runner.label_name or runner.dense_name");
    }
  }
  std::vector<std::string_view> sorted(config.slots.begin(), config.slots.end());
  const auto twice = sorted_repeat(sorted);
  if (twice != sorted.cend()) {
    return Status::InvalidArgument("slot name '" + std::string(*twice) + "' is declared twice");
  }
  return Status::OK();
}

// runner.multislot_order: no field twice, the label named, the dense field named exactly when
// there are dense values.
Status check_multislot_order(const DatasetConfig& config) {
  std::vector<std::string_view> sorted(config.multislot_order.begin(),
                                       config.multislot_order.end());
  const auto twice = sorted_repeat(sorted);
  if (twice != sorted.cend()) {
    return Status::InvalidArgument(config.multislot_order_from + " names '" + std::string(*twice) +
                                   "' twice");
  }
  const auto has = [&](const std::string& name) {
    return std::binary_search(sorted.begin(), sorted.end(), std::string_view(name));
  };
  if (!has(config.label_name)) {
    return Status::InvalidArgument(config.multislot_order_from + " does not name the label ('" +
                                   config.label_name + "', runner.label_name)");
  }
  if (has(config.dense_name) != (config.dense_dim > 0)) {
    return Status::InvalidArgument(
        config.multislot_order_from + " must name the dense field ('" + config.dense_name +
        "', runner.dense_name) exactly when hyper_parameters.dense_input_dim > 0 (it is " +
        std::to_string(config.dense_dim) + ")");
  }
  return Status::OK();
}

}  // namespace

Status validate(const DatasetConfig& config) {
  if (config.dense_dim < 0) {
    return Status::InvalidArgument("hyper_parameters.dense_input_dim must be >= 0");
  }
  if (config.thread_num < 1) return Status::InvalidArgument("runner.thread_num must be >= 1");
  if (config.batch_size < 1) return Status::InvalidArgument("runner.train_batch_size must be >= 1");
  if (config.max_line_bytes < 16) {
    return Status::InvalidArgument("runner.max_line_bytes must be >= 16");
  }
  if (config.split_bytes < 1) return Status::InvalidArgument("split_bytes must be >= 1");
  GPUBOX_RETURN_IF_ERROR(check_format(config));
  const bool named = config.data_format == DataFormat::kSlot ||
                     config.data_format == DataFormat::kMultiSlot ||
                     config.data_format == DataFormat::kAuto;
  if (named) GPUBOX_RETURN_IF_ERROR(check_slot_names(config));
  if (!config.multislot_order.empty()) GPUBOX_RETURN_IF_ERROR(check_multislot_order(config));
  return Status::OK();
}

std::vector<std::string> numbered_slots(int sparse_inputs_slots, const std::string& label_name) {
  std::vector<std::string> names;
  for (int i = 1; static_cast<int>(names.size()) + 1 < sparse_inputs_slots; ++i) {
    std::string name = std::to_string(i);
    if (name != label_name) names.push_back(std::move(name));
  }
  return names;
}

std::string pipe_command_line(const DatasetConfig& config) {
  if (config.pipe_command.empty()) return "";
  std::string line = config.pipe_command;
  for (const std::string& arg : config.pipe_arguments) line += " " + shell_quote(arg);
  return line;
}

std::int32_t slot_id(const std::vector<std::string>& slots, std::size_t position) {
  const std::string& name = slots.at(position);
  std::int32_t id = 0;
  const auto [end, error] = std::from_chars(name.data(), name.data() + name.size(), id);
  if (!name.empty() && error == std::errc() && end == name.data() + name.size()) return id;
  return static_cast<std::int32_t>(position);
}

std::string ParseErrorRecord::to_string() const {
  std::string out =
      file + ":" + std::to_string(line) + ": " +
      (reason == ParseReason::kOk ? "blank line" : name_of(kParseReasonNames, reason));
  if (!detail.empty()) out += ": " + detail;
  // What a label must be, beside the token refused ('click:1.0', exported data's float label).
  if (reason == ParseReason::kBadLabel && detail != "missing label") out += " (a label is 0 or 1)";
  return out;
}

std::uint64_t LoadStats::skipped_lines() const {
  std::uint64_t total = 0;
  for (std::uint64_t n : skipped_by_reason) total += n;
  return total;
}

void LoadStats::merge(const LoadStats& other, std::size_t max_errors) {
  files += other.files;
  lines += other.lines;
  blank_lines += other.blank_lines;
  instances += other.instances;
  positives += other.positives;
  bytes += other.bytes;
  skipped_bytes += other.skipped_bytes;
  zero_keys_dropped += other.zero_keys_dropped;
  unknown_slot_tokens += other.unknown_slot_tokens;
  if (slot_names.empty()) slot_names = other.slot_names;
  if (slot_keys.size() < other.slot_keys.size()) slot_keys.resize(other.slot_keys.size(), 0);
  for (std::size_t s = 0; s < other.slot_keys.size(); ++s) slot_keys[s] += other.slot_keys[s];
  slot_counted_instances += other.slot_counted_instances;
  for (const std::string& name : other.unknown_slot_names) {
    if (unknown_slot_names.size() < kMaxUnknownSlotNames &&
        std::find(unknown_slot_names.begin(), unknown_slot_names.end(), name) ==
            unknown_slot_names.end()) {
      unknown_slot_names.push_back(name);
    }
  }
  formats.insert(formats.end(), other.formats.begin(), other.formats.end());
  for (std::size_t r = 0; r < kNumParseReasons; ++r)
    skipped_by_reason[r] += other.skipped_by_reason[r];
  cached_files += other.cached_files;
  cached_instances += other.cached_instances;
  if (cache_note.empty()) cache_note = other.cache_note;
  for (const ParseErrorRecord& e : other.errors) {
    if (errors.size() >= max_errors) break;
    errors.push_back(e);
  }
}

}  // namespace gpubox::dataset
