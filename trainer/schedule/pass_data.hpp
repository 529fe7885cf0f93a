// What every schedule says of the data it read: the load's messages, and the one error for data
// that holds no valid instance (a pass, an evaluation, in every mode and for both readers), so
// a run never trains on nothing, saves it and exits 0.
//
// Host-only, no state.
#pragma once

#include <string>
#include <vector>

#include "dataset/dataset_types.hpp"

namespace gpubox::trainer {

// Logs what the load of `files` tells its user (load_report.hpp), prefixed with `what` ("pass 3",
// "evaluation data"); throws when it read no valid instance, naming `what`, the files (the first
// ten), the lines read and why they were skipped, with counts.
void report_read(const dataset::LoadStats& stats, const std::vector<std::string>& files,
                 const std::string& what);

}  // namespace gpubox::trainer
