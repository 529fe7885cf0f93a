// Which format an input is in: runner.data_format auto recognises it from the first lines of
// each file (or of a pipe_command's output) by parsing them in every format the config allows
// and keeping the one that accepts the most. When a configured format rejects all of an input's
// first lines, the same machinery says what they look like instead (the hint of the warning:
// "these look like raw Criteo TSV: set runner.data_format: criteo").
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dataset/dataset_types.hpp"
#include "dataset/line_parser.hpp"

namespace gpubox::dataset {

// How many non-blank first lines of an input decide its format.
inline constexpr std::size_t kFormatSampleLines = 16;

// The concrete ways `config` (which passes validate()) reads a line. Under kAuto, in this order
// (the first wins a tie):
// slot text slot:feasign, slot text feasign:slot, MultiSlot in runner.multislot_order (empty:
// PaddleRec's label, sparse slots, dense), MultiSlot label, dense, sparse (GPUBox's writer before
// PaddleRec's order was the default; only when multislot_order is empty), raw Criteo (when the
// config has its 26 slots and 13 dense values) and feat_idx text. Under a named format: that
// format alone.
std::vector<DatasetConfig> format_candidates(const DatasetConfig& config);

// For messages: "slot text (slot:feasign)", "MultiSlot (label, sparse slots, dense)",
// "raw Criteo TSV", "feat_idx text (PaddleRec's LR/FM samples)".
std::string describe_format(const DatasetConfig& concrete);
// The config settings that read `concrete`: "runner.data_format: slot, runner.slot_token_order:
// feasign:slot".
std::string format_setting(const DatasetConfig& concrete);

// What `lines` look like by their syntax alone (tabs and field counts, feat_idx tokens, bare
// numbers, name:value tokens without the label), and what to set: for lines no candidate
// accepts. "" when nothing useful can be said.
std::string describe_shape(const std::vector<std::string>& lines, const DatasetConfig& config);

// When `first_line` (a file's first bytes) starts with a compressed format's magic bytes (gzip,
// zstd, bzip2, xz, lz4, zip): "it is zstd-compressed: decompress it, or read it through
// runner.pipe_command: \"zstd -dc\"", else "". A compressed file is never text: read as text its
// bytes made a few malformed "lines" and the file's instances were lost beside the other files'.
std::string compressed_refusal(std::string_view first_line);

// The parsers of one reader thread: one per candidate format, and the choice between them for
// each input. Not thread-safe.
class FormatChooser {
 public:
  // `config` must pass validate(); its slot index is built here.
  explicit FormatChooser(const DatasetConfig& config);
  // The same sharing `slots`, the index of config.slots (one per load for all reader threads);
  // the caller checked that `config` passes validate().
  FormatChooser(const DatasetConfig& config, std::shared_ptr<const SlotIndex> slots);

  // Chooses the candidate accepting the most of `sample` (an input's first non-blank lines) and
  // describes the choice in *note (file, format, detected, counts). Under a named format that
  // rejects every sampled line, note->hint says what they look like. Returns the candidate's
  // index.
  std::size_t choose(const std::string& file, const std::vector<std::string>& sample,
                     FormatNote* note);
  LineParser& parser(std::size_t candidate) { return *parsers_.at(candidate); }
  std::size_t size() const { return parsers_.size(); }

 private:
  // How many of `sample` the parser accepts.
  std::size_t accepted(LineParser& parser, const std::vector<std::string>& sample);
  std::string hint_for(const std::vector<std::string>& sample);

  DatasetConfig config_;
  std::shared_ptr<const SlotIndex> slots_;
  std::vector<std::unique_ptr<LineParser>> parsers_;
  std::unique_ptr<FormatChooser> alternatives_;  // named format: the auto candidates, for hints
  InstanceBlock scratch_;
};

}  // namespace gpubox::dataset
