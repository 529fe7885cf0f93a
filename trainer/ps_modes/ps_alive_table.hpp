// The layout of PsPeerWatch's heartbeat table (kAliveTable), shared by its two sources
// (ps_peer_watch.cpp: the table's reads and writes; ps_peer_watch_beats.cpp: the beats): per
// trainer a beat count, a finished flag, a failed flag and a begun flag, section by section.
#pragma once

#include <cstddef>
#include <vector>

#include "trainer/ps_modes/ps_peer_watch.hpp"

namespace gpubox::trainer::ps_modes::alive_table {

constexpr std::size_t kBeats = PsPeerWatch::kBeatSection;
constexpr std::size_t kFinished = PsPeerWatch::kFinishedSection;
constexpr std::size_t kFailed = PsPeerWatch::kFailedSection;
constexpr std::size_t kBegun = PsPeerWatch::kBegunSection;
constexpr std::size_t kSections = PsPeerWatch::kAliveSections;
static_assert(kBeats == 0 && kFinished == 1 && kFailed == 2 && kBegun == 3 && kSections == 4);

// The table of `trainers` trainers, zeroed.
inline std::vector<float> zeros(int trainers) {
  return std::vector<float>(kSections * static_cast<std::size_t>(trainers), 0.0f);
}

}  // namespace gpubox::trainer::ps_modes::alive_table
