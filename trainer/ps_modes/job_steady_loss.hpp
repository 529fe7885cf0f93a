// The PS modes' job-wide SteadyLoss (metric_values.hpp): each trainer's threads' sums, added up
// over every trainer of the job through the servers' dense tables, so that every trainer judges
// the same figure in the epoch loop's divergence check (trainer/schedule/divergence.hpp) and
// all stop alike (the gpubox mode gets the same from its metric buffer's all-reduce).
//
// Beside them, each trainer's lowest and highest bucket of predictions for the dead-output
// check (trainer/schedule/dead_output.hpp): the job's spread is from the lowest of all to the
// highest of all, so two trainers that each predicted one value, but different ones, are alive,
// and the job is dead only when every prediction of every trainer fell in one bucket, or when
// nearly every steady step's neighbouring instances of every trainer were predicted one value
// (the pairs' counts are added up like the sums).
//
// One table (kSteadyLossTable) holds, for the two parities of the pass id, each trainer's
// kSteadyLossFigures figures in slots only it writes: a trainer sets its slots (adding its value
// minus what they hold, so a pass trained again replaces its earlier sums), waits for every
// trainer, then reads and adds up every trainer's slots. A trainer writes the slots of pass P + 2
// only after every trainer has met at pass P + 1, that is after every trainer read pass P's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "trainer/metrics/metric_values.hpp"

namespace gpubox::table::server {
class RemoteHostTier;
}

namespace gpubox::trainer::ps_modes {

// Its size tells its layout (2 * trainers * kSteadyLossFigures floats): a trainer of another
// layout (an older GPUBox) in the same job asks for another size, which the servers refuse
// loudly ("DENSE 'ps_steady_loss' holds N values; the request has M"). A new name would let each
// layout make its own table and read partial figures without a word.
inline constexpr const char* kSteadyLossTable = "ps_steady_loss";
// examples, positives, logloss_sum, the lowest and highest bucket (each as two floats, exact
// up to 2^28 buckets; -1 for none), and the steady steps' neighbour pairs and tied pairs (counts,
// exact in a float up to 2^24 a trainer's pass, their share close past it)
inline constexpr std::size_t kSteadyLossFigures = 9;

// Writes `metrics`' figures (its SteadyLoss and its lowest and highest bucket) into trainer
// `trainer_id`'s slots of pass `pass` in `values` (the table of `trainers`).
void put_steady_figures(const MetricValues& metrics, int trainer_id, int trainers, int64_t pass,
                        std::vector<float>* values);
// The job's figures of pass `pass` in `values`: `metrics`' steady becomes the sum over the
// trainers, and its prediction_buckets the job's spread (0: no prediction, 1: one bucket from
// the lowest to the highest of all, 2: more), its lowest and highest bucket the job's.
void take_steady_figures(const std::vector<float>& values, int trainers, int64_t pass,
                         MetricValues* metrics);

// The table's zeroed values for `trainers` (written once at the job's start by trainer 0).
std::vector<float> steady_loss_table_zeros(int trainers);

// Every trainer calls it at the end of pass `pass` with its own metrics; `meet_all` waits for
// every trainer of the job (a server barrier of the pass). Replaces metrics->steady and
// metrics->prediction_buckets by the job's. Throws naming the servers on a failed request.
void job_steady_loss(table::server::RemoteHostTier& servers, int trainer_id, int trainers,
                     int64_t pass, MetricValues* metrics, const std::function<void()>& meet_all);

}  // namespace gpubox::trainer::ps_modes
