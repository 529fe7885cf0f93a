// Text output of instances (slot and MultiSlot formats) and `gpubox_data convert`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "dataset/dataset_types.hpp"
#include "dataset/instance_block.hpp"

namespace gpubox::dataset {

// Writes instances as lines in `format` (kSlot or kMultiSlot) under a config's slot names,
// label/dense names, token order and MultiSlot field order. Floats are written in their
// shortest exact form, so parsing a line gives the same instance back.
class LineWriter {
 public:
  LineWriter(const DatasetConfig& config, DataFormat format);
  // Appends `instance` as one line ending in '\n'.
  void append(const InstanceRef& instance, std::string* out) const;

 private:
  const DatasetConfig& config_;  // outlives the writer
  DataFormat format_;
  std::vector<int> multislot_fields_;
};

// One line with a writer made for it (for a few lines; a LineWriter for many).
void append_line(const DatasetConfig& config, DataFormat format, const InstanceRef& instance,
                 std::string* out);

struct ConvertSummary {
  LoadStats stats;            // what was read (skipped lines by reason and the first errors)
  std::uint64_t written = 0;  // instances written
};

// Reads `in_path` as `from.data_format` (through from.pipe_command when set) and writes every
// accepted instance to `out_path` in `to`, using `from`'s slot names. The output appears under
// its name only when complete. Malformed input lines are skipped and counted (or, with
// from.strict_parse, fail the conversion); input whose every line is malformed is an error
// (nothing written), as training refuses it, and so is a line rejected for a slot outside
// from.slots (from.ignore_unknown_slots false): the slot list does not fit the file. I/O errors
// name the file.
Status convert_file(const DatasetConfig& from, DataFormat to, const std::string& in_path,
                    const std::string& out_path, ConvertSummary* summary);

}  // namespace gpubox::dataset
