#include "dataset/input_reader.hpp"

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

}  // namespace

InputOutcome read_input(LineReader& reader, LineParser& parser, const DatasetConfig& config,
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

  Line line;
  bool stopped = false;
  while (reader.next(&line)) {
    ++stats->lines;
    if (line.issue == ParseReason::kLineTooLong) {
      reject(line.issue, line.number,
             "longer than " + std::to_string(config.max_line_bytes) + " bytes");
    } else if (line.issue == ParseReason::kTruncatedLastLine) {
      reject(line.issue, line.number, "no newline at the end of the file");
    } else {
      const ParseResult parsed = parser.parse(line.text, block);
      if (parsed.blank) {
        ++stats->blank_lines;
        continue;
      }
      if (parsed.ok()) {
        ++stats->instances;
        stats->zero_keys_dropped += parsed.zero_keys;
        if (block->size() == kSampleInstances && hooks.expected_bytes > reader.bytes()) {
          reserve_for(hooks.expected_bytes, reader.bytes(), block);
        }
        if (hooks.chunk_instances > 0 && block->size() - counted >= hooks.chunk_instances) {
          outcome.status = flush();
          if (!outcome.status.ok()) {
            stopped = true;
            break;
          }
        }
        if ((line.number & 0xfff) == 0 && hooks.keep_going && !hooks.keep_going()) {
          stopped = true;
          break;
        }
        continue;
      }
      reject(parsed.reason, line.number, describe(parsed));
    }
    if (config.strict_parse) {
      outcome.strict_failure = true;
      stopped = true;
      break;
    }
  }
  stats->bytes += reader.bytes();
  const Status read_status = reader.status();
  const Status finish_status = reader.finish();
  if (outcome.status.ok()) outcome.status = !read_status.ok() ? read_status : finish_status;
  if (!stopped && outcome.status.ok()) outcome.status = flush();
  if (stopped) stats->positives += positives_of(*block, counted);
  return outcome;
}

}  // namespace gpubox::dataset
