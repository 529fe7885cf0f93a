#include <cmath>
#include <cuda/atomic>
#include <limits>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/parallel_for.cuh"
#include "heterps/device/reduce.cuh"
#include "trainer/metrics/metrics.hpp"

namespace gpubox::trainer {
namespace {
constexpr double kClip = kLoglossClip;

struct Sums {
  double labels = 0;
  double predictions = 0;
  double log_loss = 0;
  double abs_error = 0;
  double squared_error = 0;
  double ties = 0;  // instances i whose prediction is within a bucket of instance i + 1's
};
struct AddSums {
  GPUBOX_HD Sums operator()(const Sums& a, const Sums& b) const {
    return Sums{
        a.labels + b.labels,       a.predictions + b.predictions,     a.log_loss + b.log_loss,
        a.abs_error + b.abs_error, a.squared_error + b.squared_error, a.ties + b.ties};
  }
};
struct SumsAt {
  const float* predictions;
  const float* labels;
  int64_t n;
  double bucket_width;
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
    // Neighbours in the batch that the network told apart by less than one bucket (a NaN is
    // never tied): a dead network gives nearly every instance of a step one value.
    double tie = 0;
    if (i + 1 < n) {
      const double gap = static_cast<double>(predictions[i + 1]) - p;
      tie = (gap < 0 ? -gap : gap) < bucket_width ? 1 : 0;
    }
    return Sums{y, p, ll, err < 0 ? -err : err, err * err, tie};
  }
};
// Examples per histogram work item, and how many (bucket, count) runs it holds before adding
// them to the histogram. A GPU work item is a thread that reads its examples one after another:
// 64 left 8 threads for a batch of 512, and the kernel was the step's slowest on the H200 (75 us
// a step, ncu's node profile, 2026-12-04: latency, not work); 4 give every 4 examples a thread
// and still cut a collapsed model's atomic adds to one slot fourfold. A cpu work item is an
// OpenMP iteration, which 64 examples keep above its overhead. Counts are whole numbers, so the
// histogram is the same bits either way.
#if defined(GPUBOX_BACKEND_CUDA)
constexpr std::size_t kHistogramChunk = 4;
#else
constexpr std::size_t kHistogramChunk = 64;
#endif
constexpr int kPendingBuckets = 4;

// One work item per kHistogramChunk examples (interleaved: item t takes t, t + items, ..., so
// neighbouring items read neighbouring examples). It counts its examples per histogram slot in a
// few registers and adds each count once: when predictions pile up in a few buckets (a new or
// collapsed model predicts one value for everything), one slot receives one atomic add per item
// instead of one per example. Counts are integers, so the result does not depend on the order.
struct AddToHistogram {
  const float* predictions;
  const float* labels;
  double* negatives;  // positives follow at + buckets
  uint64_t buckets;
  std::size_t n;
  std::size_t items;

  GPUBOX_HD uint64_t slot_of(std::size_t i) const {
    const float p = predictions[i];
    uint64_t b = 0;
    if (p >= 1.0f) {
      b = buckets - 1;
    } else if (p > 0.0f) {  // false for NaN
      b = static_cast<uint64_t>(static_cast<double>(p) * static_cast<double>(buckets));
      if (b >= buckets) b = buckets - 1;
    }
    return (labels[i] > 0.5f ? buckets : 0) + b;
  }
  GPUBOX_HD void add(uint64_t slot, double count) const {
    cuda::atomic_ref<double, cuda::thread_scope_device>(negatives[slot])
        .fetch_add(count, cuda::std::memory_order_relaxed);
  }
  GPUBOX_HD void operator()(std::size_t item) const {
    uint64_t slot[kPendingBuckets];
    double count[kPendingBuckets];
    int held = 0;
    int next_out = 0;
    for (std::size_t i = item; i < n; i += items) {
      const uint64_t s = slot_of(i);
      int k = 0;
      while (k < held && slot[k] != s) ++k;
      if (k < held) {
        count[k] += 1.0;
        continue;
      }
      if (held == kPendingBuckets) {  // full: hand the oldest run over
        k = next_out;
        next_out = (next_out + 1) % kPendingBuckets;
        add(slot[k], count[k]);
      } else {
        k = held++;
      }
      slot[k] = s;
      count[k] = 1.0;
    }
    for (int k = 0; k < held; ++k) add(slot[k], count[k]);
  }
};
// The batch's sums, folded on the card, added to the accumulator's by the thread that holds them
// (reduce_into_then: no kernel of its own). Each accumulator field gets one add per batch, in
// batch order, as before: the same bits. A steady batch of n instances adds its n - 1 neighbour
// pairs and those of them tied.
struct AddToSums {
  double* sums;
  double count;
  bool steady;
  GPUBOX_HD void operator()(const Sums& add) const {
    if (steady) {
      sums[metric_sums::kSteadyCount] += count;
      sums[metric_sums::kSteadyLabels] += add.labels;
      sums[metric_sums::kSteadyLogLoss] += add.log_loss;
      sums[metric_sums::kSteadyPairs] += count - 1;
      sums[metric_sums::kSteadyTiedPairs] += add.ties;
    }
    sums[metric_sums::kCount] += count;
    sums[metric_sums::kLabels] += add.labels;
    sums[metric_sums::kPredictions] += add.predictions;
    sums[metric_sums::kLogLoss] += add.log_loss;
    sums[metric_sums::kAbsError] += add.abs_error;
    sums[metric_sums::kSquaredError] += add.squared_error;
  }
};
constexpr std::size_t kSumsDoubles = sizeof(Sums) / sizeof(double);
static_assert(sizeof(Sums) == 6 * sizeof(double), "Sums is stored as doubles");

// The running AUC as a fold over the buckets from the highest prediction down (as
// compute_metrics sweeps them): a part of consecutive buckets knows its positives, negatives and
// the area its own pairs contribute; a higher part `a` followed by a lower part `b` adds every
// (negative in b, positive in a) pair, which is ordered correctly.
struct AucPart {
  double positives = 0;
  double negatives = 0;
  double area = 0;
};
constexpr std::size_t kAucDoubles = sizeof(AucPart) / sizeof(double);
static_assert(sizeof(AucPart) == 3 * sizeof(double), "AucPart is stored as doubles");
struct BucketFromTop {
  const double* negatives;
  const double* positives;
  uint64_t buckets;
  GPUBOX_HD AucPart operator()(std::size_t i) const {
    const uint64_t b = buckets - 1 - i;
    const double p = positives[b];
    const double q = negatives[b];
    return AucPart{p, q, q * p * 0.5};  // ties inside a bucket count one half
  }
};
struct CombineFromTop {
  GPUBOX_HD AucPart operator()(const AucPart& higher, const AucPart& lower) const {
    return AucPart{higher.positives + lower.positives, higher.negatives + lower.negatives,
                   higher.area + lower.area + lower.negatives * higher.positives};
  }
};
}  // namespace

MetricsAccumulator::MetricsAccumulator(device::Card& card, int buckets_log2)
    : card_(&card), buckets_(std::size_t{1} << buckets_log2) {
  GPUBOX_EXPECTS(buckets_log2 >= 1 && buckets_log2 <= 28,
                 "AUC buckets_log2 must be in [1, 28], got ", buckets_log2);
  flat_ = card.make_buffer<double>(metrics_flat_size(buckets_));
  sums_ = card.make_buffer<double>(kSumsDoubles);
  auc_ = card.make_buffer<double>(kAucDoubles * (1 + device::reduce_partials(buckets_)));
  host_auc_ = device::pinned_buffer<double>(kAucDoubles);
  for (std::size_t i = 0; i < kAucDoubles; ++i) host_auc_[i] = 0.0;
  reset();
}

void MetricsAccumulator::reserve(int64_t n) {
  GPUBOX_EXPECTS(n >= 0, "negative example count ", n);
  sums_.resize_discard(kSumsDoubles * device::reduce_partials(static_cast<std::size_t>(n)));
}

void MetricsAccumulator::reset() {
  device::memset_bytes_async(flat_.data(), 0, flat_.bytes(), card_->stream());
}

void MetricsAccumulator::add(const float* predictions, const float* labels, int64_t n,
                             bool steady) {
  GPUBOX_EXPECTS(n >= 0, "negative example count ", n);
  if (n == 0) return;
  const device::Stream& stream = card_->stream();
  const auto count = static_cast<std::size_t>(n);
  const std::size_t items = (count + kHistogramChunk - 1) / kHistogramChunk;
  device::parallel_for(stream, items,
                       AddToHistogram{predictions, labels, flat_.data(), buckets_, count, items});
  // The batch's sums folded on the card (the reduction's partials in sums_) and added in by the
  // fold's last thread: no readback, no allocation once reserve(n) ran.
  sums_.resize_discard(kSumsDoubles * device::reduce_partials(count));
  const double bucket_width = 1.0 / static_cast<double>(buckets_);
  device::reduce_into_then(stream, count, SumsAt{predictions, labels, n, bucket_width}, AddSums{},
                           Sums{}, reinterpret_cast<Sums*>(sums_.data()),
                           AddToSums{flat_.data() + 2 * buckets_, static_cast<double>(n), steady});
}

static_assert(MetricsAccumulator::kProgressDoubles == kAucDoubles, "the progress parts");

const double* MetricsAccumulator::progress_on_card() {
  AucPart* parts = reinterpret_cast<AucPart*>(auc_.data());
  device::reduce_into(card_->stream(), buckets_,
                      BucketFromTop{flat_.data(), flat_.data() + buckets_, buckets_},
                      CombineFromTop{}, AucPart{}, parts + 1, parts);
  return auc_.data();
}

void MetricsAccumulator::progress_async(double* host_parts) {
  const double* parts = progress_on_card();
  device::copy_async(host_parts, parts, kAucDoubles, card_->stream());
}

double MetricsAccumulator::progress_auc(const double* host_parts) {
  const double positives = host_parts[0];
  const double negatives = host_parts[1];
  return positives > 0 && negatives > 0 ? host_parts[2] / (positives * negatives)
                                        : std::numeric_limits<double>::quiet_NaN();
}

MetricValues MetricsAccumulator::compute() const {
  // Pass end: the whole buffer (16 MiB at 2^20 buckets) through a pinned copy (device rule 2);
  // the pinned block is made once.
  if (host_flat_.size() < flat_.size()) host_flat_ = device::pinned_buffer<double>(flat_.size());
  device::copy_async(host_flat_.data(), flat_.data(), flat_.size(), card_->stream());
  card_->stream().synchronize();
  return compute_metrics(host_flat_.data(), buckets_);
}

void MetricsAccumulator::accumulate_into(std::vector<double>* totals) const {
  GPUBOX_EXPECTS(host_flat_.size() >= flat_.size(), "accumulate_into before compute()");
  if (totals->empty()) totals->assign(flat_.size(), 0.0);
  GPUBOX_EXPECTS(totals->size() == flat_.size(), "accumulate_into: ", totals->size(),
                 " totals for a buffer of ", flat_.size());
  for (std::size_t i = 0; i < flat_.size(); ++i) (*totals)[i] += host_flat_[i];
}

}  // namespace gpubox::trainer
