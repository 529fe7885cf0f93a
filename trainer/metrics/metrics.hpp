// Per-card metric accumulation. Each card adds its batches' predictions and labels; at the end of
// a pass the cards all-reduce (sum) the flat buffer, and any card computes the pass metrics from
// it. AUC is bucketed: a histogram of positives and negatives over 2^buckets_log2 equal-width
// prediction buckets (2^20 by default, so ties only merge predictions closer than 1e-6).
//
// In a training step nothing here waits for the card: add() sums on the card (a fixed-order
// reduction, no Thrust readback), and the progress line's running AUC is computed on the card
// and copied into a pinned slot the host reads a few steps later (progress_async). compute()
// (pass end) reads the
// whole buffer back through a pinned copy.
//
// Ownership: owns its buffers (card memory). Thread-safety: one card's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "trainer/metrics/metric_values.hpp"

namespace gpubox::trainer {

class MetricsAccumulator {
 public:
  static constexpr int kDefaultBucketsLog2 = 20;

  explicit MetricsAccumulator(device::Card& card, int buckets_log2 = kDefaultBucketsLog2);

  std::size_t buckets() const { return buckets_; }
  // Adds n (prediction, label) pairs, card memory, ordered on the card stream. Labels are 0/1
  // (anything > 0.5 counts as a positive in the AUC histogram). Predictions outside [0, 1] or
  // NaN are clamped into the end buckets for the AUC. `steady`: a training step past its
  // warm-up, added to MetricValues::steady too (the divergence check's).
  void add(const float* predictions, const float* labels, int64_t n, bool steady = false);
  // Sizes add()'s buffers for batches of up to n (device rule 1: before the step's collectives).
  void reserve(int64_t n);
  // Zeroes everything (start of a pass).
  void reset();

  // Enqueues the running AUC of what this buffer holds (computed on the card from the
  // histogram, in a fixed order) and its copy to `host_parts` (kProgressDoubles, pinned: e.g. a
  // slot of the training step's late readback); progress_auc(host_parts) is the AUC once the
  // copy has completed. For the progress line: it costs no wait of its own.
  static constexpr std::size_t kProgressDoubles = 3;
  void progress_async(double* host_parts);
  static double progress_auc(const double* host_parts);
  // progress_async's reduction only: enqueued, its kProgressDoubles left in card memory (valid
  // until the next call), for a caller that copies them itself (a late readback ring's slot).
  const double* progress_on_card();
  // The same into a pinned word of this accumulator, read by progress_auc() after the caller's
  // next synchronization.
  void progress_async() { progress_async(host_auc_.data()); }
  double progress_auc() const { return progress_auc(host_auc_.data()); }

  // The flat buffer to all-reduce (sum) across cards: metrics_flat_size(buckets()) doubles.
  double* flat() { return flat_.data(); }
  std::size_t flat_size() const { return flat_.size(); }

  // Metrics of what this buffer holds (after the all-reduce: of all cards). Synchronizes.
  MetricValues compute() const;
  // Adds the buffer compute() last read back to `totals` (sized on first use), so that several
  // passes merge exactly: compute_metrics(totals) is the metrics of all of them (an epoch of
  // runner.pass_dirs).
  void accumulate_into(std::vector<double>* totals) const;

 private:
  device::Card* card_;
  std::size_t buckets_;
  device::device_buffer<double> flat_;
  device::device_buffer<double> sums_;               // add()'s reduction partials
  device::device_buffer<double> auc_;                // progress_async's reduction (3 doubles each)
  device::pinned_buffer<double> host_auc_;           // its result: positives, negatives, area
  mutable device::pinned_buffer<double> host_flat_;  // compute()'s readback (made on first use)
};

}  // namespace gpubox::trainer
