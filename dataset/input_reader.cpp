#include "dataset/input_reader.hpp"

#include <algorithm>

namespace gpubox::dataset {
namespace {

constexpr std::size_t kSampleInstances = 4096;

// Reserves `block` for `total_bytes` of input, extrapolating from the first `read_bytes` that
// gave its current contents (5% headroom).
void reserve_for(std::uint64_t total_bytes, std::uint64_t read_bytes, InstanceBlock* block) {
  const double scale = 1.05 * static_cast<double>(total_bytes) / static_cast<double>(read_bytes);
  const auto instances = static_cast<std::size_t>(scale * static_cast<double>(block->size()));
  const auto keys = static_cast<std::size_t>(scale * static_cast<double>(block->keys.size()));
  block->labels.reserve(instances);
  block->dense.reserve(instances * static_cast<std::size_t>(block->dense_dim));
  block->key_begin.reserve(instances + 1);
  block->keys.reserve(keys);
  block->slot_sizes.reserve(instances * static_cast<std::size_t>(block->num_slots));
}

// A line that counts towards the sample deciding a format: read whole, not blank.
bool is_sample_line(const Line& line) {
  return line.issue == ParseReason::kOk &&
         line.text.find_first_not_of(" \t\r") != std::string_view::npos;
}

}  // namespace

InputOutcome read_input(LineReader& reader, FormatChooser& formats, const DatasetConfig& config,
                        const std::string& path, InstanceBlock* block, LoadStats* stats,
                        const InputHooks& hooks) {
  InputOutcome outcome;
  auto reject = [&](ParseReason reason, std::uint64_t line, std::string detail) {
    ++stats->skipped_by_reason[static_cast<std::size_t>(reason)];
    // Under strict_parse the failing line is always recorded: it becomes the error message.
    if (stats->errors.size() < config.max_reported_errors || config.strict_parse) {
      stats->errors.push_back(ParseErrorRecord{path, line, reason, std::move(detail)});
    }
  };
  auto positives_of = [](const InstanceBlock& b, std::size_t from) {
    std::uint64_t n = 0;
    for (std::size_t i = from; i < b.size(); ++i) n += b.labels[i] > 0.5f ? 1 : 0;
    return n;
  };
  std::size_t counted = block->size();  // instances whose labels are already in positives
  auto flush = [&]() -> Status {
    stats->positives += positives_of(*block, counted);
    counted = block->size();
    if (!hooks.on_chunk) return Status::OK();
    Status st = hooks.on_chunk(block);
    counted = block->size();
    return st;
  };

  // The format: given, or chosen from the first non-blank lines, which are kept (copied) until
  // the choice is made and then parsed like the rest.
  std::vector<Line> held;
  std::vector<std::string> held_text;
  std::size_t candidate = 0;
  if (hooks.candidate >= 0) {
    candidate = static_cast<std::size_t>(hooks.candidate);
    if (hooks.note != nullptr) stats->formats.push_back(*hooks.note);
  } else {
    std::vector<std::string> sample;
    Line line;
    while (sample.size() < kFormatSampleLines && reader.next(&line)) {
      held.push_back(line);
      held_text.emplace_back(line.text);
      if (is_sample_line(line)) sample.emplace_back(line.text);
    }
    for (std::size_t i = 0; i < held.size(); ++i) held[i].text = held_text[i];
    FormatNote note;
    candidate = formats.choose(path, sample, &note);
    stats->formats.push_back(std::move(note));
  }
  LineParser& parser = formats.parser(candidate);

  // Parses one line; false stops reading (strict_parse, on_chunk's error, keep_going).
  bool stopped = false;
  auto handle = [&](const Line& line) -> bool {
    ++stats->lines;
    // Every 4096 lines, whatever they hold (blank or rejected lines too).
    if ((line.number & 0xfff) == 0 && hooks.keep_going && !hooks.keep_going()) return false;
    if (line.issue == ParseReason::kLineTooLong) {
      reject(line.issue, line.number,
             "longer than " + std::to_string(config.max_line_bytes) + " bytes");
    } else if (line.issue == ParseReason::kTruncatedLastLine) {
      reject(line.issue, line.number, "no newline at the end of the file");
    } else {
      const ParseResult parsed = parser.parse(line.text, block);
      if (parsed.blank) {
        ++stats->blank_lines;
        return true;
      }
      if (parsed.ok()) {
        ++stats->instances;
        stats->zero_keys_dropped += parsed.zero_keys;
        if (parsed.unknown_tokens > 0) {
          stats->unknown_slot_tokens += parsed.unknown_tokens;
          auto& names = stats->unknown_slot_names;
          if (names.size() < kMaxUnknownSlotNames &&
              std::find(names.begin(), names.end(), parsed.unknown_name) == names.end()) {
            names.emplace_back(parsed.unknown_name);
          }
        }
        if (block->size() == kSampleInstances && hooks.expected_bytes > reader.bytes()) {
          reserve_for(hooks.expected_bytes, reader.bytes(), block);
        }
        if (hooks.chunk_instances > 0 && block->size() - counted >= hooks.chunk_instances) {
          outcome.status = flush();
          if (!outcome.status.ok()) return false;
        }
        return true;
      }
      reject(parsed.reason, line.number, describe(parsed));
    }
    if (config.strict_parse) {
      outcome.strict_failure = true;
      return false;
    }
    return true;
  };
  for (const Line& line : held) {
    if (!handle(line)) {
      stopped = true;
      break;
    }
  }
  Line line;
  while (!stopped && reader.next(&line)) {
    if (!handle(line)) stopped = true;
  }
  stats->bytes += reader.bytes();
  const Status read_status = reader.status();
  const Status finish_status = reader.finish();
  if (outcome.status.ok()) outcome.status = !read_status.ok() ? read_status : finish_status;
  if (!stopped && outcome.status.ok()) outcome.status = flush();
  if (stopped) stats->positives += positives_of(*block, counted);
  return outcome;
}

StatusOr<std::vector<std::string>> format_sample(const std::string& path,
                                                 std::size_t max_line_bytes) {
  StatusOr<std::unique_ptr<LineReader>> reader = LineReader::open(path, "", max_line_bytes);
  if (!reader.ok()) return reader.status();
  std::vector<std::string> sample;
  Line line;
  while (sample.size() < kFormatSampleLines && (*reader)->next(&line)) {
    if (is_sample_line(line)) sample.emplace_back(line.text);
  }
  (*reader)->finish();
  if (!(*reader)->status().ok()) return (*reader)->status();
  return sample;
}

}  // namespace gpubox::dataset
