#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform_reduce.h>

#include <cmath>
#include <cuda/atomic>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/exec_policy.cuh"
#include "heterps/device/parallel_for.cuh"
#include "trainer/metrics/metrics.hpp"

namespace gpubox::trainer {
namespace {
constexpr double kClip = 1e-7;

struct Sums {
  double labels = 0;
  double predictions = 0;
  double log_loss = 0;
  double abs_error = 0;
  double squared_error = 0;
};
struct AddSums {
  GPUBOX_HD Sums operator()(const Sums& a, const Sums& b) const {
    return Sums{a.labels + b.labels, a.predictions + b.predictions, a.log_loss + b.log_loss,
                a.abs_error + b.abs_error, a.squared_error + b.squared_error};
  }
};
struct SumsAt {
  const float* predictions;
  const float* labels;
  GPUBOX_HD Sums operator()(int64_t i) const {
    const double p = predictions[i];
    const double y = labels[i];
    double clipped = p < kClip ? kClip : p;  // NaN stays NaN: a NaN prediction shows in logloss
    clipped = clipped > 1.0 - kClip ? 1.0 - kClip : clipped;
    const double err = p - y;
#if GPUBOX_ON_DEVICE
    const double ll = -(y * ::log(clipped) + (1.0 - y) * ::log(1.0 - clipped));
#else
    const double ll = -(y * std::log(clipped) + (1.0 - y) * std::log(1.0 - clipped));
#endif
    return Sums{y, p, ll, err < 0 ? -err : err, err * err};
  }
};
struct AddToHistogram {
  const float* predictions;
  const float* labels;
  double* negatives;  // positives follow at + buckets
  uint64_t buckets;
  GPUBOX_HD void operator()(std::size_t i) const {
    const float p = predictions[i];
    uint64_t b = 0;
    if (p >= 1.0f) {
      b = buckets - 1;
    } else if (p > 0.0f) {  // false for NaN
      b = static_cast<uint64_t>(static_cast<double>(p) * static_cast<double>(buckets));
      if (b >= buckets) b = buckets - 1;
    }
    double* slot = negatives + (labels[i] > 0.5f ? buckets : 0) + b;
    cuda::atomic_ref<double, cuda::thread_scope_device> counter(*slot);
    counter.fetch_add(1.0, cuda::std::memory_order_relaxed);
  }
};
struct AddToSums {
  double* sums;
  double count;
  Sums add;
  GPUBOX_HD void operator()(std::size_t) const {
    sums[metric_sums::kCount] += count;
    sums[metric_sums::kLabels] += add.labels;
    sums[metric_sums::kPredictions] += add.predictions;
    sums[metric_sums::kLogLoss] += add.log_loss;
    sums[metric_sums::kAbsError] += add.abs_error;
    sums[metric_sums::kSquaredError] += add.squared_error;
  }
};
}  // namespace

MetricsAccumulator::MetricsAccumulator(device::Card& card, int buckets_log2)
    : card_(&card), buckets_(std::size_t{1} << buckets_log2) {
  GPUBOX_EXPECTS(buckets_log2 >= 1 && buckets_log2 <= 28,
                 "AUC buckets_log2 must be in [1, 28], got ", buckets_log2);
  flat_ = card.make_buffer<double>(metrics_flat_size(buckets_));
  reset();
}

void MetricsAccumulator::reset() {
  device::memset_bytes_async(flat_.data(), 0, flat_.bytes(), card_->stream());
}

void MetricsAccumulator::add(const float* predictions, const float* labels, int64_t n) {
  GPUBOX_EXPECTS(n >= 0, "negative example count ", n);
  if (n == 0) return;
  const device::Stream& stream = card_->stream();
  device::parallel_for(stream, static_cast<std::size_t>(n),
                       AddToHistogram{predictions, labels, flat_.data(), buckets_});
  const Sums sums = thrust::transform_reduce(
      device::exec_policy(stream), thrust::counting_iterator<int64_t>(0),
      thrust::counting_iterator<int64_t>(n), SumsAt{predictions, labels}, Sums{}, AddSums{});
  device::parallel_for(stream, 1,
                       AddToSums{flat_.data() + 2 * buckets_, static_cast<double>(n), sums});
}

MetricValues MetricsAccumulator::compute() const {
  const std::vector<double> host = device::to_host(flat_);
  return compute_metrics(host.data(), buckets_);
}

}  // namespace gpubox::trainer
