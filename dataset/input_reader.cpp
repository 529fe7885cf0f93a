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

// One read_input call: its state and the steps of its loop.
class InputRun {
 public:
  InputRun(LineReader& reader, const DatasetConfig& config, const std::string& path,
           InstanceBlock* block, LoadStats* stats, const InputHooks& hooks)
      : reader_(reader),
        config_(config),
        path_(path),
        block_(block),
        stats_(stats),
        hooks_(hooks),
        counted_(block->size()) {}

  // The format's parser: given (hooks.candidate), or chosen from the first non-blank lines, which
  // are kept (copied: `*held` views `*held_text`) until the choice is made, to be parsed like the
  // rest.
  LineParser& choose_parser(FormatChooser& formats, std::vector<Line>* held,
                            std::vector<std::string>* held_text) {
    std::size_t candidate = 0;
    if (hooks_.candidate >= 0) {
      candidate = static_cast<std::size_t>(hooks_.candidate);
      if (hooks_.note != nullptr) stats_->formats.push_back(*hooks_.note);
      return formats.parser(candidate);
    }
    std::vector<std::string> sample;
    Line line;
    while (sample.size() < kFormatSampleLines && reader_.next(&line)) {
      held->push_back(line);
      held_text->emplace_back(line.text);
      if (is_sample_line(line)) sample.emplace_back(line.text);
    }
    for (std::size_t i = 0; i < held->size(); ++i) (*held)[i].text = (*held_text)[i];
    FormatNote note;
    candidate = formats.choose(path_, sample, &note);
    stats_->formats.push_back(std::move(note));
    return formats.parser(candidate);
  }

  // Parses one line; false stops reading (strict_parse, on_chunk's error, keep_going, a
  // compressed file).
  bool handle(LineParser& parser, const Line& line) {
    ++stats_->lines;
    // A compressed file read as text: its bytes would be counted as a few malformed lines and
    // the file's instances lost beside the other files' (compressed_refusal).
    if (line.number == 1) {
      const std::string compressed = compressed_refusal(line.text);
      if (!compressed.empty()) {
        outcome_.status = Status::InvalidArgument(path_ + ": " + compressed);
        return false;
      }
    }
    // Every 4096 lines, whatever they hold (blank or rejected lines too).
    if ((line.number & 0xfff) == 0 && hooks_.keep_going && !hooks_.keep_going()) return false;
    // Lines ended by CR alone (old Mac files) read as one line (its last CR taken as a CRLF's):
    // the whole file, which counted as one malformed line (under any max_malformed_share) and
    // was lost without a word.
    const auto crs = line.number == 1 && line.issue != ParseReason::kOk
                         ? std::count(line.text.begin(), line.text.end(), '\r')
                         : 0;
    if (crs > 0) {
      outcome_.status = Status::InvalidArgument(
          path_ + ": no newline in the whole file, whose " + std::to_string(crs + 1) +
          " lines end in CR alone: convert them (tr '\\r' '\\n')");
      return false;
    }
    if (line.issue == ParseReason::kLineTooLong) {
      reject(line.issue, line.number,
             "longer than " + std::to_string(config_.max_line_bytes) + " bytes");
    } else if (line.issue == ParseReason::kTruncatedLastLine) {
      reject(line.issue, line.number, "no newline at the end of the file");
    } else {
      const ParseResult parsed = parser.parse(line.text, block_);
      if (parsed.blank || parsed.ok()) good_bytes_ += line.consumed;
      if (parsed.blank) {
        ++stats_->blank_lines;
        if (!config_.strict_parse || !config_.blank_lines_fail) return true;
        stats_->errors.push_back(ParseErrorRecord{path_, line.number, ParseReason::kOk, ""});
        outcome_.strict_failure = true;
        return false;
      }
      if (parsed.ok()) return accept(parsed);
      reject(parsed.reason, line.number, describe(parsed));
    }
    if (config_.strict_parse) {
      outcome_.strict_failure = true;
      return false;
    }
    return true;
  }

  // After the last line (`stopped`: a line stopped the reading): the reader's status and the
  // last chunk.
  InputOutcome finish(bool stopped) {
    stats_->bytes += reader_.bytes();
    stats_->skipped_bytes += reader_.bytes() - std::min(good_bytes_, reader_.bytes());
    const Status read_status = reader_.status();
    const Status finish_status = reader_.finish();
    if (outcome_.status.ok()) outcome_.status = !read_status.ok() ? read_status : finish_status;
    if (!stopped && outcome_.status.ok()) outcome_.status = flush();
    if (stopped) count_from(counted_);
    return outcome_;
  }

 private:
  void reject(ParseReason reason, std::uint64_t line, std::string detail) {
    ++stats_->skipped_by_reason[static_cast<std::size_t>(reason)];
    // Under strict_parse the failing line is always recorded: it becomes the error message.
    if (stats_->errors.size() < config_.max_reported_errors || config_.strict_parse) {
      stats_->errors.push_back(ParseErrorRecord{path_, line, reason, std::move(detail)});
    }
  }

  // An instance parsed into the block: counted, and a chunk handed on when one is full.
  bool accept(const ParseResult& parsed) {
    ++stats_->instances;
    stats_->zero_keys_dropped += parsed.zero_keys;
    if (parsed.unknown_tokens > 0) {
      stats_->unknown_slot_tokens += parsed.unknown_tokens;
      auto& names = stats_->unknown_slot_names;
      for (std::uint32_t k = 0; k < parsed.unknown_name_count; ++k) {
        const std::string_view name = parsed.unknown_names[k];
        if (names.size() == kMaxUnknownSlotNames) break;
        if (std::find(names.begin(), names.end(), name) == names.end()) names.emplace_back(name);
      }
    }
    if (block_->size() == kSampleInstances && hooks_.expected_bytes > reader_.bytes()) {
      reserve_for(hooks_.expected_bytes, reader_.bytes(), block_);
    }
    if (hooks_.chunk_instances > 0 && block_->size() - counted_ >= hooks_.chunk_instances) {
      outcome_.status = flush();
      if (!outcome_.status.ok()) return false;
    }
    return true;
  }

  static std::uint64_t positives_of(const InstanceBlock& b, std::size_t from) {
    std::uint64_t n = 0;
    for (std::size_t i = from; i < b.size(); ++i) n += b.labels[i] > 0.5f ? 1 : 0;
    return n;
  }

  // The positives and each slot's keys of the block's instances from `from` on.
  void count_from(std::size_t from) {
    const InstanceBlock& b = *block_;
    stats_->positives += positives_of(b, from);
    const auto slots = static_cast<std::size_t>(b.num_slots);
    if (stats_->slot_keys.size() < slots) stats_->slot_keys.resize(slots, 0);
    if (stats_->slot_names.empty()) stats_->slot_names = config_.slots;
    for (std::size_t i = from; i < b.size(); ++i) {
      const std::uint32_t* sizes = b.slot_sizes.data() + i * slots;
      for (std::size_t s = 0; s < slots; ++s) stats_->slot_keys[s] += sizes[s];
    }
    stats_->slot_counted_instances += b.size() - from;
  }

  Status flush() {
    count_from(counted_);
    counted_ = block_->size();
    if (!hooks_.on_chunk) return Status::OK();
    Status st = hooks_.on_chunk(block_);
    counted_ = block_->size();
    return st;
  }

  LineReader& reader_;
  const DatasetConfig& config_;
  const std::string& path_;
  InstanceBlock* block_;
  LoadStats* stats_;
  const InputHooks& hooks_;
  InputOutcome outcome_;
  std::size_t counted_;  // instances whose labels are already in positives
  // Input bytes of the lines that parsed (instances and blank lines): the rest were skipped.
  std::uint64_t good_bytes_ = 0;
};

}  // namespace

InputOutcome read_input(LineReader& reader, FormatChooser& formats, const DatasetConfig& config,
                        const std::string& path, InstanceBlock* block, LoadStats* stats,
                        const InputHooks& hooks) {
  InputRun run(reader, config, path, block, stats, hooks);
  std::vector<Line> held;
  std::vector<std::string> held_text;
  LineParser& parser = run.choose_parser(formats, &held, &held_text);
  bool stopped = false;
  for (const Line& line : held) {
    if (!run.handle(parser, line)) {
      stopped = true;
      break;
    }
  }
  Line line;
  while (!stopped && reader.next(&line)) {
    if (!run.handle(parser, line)) stopped = true;
  }
  return run.finish(stopped);
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
