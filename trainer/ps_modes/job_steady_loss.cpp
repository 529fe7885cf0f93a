#include "trainer/ps_modes/job_steady_loss.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "common/status.hpp"
#include "table/server/remote_host_tier.hpp"

namespace gpubox::trainer::ps_modes {
namespace {

using table::server::DenseAction;

constexpr std::size_t kSums = kSteadyLossFigures;
constexpr double kHalf = 16384;  // a bucket index as hi * kHalf + lo, each exact in a float

std::size_t slot_of(int trainers, int64_t pass, int trainer_id) {
  return (static_cast<std::size_t>(pass % 2) * static_cast<std::size_t>(trainers) +
          static_cast<std::size_t>(trainer_id)) *
         kSums;
}

void put_bucket(double bucket, float* at) {
  const double b = bucket < 0 ? -1 : bucket;
  at[0] = static_cast<float>(b < 0 ? -1 : std::floor(b / kHalf));
  at[1] = static_cast<float>(b < 0 ? 0 : b - std::floor(b / kHalf) * kHalf);
}

double bucket_at(const float* at) {
  return at[0] < 0 ? -1 : static_cast<double>(at[0]) * kHalf + static_cast<double>(at[1]);
}

}  // namespace

std::vector<float> steady_loss_table_zeros(int trainers) {
  return std::vector<float>(2 * static_cast<std::size_t>(trainers) * kSums, 0.0f);
}

void put_steady_figures(const MetricValues& metrics, int trainer_id, int trainers, int64_t pass,
                        std::vector<float>* values) {
  float* at = values->data() + slot_of(trainers, pass, trainer_id);
  at[0] = static_cast<float>(metrics.steady.examples);
  at[1] = static_cast<float>(metrics.steady.positives);
  at[2] = static_cast<float>(metrics.steady.logloss_sum);
  const bool any = metrics.prediction_buckets > 0;
  put_bucket(any ? metrics.lowest_bucket : -1, at + 3);
  put_bucket(any ? metrics.highest_bucket : -1, at + 5);
  at[7] = static_cast<float>(metrics.steady.pairs);
  at[8] = static_cast<float>(metrics.steady.tied_pairs);
}

void take_steady_figures(const std::vector<float>& values, int trainers, int64_t pass,
                         MetricValues* metrics) {
  SteadyLoss job;
  double lowest = -1, highest = -1;
  for (int t = 0; t < trainers; ++t) {
    const float* at = values.data() + slot_of(trainers, pass, t);
    job.examples += at[0];
    job.positives += at[1];
    job.logloss_sum += at[2];
    job.pairs += at[7];
    job.tied_pairs += at[8];
    const double low = bucket_at(at + 3), high = bucket_at(at + 5);
    if (low < 0 || high < 0) continue;  // no prediction
    lowest = lowest < 0 ? low : std::min(lowest, low);
    highest = std::max(highest, high);
  }
  metrics->steady = job;
  metrics->lowest_bucket = lowest;
  metrics->highest_bucket = highest;
  metrics->prediction_buckets = lowest < 0 ? 0 : (lowest == highest ? 1 : 2);
}

void job_steady_loss(table::server::RemoteHostTier& servers, int trainer_id, int trainers,
                     int64_t pass, MetricValues* metrics, const std::function<void()>& meet_all) {
  std::vector<float> values = steady_loss_table_zeros(trainers);
  const std::vector<float> zeros = values;
  throw_if_error(servers.dense(DenseAction::kRead, kSteadyLossTable, &values)
                     .with_context("reading the servers' table " + std::string(kSteadyLossTable)));
  std::vector<float> mine = zeros;
  put_steady_figures(*metrics, trainer_id, trainers, pass, &mine);
  std::vector<float> delta = zeros;
  const std::size_t at = slot_of(trainers, pass, trainer_id);
  for (std::size_t i = at; i < at + kSums; ++i) delta[i] = mine[i] - values[i];
  throw_if_error(
      servers.dense(DenseAction::kAdd, kSteadyLossTable, &delta)
          .with_context("adding to the servers' table " + std::string(kSteadyLossTable)));
  meet_all();
  values = zeros;
  throw_if_error(servers.dense(DenseAction::kRead, kSteadyLossTable, &values)
                     .with_context("reading the servers' table " + std::string(kSteadyLossTable)));
  take_steady_figures(values, trainers, pass, metrics);
}

}  // namespace gpubox::trainer::ps_modes
