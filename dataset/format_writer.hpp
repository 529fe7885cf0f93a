// Text output of instances (slot and MultiSlot formats) and `gpubox_data convert`.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.hpp"
#include "dataset/dataset_types.hpp"
#include "dataset/instance_block.hpp"

namespace gpubox::dataset {

// Appends `instance` as one line ending in '\n', in `format` (kSlot or kMultiSlot) under
// `config`'s slot names, label/dense names and token order. Floats are written in their
// shortest exact form, so parsing the line gives the same instance back.
void append_line(const DatasetConfig& config, DataFormat format, const InstanceRef& instance,
                 std::string* out);

struct ConvertSummary {
  LoadStats stats;            // what was read (skipped lines by reason and the first errors)
  std::uint64_t written = 0;  // instances written
};

// Reads `in_path` as `from.data_format` (through from.pipe_command when set) and writes every
// accepted instance to `out_path` in `to`, using `from`'s slot names. The output appears under
// its name only when complete. Malformed input lines are skipped and counted (or, with
// from.strict_parse, fail the conversion); I/O errors name the file.
Status convert_file(const DatasetConfig& from, DataFormat to, const std::string& in_path,
                    const std::string& out_path, ConvertSummary* summary);

}  // namespace gpubox::dataset
