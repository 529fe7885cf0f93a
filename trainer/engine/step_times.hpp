// The wall times of a pass's steps and the cards' memory high-water mark, for the pass report:
// what the first-GPU-run checklist (scripts/gpu_check.sh) reads to see a slow tail (a pinned
// regrowth, a late module load, a collective that waits) that a mean examples/s hides.
#pragma once

#include <cstddef>
#include <vector>

#include "heterps/device/card.hpp"
#include "trainer/metrics/metric_values.hpp"

namespace gpubox::trainer {

// The q-quantile (0 < q <= 1) of `values` by the nearest rank: the smallest value that at least
// a fraction q of them do not exceed (sorted[ceil(q n) - 1]). 0 for no value. Sorts `values`.
double nearest_rank_quantile(std::vector<double>* values, double q);

// Adds step_ms_p50, step_ms_p99 and step_ms_max (milliseconds) over every card's steps in
// `seconds_per_card` (one wall time per step: the batch, the step, the next pass's chunk of card
// work) to the report. Nothing when there is no step.
void append_step_times(const std::vector<std::vector<double>>& seconds_per_card,
                       PassReport* report);

// Adds card_memory_peak_mb: the most card memory any local card of `cards` held at once through
// the device layer since the run began (CardMemory::peak_bytes; NCCL's and cuBLAS's own
// workspaces and the pool's unused reserve are not in it), in MiB.
void append_card_memory_peak(device::CardSet& cards, PassReport* report);

}  // namespace gpubox::trainer
