// Pass metrics as plain data, their computation from a merged accumulator buffer, and the pass
// line / JSON formatters. Host-only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.hpp"

namespace gpubox::trainer {

// Logloss clips each prediction to [kLoglossClip, 1 - kLoglossClip]: one instance costs at most
// -log(kLoglossClip), about 16.12 (the divergence check's noise bound rests on it).
inline constexpr double kLoglossClip = 1e-7;

// A pass's training loss over its steady steps (every step of a card or training thread after
// its first steady_after() steps), as sums so that trainers can add them up: what the
// divergence check (epoch_loop.cpp) compares with the constant predictor.
struct SteadyLoss {
  double examples = 0;
  double positives = 0;
  double logloss_sum = 0;  // predictions clipped as MetricValues::logloss's
  // The steady steps' pairs of neighbouring instances (n - 1 in a step of n), and those of them
  // whose predictions were the same to within one AUC bucket: a dead network gives nearly every
  // instance of a step one value, which its output bias may move from step to step (the
  // dead-output check, dead_output.hpp).
  double pairs = 0;
  double tied_pairs = 0;
  // The mean logloss over the best constant predictor's on the same instances (the entropy of
  // their CTR): 1 is no better than predicting the CTR for everything. NaN when undefined (no
  // steady instance, or one class only).
  double ratio_to_constant() const;
  // The entropy of the steady instances' CTR (NaN when undefined).
  double constant_logloss() const;
};

// The steps a card's or training thread's pass begins with that SteadyLoss leaves out:
// runner.print_interval, but at most half of the pass's steps when they are known
// (`pass_steps` >= 0; a stream read until it ends is not counted first), so that a pass of fewer
// steps than print_interval is judged on its later half (a print_interval as large as a pass had
// turned the divergence and dead-output checks off). The first step is always left out: a fresh
// model's predictions there are its initial ones (PaddleRec's logistic_regression and fm start
// at 0: 0.5 for every instance), and a pass of one step was judged dead on them.
inline int64_t steady_after(int print_interval, int64_t pass_steps) {
  const int64_t first = std::max<int64_t>(1, print_interval);
  return pass_steps < 0 ? first : std::max<int64_t>(1, std::min(first, pass_steps / 2));
}

// Undefined values (AUC with one class only, NE with actual CTR 0 or 1, anything of an empty
// set) are NaN; the formatters print them as "nan" / JSON null.
struct MetricValues {
  double examples = 0;
  double positives = 0;
  double auc = 0;            // bucketed: ties within a bucket count one half
  double logloss = 0;        // mean; predictions clipped as kLoglossClip says
  double ne = 0;             // normalised entropy: logloss / entropy of the actual CTR
  double actual_ctr = 0;     // positives / examples
  double predicted_ctr = 0;  // mean prediction
  double copc = 0;           // clicks over predicted clicks: actual_ctr / predicted_ctr
  double mae = 0;
  double rmse = 0;
  // The histogram buckets holding a prediction: 1 when every prediction is the same to within
  // one bucket (the dead-output check, dead_output.hpp), 0 for an empty set.
  double prediction_buckets = 0;
  // The lowest and the highest of them (-1 for an empty set): the PS modes' trainers exchange
  // them to judge the job's spread (ps_modes/job_steady_loss.hpp).
  double lowest_bucket = -1;
  double highest_bucket = -1;
  // Of a training pass (empty for an evaluation). In a PassReport, the whole job's: every
  // trainer holds the same (the divergence check's figure).
  SteadyLoss steady;
};

// Layout of the accumulator's flat buffer of doubles (what the cards all-reduce):
//   [negatives histogram (buckets) | positives histogram (buckets) | sums (kNumSums)]
namespace metric_sums {
enum : std::size_t {
  kCount = 0,
  kLabels,
  kPredictions,
  kLogLoss,
  kAbsError,
  kSquaredError,
  kSteadyCount,  // SteadyLoss's sums: steps added with steady = true
  kSteadyLabels,
  kSteadyLogLoss,
  kSteadyPairs,      // neighbouring instances of a steady step: n - 1 a step of n
  kSteadyTiedPairs,  // those whose predictions differ by less than one AUC bucket
  kNumSums
};
}  // namespace metric_sums

inline std::size_t metrics_flat_size(std::size_t buckets) {
  return 2 * buckets + metric_sums::kNumSums;
}

// From a (merged) host copy of the flat buffer with `buckets` buckets per histogram.
MetricValues compute_metrics(const double* flat, std::size_t buckets);

struct PassReport {
  int64_t pass = 0;
  double seconds = 0;  // wall time of the pass
  int cards = 1;       // cards of all trainers (ips counts the examples of all of them)
  MetricValues metrics;
  // Appended as ", name: value" to the line and as "name": value to the JSON (e.g. the pass
  // manager's counters), in order.
  std::vector<std::pair<std::string, double>> extra;
};

// "pass: P, using time: T second, ips: S example/sec, auc: A, logloss: L, ne: N, actual_ctr: C,
//  predicted_ctr: Q, copc: .., mae: .., rmse: .., ips_per_card: .." then the extras.
// ips = examples of all cards / seconds; ips_per_card = ips / cards (PaddleRec's ips).
std::string format_pass_line(const PassReport& report);
// One JSON object on one line (no trailing newline): pass, seconds, examples, cards, ips,
// ips_per_card, every metric, then the extras.
std::string format_pass_json(const PassReport& report);
// The test evaluation after epoch `epoch`, one JSON object on one line: epoch, test_auc,
// test_logloss, test_examples (undefined values, e.g. the AUC of a one-class test set, null).
std::string format_test_json(int64_t epoch, const MetricValues& test);
// Why an evaluation's AUC is nan when its data holds one class: "its 367 instances are all
// negative (label 0): AUC is undefined with one class (nan); logloss is measured"; "" when
// both classes are there (or there is no instance).
std::string one_class_note(const MetricValues& metrics);

// PaddleRec's own lines, for the log scrapers written against them (epochs from 0):
// static_gpubox_trainer.py's "Epoch: E, using time: T second, ips: S example/sec. auc: A", ips
// per card (PaddleRec divides by the GPUs), and trainer.py's / static_infer.py's
// "epoch: E done, auc: A, logloss: L, epoch time: T s".
std::string format_paddlerec_epoch_line(int64_t epoch, double seconds, double examples, int cards,
                                        double auc);
std::string format_paddlerec_done_line(int64_t epoch, const MetricValues& metrics, double seconds);

// Appends `json_line` and a newline to the file at `path` (runner.metrics_path), creating the
// file and its missing parent folders. One write per call, so lines of consecutive passes never
// interleave within this process. Errors name the path.
Status append_metrics_line(const std::string& path, const std::string& json_line);

// The in-pass progress line: "pass P: D/T batches (x%), S example/sec, auc: A, eta: 1m05s"
// (the rest of the pass at the speed so far; "eta: ?" before a batch is done). On a terminal the
// pass loop redraws it in place ('\r' prefix, no newline); otherwise it prints it as a plain
// line every print_interval batches.
std::string format_progress_line(int64_t pass, int64_t batches_done, int64_t batches_total,
                                 double examples_per_sec, double running_auc,
                                 double elapsed_seconds);
// "42s", "3m07s", "2h05m": a duration for people ("?" when negative or not finite).
std::string format_duration(double seconds);

}  // namespace gpubox::trainer
