// What a load should tell its user, once per load (a pass, an evaluation, gpubox_data stat):
// the format read (under runner.data_format auto: which one, once for all files or once per file
// when they differ), what a rejected input looks like instead, padding keys and skipped tokens
// of unknown slots, and the malformed lines with the first of them.
#pragma once

#include <string>
#include <vector>

#include "dataset/dataset_types.hpp"

namespace gpubox::dataset {

struct LoadMessages {
  std::vector<std::string> info;      // what was read and how
  std::vector<std::string> warnings;  // what was skipped and what to set instead
};

// At most this many files are named one by one when their formats differ.
inline constexpr std::size_t kMaxFilesNamed = 20;

LoadMessages load_messages(const LoadStats& stats);

// Whether the config's sparse slots held no key at all in the instances parsed from text (some
// were, and the config has slots): the slots' names do not match the data's, and a model would
// train on its dense features alone. load_messages warns; a trainer refuses the load
// (pass_data.cpp).
bool no_key_in_any_slot(const LoadStats& stats);

// "slots A, B, C (3 of the config's N sparse slots)", at most kMaxSlotsNamed named.
inline constexpr std::size_t kMaxSlotsNamed = 10;

}  // namespace gpubox::dataset
