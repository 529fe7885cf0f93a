#include "trainer/schedule/divergence.hpp"

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
         " of each card or training thread, runner.print_interval) is " + number(v.ratio, "%.2f") +
         " times the constant predictor's " + number(v.constant_logloss, "%.4f") +
         " (the logloss of predicting the pass's click rate for every instance)";
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
  v.steady_logloss = steady.examples > 0 ? steady.logloss_sum / steady.examples : std::nan("");
  // NaN compares false: a pass without a steady step (or of one class) is not judged. A
  // non-finite loss never gets here: the step that made it threw (DenseModel's finite check).
  v.warn = v.ratio > 1.0;
  v.stop = stop_on_divergence && v.ratio > kDivergenceStopRatio;
  return v;
}

std::string divergence_warning(int64_t pass, int warmup_steps, const DivergenceVerdict& v) {
  return "WARNING: " + comparison(pass, warmup_steps, v) +
         ": the model predicts worse than a constant, it is diverging or learns nothing; " +
         kWhatToTry +
         (v.ratio > kDivergenceStopRatio
              ? std::string(" (runner.stop_on_divergence: false let it go on)")
              : " (above " + number(kDivergenceStopRatio, "%g") +
                    " times, runner.stop_on_divergence stops the job)");
}

std::string divergence_error(int64_t pass, int warmup_steps, const DivergenceVerdict& v,
                             const std::string& saves) {
  return comparison(pass, warmup_steps, v) + ", over runner.stop_on_divergence's limit of " +
         number(kDivergenceStopRatio, "%g") + " times: the model diverged and the job stops; " +
         "pass " + std::to_string(pass) + " is not saved (" + saves + "). To fix it, " +
         kWhatToTry +
         ", and start afresh (-o runner.resume=off, or another runner.model_save_path); "
         "-o runner.stop_on_divergence=false trains on regardless";
}

}  // namespace gpubox::trainer
