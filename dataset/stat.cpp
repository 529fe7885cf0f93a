#include "dataset/stat.hpp"

#include <cstdio>
#include <sstream>

#include "common/json.hpp"
#include "common/timer.hpp"
#include "dataset/in_memory_dataset.hpp"
#include "dataset/load_report.hpp"

namespace gpubox::dataset {
namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

}  // namespace

double StatReport::mb_per_second() const {
  return stats.seconds > 0 ? static_cast<double>(stats.bytes) / 1e6 / stats.seconds : 0.0;
}

double StatReport::instances_per_second() const {
  return stats.seconds > 0 ? static_cast<double>(stats.instances) / stats.seconds : 0.0;
}

StatReport run_stat(const DatasetConfig& config, const std::vector<std::string>& files) {
  StatReport report;
  report.config = config;
  InMemoryDataset dataset(config);
  dataset.set_filelist(files);
  report.load_status = dataset.load_into_memory();
  report.stats = dataset.load_stats();
  report.stats.files = files.size();
  if (report.load_status.ok()) {
    Timer timer;
    report.unique_keys = dataset.unique_keys().size();
    report.unique_keys_per_slot = dataset.unique_keys_per_slot();
    report.unique_seconds = timer.seconds();
    report.memory_bytes = dataset.memory_bytes();
  } else {
    report.unique_keys_per_slot.assign(config.slots.size(), 0);
  }
  return report;
}

std::string stat_json(const StatReport& r) {
  const LoadStats& s = r.stats;
  std::ostringstream out;
  out << "{\"files\": " << s.files << ", \"lines\": " << s.lines
      << ", \"instances\": " << s.instances << ", \"blank_lines\": " << s.blank_lines
      << ", \"skipped_lines\": " << s.skipped_lines() << ", \"skipped_by_reason\": {";
  bool first = true;
  for (std::size_t k = 1; k < kNumParseReasons; ++k) {
    out << (first ? "" : ", ")
        << json_quote(name_of(kParseReasonNames, static_cast<ParseReason>(k))) << ": "
        << s.skipped_by_reason[k];
    first = false;
  }
  out << "}, \"unique_keys\": " << r.unique_keys << ", \"unique_keys_per_slot\": {";
  for (std::size_t k = 0; k < r.unique_keys_per_slot.size(); ++k) {
    out << (k ? ", " : "") << json_quote(r.config.slots[k]) << ": " << r.unique_keys_per_slot[k];
  }
  out << "}, \"positives\": " << s.positives << ", \"zero_keys_dropped\": " << s.zero_keys_dropped
      << ", \"unknown_slot_tokens\": " << s.unknown_slot_tokens << ", \"unknown_slot_names\": [";
  for (std::size_t k = 0; k < s.unknown_slot_names.size(); ++k) {
    out << (k ? ", " : "") << json_quote(s.unknown_slot_names[k]);
  }
  out << "], \"formats\": [";
  for (std::size_t k = 0; k < s.formats.size(); ++k) {
    const FormatNote& f = s.formats[k];
    out << (k ? ", " : "") << "{\"file\": " << json_quote(f.file)
        << ", \"format\": " << json_quote(f.format)
        << ", \"detected\": " << (f.detected ? "true" : "false")
        << ", \"sample_lines\": " << f.sample_lines << ", \"sample_parsed\": " << f.sample_parsed
        << ", \"hint\": " << json_quote(f.hint) << "}";
  }
  out << "]"
      << ", \"bytes\": " << s.bytes << ", \"seconds\": " << number(s.seconds)
      << ", \"mb_per_s\": " << number(r.mb_per_second())
      << ", \"instances_per_s\": " << number(r.instances_per_second())
      << ", \"unique_seconds\": " << number(r.unique_seconds)
      << ", \"memory_bytes\": " << r.memory_bytes << ", \"threads\": " << r.config.thread_num
      << ", \"data_format\": " << json_quote(name_of(kDataFormatNames, r.config.data_format))
      << ", \"status\": " << json_quote(r.load_status.ok() ? "ok" : r.load_status.to_string())
      << ", \"errors\": [";
  for (std::size_t k = 0; k < s.errors.size(); ++k) {
    const ParseErrorRecord& e = s.errors[k];
    out << (k ? ", " : "") << "{\"file\": " << json_quote(e.file) << ", \"line\": " << e.line
        << ", \"reason\": " << json_quote(name_of(kParseReasonNames, e.reason))
        << ", \"detail\": " << json_quote(e.detail) << "}";
  }
  out << "], \"skipped_entries\": [";
  for (std::size_t k = 0; k < r.skipped_entries.size(); ++k) {
    const SkippedEntry& e = r.skipped_entries[k];
    out << (k ? ", " : "") << "{\"path\": " << json_quote(e.path)
        << ", \"reason\": " << json_quote(name_of(kSkipReasonNames, e.reason));
    if (e.reason == SkipReason::kSameFile) out << ", \"same_as\": " << json_quote(e.same_as);
    out << "}";
  }
  out << "]}";
  return out.str();
}

std::string stat_text(const StatReport& r) {
  const LoadStats& s = r.stats;
  std::ostringstream out;
  out << "format: " << name_of(kDataFormatNames, r.config.data_format)
      << ", threads: " << r.config.thread_num << "\nfiles: " << s.files << ", lines: " << s.lines
      << ", instances: " << s.instances << ", positives: " << s.positives
      << ", blank lines: " << s.blank_lines;
  if (s.files == 0) out << "\nwarning: files: 0 (no data file: training would refuse this)";
  if (s.files > 0 && s.instances == 0 && r.load_status.ok()) {
    out << "\nwarning: instances: 0 (no line is a valid instance: training would refuse this)";
  }
  if (!r.skipped_entries.empty()) {
    out << "\nskipped entries: " << r.skipped_entries.size();
    for (const SkippedEntry& e : r.skipped_entries) out << "\n  " << e.to_string();
  }
  out << "\nskipped lines: " << s.skipped_lines();
  for (std::size_t k = 1; k < kNumParseReasons; ++k) {
    if (s.skipped_by_reason[k] > 0) {
      out << ", " << name_of(kParseReasonNames, static_cast<ParseReason>(k)) << ": "
          << s.skipped_by_reason[k];
    }
  }
  // The load's own messages (the format read, padding keys, skipped tokens, what rejected
  // inputs look like), as training prints them.
  const LoadMessages messages = load_messages(s);
  for (const std::string& line : messages.info) out << "\n" << line;
  for (const std::string& line : messages.warnings) {
    if (line.rfind("skipped ", 0) != 0) out << "\n" << line;  // the counts are above
  }
  if (r.load_status.ok()) {
    out << "\nunique keys: " << r.unique_keys << " (per slot:";
    for (std::size_t k = 0; k < r.unique_keys_per_slot.size(); ++k) {
      out << " " << r.config.slots[k] << "=" << r.unique_keys_per_slot[k];
    }
    out << ")";
  } else {
    out << "\nunique keys: not counted (the load failed: the error below)";  // not 0
  }
  out << "\nbytes: " << s.bytes << ", seconds: " << number(s.seconds)
      << ", MB/s: " << number(r.mb_per_second())
      << ", instances/s: " << number(r.instances_per_second())
      << "\nmemory: " << number(static_cast<double>(r.memory_bytes) / 1e6) << " MB"
      << ", unique-key pass: " << number(r.unique_seconds) << " s";
  if (!r.load_status.ok()) out << "\nerror: " << r.load_status.to_string();
  out << "\n";
  return out.str();
}

}  // namespace gpubox::dataset
