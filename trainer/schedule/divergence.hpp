// The divergence check of the epoch loop (issue 29): a pass's training logloss over its steady
// steps (after each card's or training thread's first runner.print_interval steps; SteadyLoss)
// against the constant predictor's (the entropy of the same instances' CTR, the logloss of
// predicting the CTR for everything). A model that does worse than that constant has learnt
// nothing usable or is diverging:
//   - above it (ratio > 1): the pass line is followed by a warning naming what to try;
//   - above it by more than kDivergenceStopRatio, with runner.stop_on_divergence (the
//     default): the job stops with an error before the pass's save, so no save (and no resume)
//     holds the diverged model;
//   both only on enough evidence (kEvidenceSigmas below): a small pass's mean moves by chance.
// The figures are job-wide: every trainer judges the same numbers (the gpubox and collective
// modes all-reduce the metric buffer over every card of the job, the PS modes add the sums up
// through the servers), so all stop together and none is left waiting in a collective.
// Host-only, plain functions.
#pragma once

#include <string>

#include "trainer/metrics/metric_values.hpp"

namespace gpubox::trainer {

// The stop threshold, measured on the mean's ratio (ne_after_warmup of pass 0 unless said; issue
// 29's report has the commands; since issue 32 the verdict compares the low end of the ratio's
// range with it, see below). Healthy runs: 0.76 to 0.93 on gpubox_data's planted data (Zipf 2 and
// uniform keys, Zipf 1.1, a 2% click rate, a pass whose click rate drops from 25% to 2%; dnn,
// deepfm, wide_deep, dcn_v2; gpubox and async modes), 1.17 the worst (wide_deep, print_interval 1:
// its first steps are in). Diverged: deepfm with summed hot-key steps 4.2 (40k lines) to 9.7 (200k
// lines, 26 slots; issue 29's run: 6.65 / 0.56 = 11.9 over the whole pass), 17.7 to 21.6 with
// sparse SGD at 50. Between them, runs that learn nothing (AUC 0.50: dense Adam at 1, sparse
// SGD at 50 or 1000 on the dnn) end at 1.01 to 1.73: they are warned about every pass (those
// whose low end is over 1). 2 stops
// what diverged with a margin on both sides: never a healthy run, even one whose first steps
// count.
inline constexpr double kDivergenceStopRatio = 2.0;

// The evidence a verdict needs (issue 32: PaddleRec fat_deepffm's 80-line sample at batch 1 was
// stopped on 70 judged instances whose point ratio was over 2 by a few confident misses). A
// pass's steady logloss is a mean of n per-instance losses, each between 0 and
// -log(kLoglossClip) = M (about 16.1); whatever their distribution, their variance is at most
// mu (M - mu) (Bhatia-Davis), so the mean lies within kEvidenceSigmas standard errors
// sqrt(mu (M - mu) / n) of its expectation but for a chance of about 1 in 740 (normal
// approximation). The verdict compares the low end of that range, not the mean, with the
// limits: a pass warns when even its low end is over the constant predictor's logloss and stops
// when it is over kDivergenceStopRatio times it. The pass's click rate, which gives the constant
// predictor's logloss, is itself estimated from the pass: with fewer than kMinClassInstances
// instances of either class the pass is judged only against the most any constant predictor
// loses, ln 2 (a click rate of 1/2): a low end over that is a diverged model whatever the true
// rate (issue 32's review: 5 positives in 5,000 at a mean loss of 8 had been saved with an INFO
// line), anything less is not judged. A pass not judged, or judged below a
// limit its mean alone would pass, says so in an INFO line (divergence_note) with the figures and
// about how many instances a verdict would need. Large passes are hardly affected: at 35,000
// judged instances the margin is 0.09 of logloss at a mean of 2, where the diverged runs measured
// above end 4 to 22 times over the constant's.
inline constexpr double kEvidenceSigmas = 3.0;
inline constexpr double kMinClassInstances = 10;

struct DivergenceVerdict {
  double ratio = 0;      // SteadyLoss::ratio_to_constant(); NaN: no steady step, or one class
  double ratio_low = 0;  // the low end of the ratio's range (see above); NaN when not judged
  bool judged = false;   // the pass has steady instances, and kMinClassInstances of each class
                         // (or its low end is over ln 2: by_worst_constant)
  bool by_worst_constant = false;  // ratio_low is against ln 2, not the pass's click rate
  bool warn = false;               // judged and ratio_low > 1
  bool stop = false;  // judged, ratio_low > kDivergenceStopRatio and runner.stop_on_divergence
  double steady_logloss = 0;
  double constant_logloss = 0;
  double examples = 0;  // the steady instances, and their positives
  double positives = 0;
  double margin = 0;        // kEvidenceSigmas standard errors of steady_logloss (see above)
  bool mean_warns = false;  // what the mean alone would do: ratio > 1
  bool mean_stops = false;  // ratio > kDivergenceStopRatio and runner.stop_on_divergence
};

DivergenceVerdict judge_divergence(const SteadyLoss& steady, bool stop_on_divergence);

// The INFO line after pass `pass`'s line, empty when there is nothing to say: why the pass was
// not judged (no steady step, one class, too few of a class), or why its mean's ratio over 1
// (over the stop limit) did not warn (stop): the figures, the margin and about how many judged
// instances a verdict would need.
std::string divergence_note(int64_t pass, int warmup_steps, const DivergenceVerdict& verdict);

// The warning printed after pass `pass`'s line (the verdict warns): the two loglosses, their
// ratio, and what to try (hyper_parameters.sparse_optimizer.show_scale: true, lower learning
// rates).
std::string divergence_warning(int64_t pass, int warmup_steps, const DivergenceVerdict& verdict);

// The error that stops the job (the verdict stops): as the warning, plus what happened to the
// saves (`saves`: e.g. "the saves under output/model end with pass 2") and the way to train on
// (runner.stop_on_divergence: false).
std::string divergence_error(int64_t pass, int warmup_steps, const DivergenceVerdict& verdict,
                             const std::string& saves);

}  // namespace gpubox::trainer
