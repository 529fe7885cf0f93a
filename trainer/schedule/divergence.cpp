#include "trainer/schedule/divergence.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace gpubox::trainer {
namespace {

std::string number(double v, const char* format) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

// "pass P: its training logloss L (over its steps after the first N of each card ...) is R
// times the constant predictor's C (...)".
std::string comparison(int64_t pass, int warmup_steps, const DivergenceVerdict& v) {
  return "pass " + std::to_string(pass) + ": its training logloss " +
         number(v.steady_logloss, "%.4f") + " (over its steps after the first " +
         std::to_string(warmup_steps) +
         " of each card or training thread, runner.print_interval, or half of a shorter pass) "
         "is " +
         number(v.ratio, "%.2f") + " times the constant predictor's " +
         number(v.constant_logloss, "%.4f") +
         " (the logloss of predicting the pass's click rate for every instance)";
}

// The most one instance's clipped logloss can be (metric_values.hpp).
const double kMaxLoss = -std::log(kLoglossClip);
// The most a constant predictor loses, whatever the click rate: ln 2, at a rate of 1/2.
const double kWorstConstantLogloss = std::log(2.0);

// How a verdict on too few of a class was made (divergence_warning and _error say it).
std::string against(const DivergenceVerdict& v) {
  return v.by_worst_constant
             ? " (its low end measured against ln 2 = 0.693, the most any constant predictor "
               "loses: the pass has under " +
                   number(kMinClassInstances, "%g") + " of a class)"
             : "";
}

// About how many judged instances of this mean it takes for its low end to clear `limit` times
// the constant's: n > (k / (mu - limit c))^2 mu (M - mu).
std::string instances_needed(const DivergenceVerdict& v, double limit) {
  const double mu = std::min(v.steady_logloss, kMaxLoss);
  const double gap = mu - limit * v.constant_logloss;
  if (!(gap > 0)) return "infinitely many (its mean is not over the limit)";
  const double n = kEvidenceSigmas * kEvidenceSigmas * mu * (kMaxLoss - mu) / (gap * gap);
  return number(std::ceil(n), "%.0f");
}

constexpr const char* kWhatToTry =
    "try hyper_parameters.sparse_optimizer.show_scale: true (a hot key then steps by the mean "
    "of its gradients in a batch, not their sum) or lower learning rates "
    "(hyper_parameters.sparse_optimizer.learning_rate and mf_learning_rate, "
    "hyper_parameters.optimizer.learning_rate)";

}  // namespace

DivergenceVerdict judge_divergence(const SteadyLoss& steady, bool stop_on_divergence) {
  DivergenceVerdict v;
  v.ratio = steady.ratio_to_constant();
  v.constant_logloss = steady.constant_logloss();
  v.examples = steady.examples;
  v.positives = steady.positives;
  v.steady_logloss = steady.examples > 0 ? steady.logloss_sum / steady.examples : std::nan("");
  v.ratio_low = std::nan("");
  // NaN compares false: a pass without a steady step (or of one class) is not judged. A
  // non-finite loss never gets here: the step that made it threw (DenseModel's finite check).
  v.mean_warns = v.ratio > 1.0;
  v.mean_stops = stop_on_divergence && v.ratio > kDivergenceStopRatio;
  if (std::isnan(v.ratio)) return v;
  const double mu = std::min(v.steady_logloss, kMaxLoss);
  v.margin = kEvidenceSigmas * std::sqrt(mu * (kMaxLoss - mu) / v.examples);
  // A logloss is never negative: so is the low end of its range.
  const double low = std::max(0.0, v.steady_logloss - v.margin);
  v.judged = v.positives >= kMinClassInstances && v.examples - v.positives >= kMinClassInstances;
  if (!v.judged) {
    // Too few of a class to trust the click rate: against the worst constant predictor's.
    if (!(low > kWorstConstantLogloss)) return v;
    v.judged = true;
    v.by_worst_constant = true;
    v.ratio_low = low / kWorstConstantLogloss;
  } else {
    v.ratio_low = low / v.constant_logloss;
  }
  v.warn = v.ratio_low > 1.0;
  v.stop = stop_on_divergence && v.ratio_low > kDivergenceStopRatio;
  return v;
}

std::string divergence_note(int64_t pass, int warmup_steps, const DivergenceVerdict& v) {
  const std::string p = "pass " + std::to_string(pass) + ": ";
  if (std::isnan(v.ratio)) {
    if (!(v.examples > 0)) {
      return p + "no step after the first " + std::to_string(warmup_steps) +
             " (runner.print_interval, or half of a shorter pass) of any card or training "
             "thread: its divergence is not checked";
    }
    return p + "its " + number(v.examples, "%.0f") + " instances after the first " +
           std::to_string(warmup_steps) +
           " steps (runner.print_interval, or half of a shorter pass) of each card or training "
           "thread are of one class "
           "only: its divergence is not checked";
  }
  if (!v.judged) {
    return comparison(pass, warmup_steps, v) + ", but its " + number(v.examples, "%.0f") +
           " judged instances hold " + number(v.positives, "%.0f") + " positives and " +
           number(v.examples - v.positives, "%.0f") + " negatives: under " +
           number(kMinClassInstances, "%g") +
           " of a class leave the constant predictor's logloss too uncertain, so its divergence "
           "is not judged";
  }
  const bool unwarned = v.mean_warns && !v.warn;
  const bool unstopped = v.mean_stops && !v.stop;
  if (!unwarned && !unstopped) return "";
  const double limit = unwarned ? 1.0 : kDivergenceStopRatio;
  const char* outcome = !unwarned      ? "does not stop the job (it is warned about)"
                        : v.mean_stops ? "neither stops the job nor is warned about"
                                       : "is not warned about";
  return comparison(pass, warmup_steps, v) + ", but a mean of " + number(v.examples, "%.0f") +
         " losses (" + number(v.positives, "%.0f") + " positives), each between 0 and " +
         number(kMaxLoss, "%.1f") + ", may lie " + number(v.margin, "%.3f") +
         " from its expectation by chance (" + number(kEvidenceSigmas, "%g") +
         " standard errors at most): its low end, " + number(v.ratio_low, "%.2f") +
         " times, is not over " + number(limit, "%g") + " times, so the pass " + outcome +
         "; at this mean a " + (v.mean_stops ? "stop" : "warning") + " would need about " +
         instances_needed(v, v.mean_stops ? kDivergenceStopRatio : 1.0) + " judged instances";
}

std::string divergence_warning(int64_t pass, int warmup_steps, const DivergenceVerdict& v) {
  return "WARNING: " + comparison(pass, warmup_steps, v) + against(v) +
         ": the model predicts worse than a constant, it is diverging or learns nothing; " +
         kWhatToTry +
         (v.ratio_low > kDivergenceStopRatio
              ? std::string(" (runner.stop_on_divergence: false let it go on)")
              : " (above " + number(kDivergenceStopRatio, "%g") +
                    " times on enough evidence, runner.stop_on_divergence stops the job)");
}

std::string divergence_error(int64_t pass, int warmup_steps, const DivergenceVerdict& v,
                             const std::string& saves) {
  return comparison(pass, warmup_steps, v) + ", and even its low end over " +
         number(v.examples, "%.0f") + " instances (" + number(kEvidenceSigmas, "%g") +
         " standard errors below), " + number(v.ratio_low, "%.2f") + " times" + against(v) +
         ", is over runner.stop_on_divergence's limit of " + number(kDivergenceStopRatio, "%g") +
         " times: the model diverged and the job stops; " + "pass " + std::to_string(pass) +
         " is not saved (" + saves + "). To fix it, " + kWhatToTry +
         ", and start afresh (-o runner.resume=off, or another runner.model_save_path); "
         "-o runner.stop_on_divergence=false trains on regardless";
}

}  // namespace gpubox::trainer
