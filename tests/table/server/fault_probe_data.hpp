// gpubox_fault_probe's probes of issue #30's data items (fault_probe_data.cpp): save_race,
// big_part, memory_limit, finite_results.
#pragma once

#include <map>
#include <string>

namespace gpubox::table::server {

// Runs `probe` with the command line's `flags` (endpoint, data_dir, pid, token) and sets *line
// to "held: ..." or "failed: ..."; false when `probe` is not one of these.
bool run_data_probe(const std::string& probe, const std::map<std::string, std::string>& flags,
                    std::string* line);

}  // namespace gpubox::table::server
