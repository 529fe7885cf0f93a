#include "dataset/format_writer.hpp"

#include <filesystem>
#include <fstream>
#include <memory>
#include <system_error>

#include "common/error.hpp"
#include "common/temp_file.hpp"
#include "dataset/format_detect.hpp"
#include "dataset/input_reader.hpp"
#include "dataset/line_parser.hpp"
#include "dataset/line_reader.hpp"
#include "dataset/pipe_command.hpp"
#include "dataset/text_number.hpp"

namespace gpubox::dataset {
namespace {

// `name:value` or `value:name` by config.
void append_token(const DatasetConfig& config, std::string_view name, std::string_view value,
                  std::string* out) {
  out->push_back(' ');
  if (config.feasign_first) {
    out->append(value);
    out->push_back(':');
    out->append(name);
  } else {
    out->append(name);
    out->push_back(':');
    out->append(value);
  }
}

}  // namespace

LineWriter::LineWriter(const DatasetConfig& config, DataFormat format)
    : config_(config), format_(format) {
  GPUBOX_EXPECTS(format == DataFormat::kSlot || format == DataFormat::kMultiSlot,
                 "cannot write format ", name_of(kDataFormatNames, format));
  if (format == DataFormat::kMultiSlot) {
    multislot_fields_ = multislot_fields(config, SlotIndex(config.slots));
  }
}

void append_line(const DatasetConfig& config, DataFormat format, const InstanceRef& instance,
                 std::string* out) {
  LineWriter(config, format).append(instance, out);
}

void LineWriter::append(const InstanceRef& instance, std::string* out) const {
  const DatasetConfig& config = config_;
  GPUBOX_EXPECTS(instance.num_slots == static_cast<int>(config.slots.size()), "instance has ",
                 instance.num_slots, " slots, config ", config.slots.size());
  const std::size_t line_start = out->size();
  char number[32];
  auto float_text = [&](float v) {
    const auto [end, ec] = std::to_chars(number, number + sizeof(number), v);
    return std::string_view(number, static_cast<std::size_t>(end - number));
  };
  auto u64_text = [&](std::uint64_t v) {
    const auto [end, ec] = std::to_chars(number, number + sizeof(number), v);
    return std::string_view(number, static_cast<std::size_t>(end - number));
  };
  const std::string_view label = instance.label > 0.5f ? "1" : "0";
  if (format_ == DataFormat::kSlot) {
    append_token(config, config.label_name, label, out);
    for (int d = 0; d < instance.dense_dim; ++d) {
      append_token(config, config.dense_name, float_text(instance.dense[d]), out);
    }
    const std::uint64_t* key = instance.keys;
    for (int s = 0; s < instance.num_slots; ++s) {
      for (std::uint32_t k = 0; k < instance.slot_sizes[s]; ++k, ++key) {
        append_token(config, config.slots[s], u64_text(*key), out);
      }
    }
  } else {
    // Fields in the order LineParser reads them; a skipped field is written empty.
    std::vector<std::uint64_t> slot_begin(static_cast<std::size_t>(instance.num_slots) + 1, 0);
    for (int s = 0; s < instance.num_slots; ++s) {
      slot_begin[s + 1] = slot_begin[s] + instance.slot_sizes[s];
    }
    for (const int field : multislot_fields_) {
      out->push_back(' ');
      if (field == kMultiSlotLabel) {
        out->append("1 ");
        out->append(label);
      } else if (field == kMultiSlotDense) {
        append_u64(out, static_cast<std::uint64_t>(instance.dense_dim));
        for (int d = 0; d < instance.dense_dim; ++d) {
          out->push_back(' ');
          append_float(out, instance.dense[d]);
        }
      } else if (field == kMultiSlotSkipped || instance.slot_sizes[field] == 0) {
        // An empty slot as Paddle's MultiSlot readers take it: one padding key, 0 (a count of 0
        // is refused there, "the number of ids can not be zero"; LineParser skips key 0).
        out->append("1 0");
      } else {
        append_u64(out, instance.slot_sizes[field]);
        for (std::uint64_t k = slot_begin[field]; k < slot_begin[field + 1]; ++k) {
          out->push_back(' ');
          append_u64(out, instance.keys[k]);
        }
      }
    }
  }
  // Every token above was written with a leading blank; drop the line's first one.
  out->erase(line_start, 1);
  out->push_back('\n');
}

namespace {

// A gzip stream of nothing: Spark's and Hadoop's empty compressed part files (their trailer's
// ISIZE, the uncompressed length mod 2^32, is 0).
bool is_empty_gzip(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char magic[2] = {0, 0};
  unsigned char size[4] = {1, 1, 1, 1};
  in.read(reinterpret_cast<char*>(magic), 2);
  if (!in || magic[0] != 0x1f || magic[1] != 0x8b) return false;
  in.seekg(-4, std::ios::end);
  in.read(reinterpret_cast<char*>(size), 4);
  return in && (size[0] | size[1] | size[2] | size[3]) == 0;
}

// What the read of `in_path` must have given for its conversion to be written: every slot among
// those converted, an instance where there were lines, a line where the input was not empty.
Status check_converted(const DatasetConfig& from, const std::string& in_path,
                       const std::string& out_path, const ConvertSummary& summary) {
  // Slots outside the slot list, not to be dropped: the list is wrong for this file, and the
  // lines holding them would be left out of the output. Nothing is written.
  const std::uint64_t unknown_slot_lines =
      summary.stats.skipped_by_reason[static_cast<std::size_t>(ParseReason::kUnknownSlot)];
  if (unknown_slot_lines > 0) {
    std::string first;
    for (const ParseErrorRecord& e : summary.stats.errors) {
      if (e.reason == ParseReason::kUnknownSlot) {
        first = " (first: " + e.to_string() + ")";
        break;
      }
    }
    return Status::InvalidArgument(
        in_path + ": " + std::to_string(unknown_slot_lines) + " lines hold slots outside the " +
        std::to_string(from.slots.size()) + " slots converted" + first +
        ": give every slot of the file (--slots or the config's), "
        "or drop the others (--drop_unknown_slots, runner.ignore_unknown_slots: true); '" +
        out_path + "' not written");
  }
  // Lines but no instance: an empty output would pass for a conversion. An empty input converts
  // to an empty output (Spark's and Hadoop's empty part files; the caller says so).
  if (summary.written == 0 && summary.stats.lines > 0) {
    return Status::InvalidArgument(in_path + ": no valid instance (" +
                                   std::to_string(summary.stats.lines) + " lines, " +
                                   std::to_string(summary.stats.skipped_lines()) +
                                   " malformed): '" + out_path + "' not written");
  }
  // No lines from an input that is not empty: its pipe_command gave none (a filter that drops
  // every line, a command that failed quietly), not an empty part file, unless the input is a
  // compressed empty one.
  std::error_code ec;
  const auto in_bytes = std::filesystem::file_size(in_path, ec);
  if (summary.stats.lines == 0 && !ec && in_bytes > 0 && !is_empty_gzip(in_path)) {
    return Status::InvalidArgument(
        in_path + " (" + std::to_string(in_bytes) + " bytes): no line came from it" +
        (from.pipe_command.empty() ? std::string()
                                   : " through its pipe_command '" + from.pipe_command + "'") +
        ": '" + out_path + "' not written");
  }
  return Status::OK();
}

}  // namespace

Status convert_file(const DatasetConfig& from, DataFormat to, const std::string& in_path,
                    const std::string& out_path, ConvertSummary* summary) {
  if (to != DataFormat::kSlot && to != DataFormat::kMultiSlot) {
    return Status::InvalidArgument(std::string("cannot convert to ") +
                                   name_of(kDataFormatNames, to) + " (slot or multislot)");
  }
  GPUBOX_RETURN_IF_ERROR(validate(from));
  std::error_code ec;
  if (std::filesystem::equivalent(in_path, out_path, ec) && !ec) {
    // Written over in place, the input would lose the lines skipped (and any a reader did not
    // take) with no copy left to correct them from.
    return Status::InvalidArgument("convert: OUT '" + out_path + "' is IN '" + in_path +
                                   "': write the converted file elsewhere");
  }
  *summary = ConvertSummary{};
  StatusOr<std::unique_ptr<LineReader>> reader =
      LineReader::open(in_path, pipe_command_line(from), from.max_line_bytes);
  if (!reader.ok()) return reader.status();

  // Beside OUT under a name of its own (another convert to OUT writes its own), renamed over it
  // at the end; a device or FIFO is written where it is (ReplacedFile).
  ReplacedFile out;
  GPUBOX_RETURN_IF_ERROR(out.open(out_path));
  FormatChooser formats(from);
  const LineWriter writer(from, to);
  InstanceBlock block(static_cast<int>(from.slots.size()), from.dense_dim);
  std::string text;
  InputHooks hooks;
  hooks.chunk_instances = 4096;
  hooks.on_chunk = [&](InstanceBlock* chunk) -> Status {
    text.clear();
    for (std::size_t i = 0; i < chunk->size(); ++i) writer.append(chunk->instance(i), &text);
    summary->written += chunk->size();
    chunk->clear();
    return out.write(text.data(), text.size());
  };
  const InputOutcome outcome =
      read_input(**reader, formats, from, in_path, &block, &summary->stats, hooks);
  summary->stats.files = 1;
  Status status =
      from.pipe_command.empty() ? outcome.status : explain_pipe_failure(outcome.status, from);
  if (status.ok() && outcome.strict_failure) {
    status = Status::Corruption(summary->stats.errors.back().to_string() + " (" +
                                from.strict_parse_reason + ")");
  }
  if (status.ok()) status = check_converted(from, in_path, out_path, *summary);
  if (status.ok()) status = out.commit();
  return status;
}

}  // namespace gpubox::dataset
