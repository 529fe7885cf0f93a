#include "trainer/ps_modes/job_steady_loss.hpp"

#include <algorithm>
#include <cstddef>

#include "common/status.hpp"
#include "table/server/remote_host_tier.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using table::server::DenseAction;

// examples, positives, logloss_sum, prediction_buckets (capped at 2)
constexpr std::size_t kSums = 4;

std::size_t slot_of(int trainers, int64_t pass, int trainer_id) {
  return (static_cast<std::size_t>(pass % 2) * static_cast<std::size_t>(trainers) +
          static_cast<std::size_t>(trainer_id)) *
         kSums;
}

}  // namespace

std::vector<float> steady_loss_table_zeros(int trainers) {
  return std::vector<float>(2 * static_cast<std::size_t>(trainers) * kSums, 0.0f);
}

void job_steady_loss(table::server::RemoteHostTier& servers, int trainer_id, int trainers,
                     int64_t pass, MetricValues* metrics, const std::function<void()>& meet_all) {
  const SteadyLoss& mine = metrics->steady;
  std::vector<float> values = steady_loss_table_zeros(trainers);
  const std::vector<float> zeros = values;
  throw_if_error(servers.dense(DenseAction::kRead, kSteadyLossTable, &values)
                     .with_context("reading the servers' table " + std::string(kSteadyLossTable)));
  const std::size_t at = slot_of(trainers, pass, trainer_id);
  const double own[kSums] = {mine.examples, mine.positives, mine.logloss_sum,
                             std::min(metrics->prediction_buckets, 2.0)};
  std::vector<float> delta = zeros;
  for (std::size_t i = 0; i < kSums; ++i) {
    delta[at + i] = static_cast<float>(own[i] - static_cast<double>(values[at + i]));
  }
  throw_if_error(
      servers.dense(DenseAction::kAdd, kSteadyLossTable, &delta)
          .with_context("adding to the servers' table " + std::string(kSteadyLossTable)));
  meet_all();
  values = zeros;
  throw_if_error(servers.dense(DenseAction::kRead, kSteadyLossTable, &values)
                     .with_context("reading the servers' table " + std::string(kSteadyLossTable)));
  SteadyLoss job;
  double buckets = 0;
  for (int t = 0; t < trainers; ++t) {
    const std::size_t from = slot_of(trainers, pass, t);
    job.examples += values[from];
    job.positives += values[from + 1];
    job.logloss_sum += values[from + 2];
    buckets = std::max(buckets, static_cast<double>(values[from + 3]));
  }
  metrics->steady = job;
  metrics->prediction_buckets = buckets;
}

}  // namespace gpubox::trainer::ps_modes
