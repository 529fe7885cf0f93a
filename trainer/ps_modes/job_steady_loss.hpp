// The PS modes' job-wide SteadyLoss (metric_values.hpp): each trainer's threads' sums, added up
// over every trainer of the job through the servers' dense tables, so that every trainer judges
// the same figure in the epoch loop's divergence check (trainer/schedule/divergence.hpp) and
// all stop alike (the gpubox mode gets the same from its metric buffer's all-reduce).
//
// Beside them, each trainer's spread of predictions for the dead-output check
// (trainer/schedule/dead_output.hpp): its MetricValues::prediction_buckets capped at 2 (0: no
// prediction, 1: one value for all, 2: more); the job's is the most any trainer saw, so the job
// is judged dead only when every trainer predicted one value for everything.
//
// One table (kSteadyLossTable) holds, for the two parities of the pass id, each trainer's four
// figures in slots only it writes: a trainer sets its slots (adding its value minus what they
// hold, so a pass trained again replaces its earlier sums), waits for every trainer, then reads
// and adds up every trainer's slots. A trainer writes the slots of pass P + 2 only after every
// trainer has met at pass P + 1, that is after every trainer read pass P's.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "trainer/metrics/metric_values.hpp"

namespace gpubox::table::server {
class RemoteHostTier;
}

namespace gpubox::trainer::ps_modes {

inline constexpr const char* kSteadyLossTable = "ps_steady_loss";

// The table's zeroed values for `trainers` (written once at the job's start by trainer 0).
std::vector<float> steady_loss_table_zeros(int trainers);

// Every trainer calls it at the end of pass `pass` with its own metrics; `meet_all` waits for
// every trainer of the job (a server barrier of the pass). Replaces metrics->steady and
// metrics->prediction_buckets by the job's. Throws naming the servers on a failed request.
void job_steady_loss(table::server::RemoteHostTier& servers, int trainer_id, int trainers,
                     int64_t pass, MetricValues* metrics, const std::function<void()>& meet_all);

}  // namespace gpubox::trainer::ps_modes
