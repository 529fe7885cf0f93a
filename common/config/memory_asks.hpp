// What a config asks memory for, by the keys that size it, so that an allocation that fails
// (std::bad_alloc) is reported naming the key whose value sized it rather than as a bare
// "std::bad_alloc" (issue 30 item 9: `fc_sizes: [100000, 100000]`).
//
// The figures are lower bounds computed from the keys alone (the dense layers between hidden
// widths, not the first layer, whose input width depends on the data's slots): a binary prints
// them when an allocation has failed, largest first, so the key that asked for too much is named
// first.
#pragma once

#include <string>
#include <vector>

#include "common/config/config_document.hpp"

namespace gpubox::config {

struct MemoryAsk {
  std::string key;    // "hyper_parameters.fc_sizes"
  std::string value;  // as the config writes it: "[100000, 100000]"
  double bytes = 0;   // at least this much, on each card (dense) or per process (host)
  std::string what;   // "dense weights per card (a 100000 x 100000 layer)"
};

// The keys of `doc` that size large allocations, with what they ask for at least, largest
// first; keys that ask for nothing (a budget of 0 = none) are left out.
std::vector<MemoryAsk> memory_asks(const ConfigDocument& doc);

// "40.0 GB", "12.5 MB": a byte count as the asks write it.
std::string bytes_text(double bytes);

// "out of memory (<what>); what <source> asks for, largest first:\n  <key> = <value>: at least
// 40.0 GB of dense weights per card (...)\n  ...": for a binary to print when an allocation
// failed while it ran `doc`. `what` is the failure (e.what() of the std::bad_alloc).
std::string out_of_memory_text(const ConfigDocument& doc, const std::string& what);

}  // namespace gpubox::config
