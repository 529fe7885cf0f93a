#include "dataset/dataset_types.hpp"

#include <algorithm>

namespace gpubox::dataset {

const char* format_name(DataFormat format) {
  switch (format) {
    case DataFormat::kSlot:
      return "slot";
    case DataFormat::kMultiSlot:
      return "multislot";
    case DataFormat::kCriteo:
      return "criteo";
  }
  return "unknown";
}

StatusOr<DataFormat> parse_format(const std::string& name) {
  if (name == "slot") return DataFormat::kSlot;
  if (name == "multislot") return DataFormat::kMultiSlot;
  if (name == "criteo") return DataFormat::kCriteo;
  return Status::InvalidArgument("unknown data_format '" + name +
                                 "' (expected slot, multislot or criteo)");
}

const char* criteo_dense_name(CriteoDense transform) {
  switch (transform) {
    case CriteoDense::kMinMax:
      return "minmax";
    case CriteoDense::kLog:
      return "log";
    case CriteoDense::kNone:
      return "none";
  }
  return "unknown";
}

StatusOr<CriteoDense> parse_criteo_dense(const std::string& name) {
  if (name == "minmax") return CriteoDense::kMinMax;
  if (name == "log") return CriteoDense::kLog;
  if (name == "none") return CriteoDense::kNone;
  return Status::InvalidArgument("unknown criteo_dense '" + name +
                                 "' (expected minmax, log or none)");
}

Status validate(const DatasetConfig& config) {
  if (config.dense_dim < 0) return Status::InvalidArgument("dense_dim must be >= 0");
  if (config.thread_num < 1) return Status::InvalidArgument("thread_num must be >= 1");
  if (config.batch_size < 1) return Status::InvalidArgument("batch_size must be >= 1");
  if (config.max_line_bytes < 16) return Status::InvalidArgument("max_line_bytes must be >= 16");
  if (config.split_bytes < 1) return Status::InvalidArgument("split_bytes must be >= 1");
  if (config.data_format == DataFormat::kCriteo) {
    if (config.slots.size() != 26 || config.dense_dim != 13) {
      return Status::InvalidArgument(
          "criteo format needs 26 sparse slots and dense_dim 13, config has " +
          std::to_string(config.slots.size()) + " slots and dense_dim " +
          std::to_string(config.dense_dim));
    }
  }
  if (config.data_format == DataFormat::kSlot) {
    if (config.label_name.empty() || config.dense_name.empty()) {
      return Status::InvalidArgument("slot format needs non-empty label and dense token names");
    }
    for (std::size_t i = 0; i < config.slots.size(); ++i) {
      const std::string& name = config.slots[i];
      if (name.empty() || name.find_first_of(": \t") != std::string::npos) {
        return Status::InvalidArgument("slot name '" + name + "' is empty or holds ':' or blanks");
      }
      if (name == config.label_name || name == config.dense_name) {
        return Status::InvalidArgument("slot name '" + name +
                                       "' clashes with the label/dense name");
      }
      if (std::find(config.slots.begin(), config.slots.begin() + i, name) !=
          config.slots.begin() + i) {
        return Status::InvalidArgument("slot name '" + name + "' is declared twice");
      }
    }
  }
  return Status::OK();
}

std::vector<std::string> numbered_slots(int sparse_inputs_slots) {
  std::vector<std::string> names;
  for (int i = 1; i < sparse_inputs_slots; ++i) names.push_back(std::to_string(i));
  return names;
}

const char* reason_name(ParseReason reason) {
  switch (reason) {
    case ParseReason::kOk:
      return "ok";
    case ParseReason::kBadToken:
      return "bad_token";
    case ParseReason::kUnknownSlot:
      return "unknown_slot";
    case ParseReason::kBadLabel:
      return "bad_label";
    case ParseReason::kBadKey:
      return "bad_key";
    case ParseReason::kBadDense:
      return "bad_dense";
    case ParseReason::kTooManyDense:
      return "too_many_dense";
    case ParseReason::kTooFewDense:
      return "too_few_dense";
    case ParseReason::kFieldCount:
      return "field_count";
    case ParseReason::kLineTooLong:
      return "line_too_long";
    case ParseReason::kTruncatedLastLine:
      return "truncated_last_line";
    case ParseReason::kNumReasons:
      break;
  }
  return "unknown";
}

std::string ParseErrorRecord::to_string() const {
  std::string out = file + ":" + std::to_string(line) + ": " + reason_name(reason);
  if (!detail.empty()) out += ": " + detail;
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
  zero_keys_dropped += other.zero_keys_dropped;
  for (std::size_t r = 0; r < kNumParseReasons; ++r)
    skipped_by_reason[r] += other.skipped_by_reason[r];
  for (const ParseErrorRecord& e : other.errors) {
    if (errors.size() >= max_errors) break;
    errors.push_back(e);
  }
}

}  // namespace gpubox::dataset
