#include "trainer/schedule/dead_output.hpp"

#include <cmath>
#include <cstdio>

#include "common/config/config_enums.hpp"
#include "common/config/network_shape.hpp"

namespace gpubox::trainer {
namespace {

std::string number(double v, const char* format) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

// The layer whose output is constant, and the keys that shape it.
std::string dead_layer(const MetricValues& metrics, const TrainerConfig& config) {
  const HyperParameters& h = config.hyper;
  const std::string norm =
      std::string("hyper_parameters.dnn_batch_norm ") + (h.dnn_batch_norm ? "true" : "false");
  if (h.model == ModelKind::kDlrm && h.dlrm_output == DlrmOutput::kSoftmax2) {
    return "dlrm's two-class output layer (hyper_parameters.dlrm_output softmax2, " + norm +
           "): its 2 ReLU'd units " +
           (h.dnn_batch_norm ? "give one value" : "output 0 (softmax(0, 0) = 0.5)") +
           " for every instance, and a dead ReLU passes no gradient, so no step revives them. "
           "-o hyper_parameters.dlrm_output=logit ends the top MLP in one linear logit instead" +
           (h.dnn_batch_norm ? std::string()
                             : "; -o hyper_parameters.dnn_batch_norm=true normalises the output "
                               "units as PaddleRec's dlrm folder does");
  }
  // In the lowest or the highest bucket: a sigmoid at 0 or 1.
  const double bucket = std::ldexp(1.0, -config.runner.auc_buckets_log2);
  const bool saturated = metrics.predicted_ctr < bucket || metrics.predicted_ctr > 1 - bucket;
  const bool hidden = !h.fc_sizes.empty() && config::has_dnn(h.model, false);  // not fm, wide
  const std::string why = saturated ? ": its logit saturates the sigmoid for every instance"
                          : hidden  ? ": the last hidden layer's ReLU units "
                                      "(hyper_parameters.fc_sizes) output the same for every "
                                      "instance"
                                    : ": its logit is the same for every instance";
  return std::string("the output layer of hyper_parameters.model ") +
         name_of(kModelKindNames, h.model) + why + (hidden ? " (" + norm + ")" : std::string()) +
         "; lower learning rates (hyper_parameters.optimizer.learning_rate, "
         "hyper_parameters.sparse_optimizer.learning_rate)" +
         (hidden && !h.dnn_batch_norm ? " or hyper_parameters.dnn_batch_norm: true"
                                      : std::string());
}

// Most of the steady steps' neighbouring instances were predicted one value.
bool tied_within_steps(const MetricValues& metrics) {
  return metrics.steady.pairs > 0 &&
         metrics.steady.tied_pairs >= kDeadOutputTiedShare * metrics.steady.pairs;
}

}  // namespace

bool dead_output(const MetricValues& metrics) {
  if (metrics.steady.examples < kMinDeadOutputExamples ||
      !(metrics.prediction_buckets == 1 || tied_within_steps(metrics))) {
    return false;
  }
  // Judged on the steady figures, the job's in every mode (every trainer alike). One class (a
  // constant fits it perfectly), or a loss below the constant predictor's (the predictions differ
  // within the bucket, and fit): not dead.
  const SteadyLoss& pass = metrics.steady;
  if (pass.positives <= 0 || pass.positives >= pass.examples) return false;
  return !(pass.ratio_to_constant() < kDeadOutputLossRatio);
}

std::string dead_output_error(int64_t pass, const MetricValues& metrics,
                              const TrainerConfig& config, const std::string& saves) {
  const std::string bucket =
      "one AUC bucket of 2^" + std::to_string(config.runner.auc_buckets_log2);
  const std::string steady =
      number(metrics.steady.examples, "%.0f") +
      " of them after each card's first runner.print_interval steps (half of a shorter pass)";
  const std::string what =
      metrics.prediction_buckets == 1
          ? "every one of its " + number(metrics.examples, "%.0f") + " training predictions is " +
                number(metrics.predicted_ctr, "%.6f") + " (" + bucket + ", " + steady + ")"
          // One value a step, which the output's bias moves from step to step.
          : "the network gives most instances of a step one prediction whatever their "
            "features: " +
                number(metrics.steady.tied_pairs, "%.0f") + " of the " +
                number(metrics.steady.pairs, "%.0f") +
                " pairs of neighbouring instances of its steady steps were predicted the same to "
                "within " +
                bucket + " (" + steady + ", their mean " + number(metrics.predicted_ctr, "%.6f") +
                ", moving from step to step with the output's bias)";
  return "pass " + std::to_string(pass) + ": " + what +
         ": the network's output "
         "is dead, AUC " +
         number(metrics.auc, "%.4f") + " and logloss " + number(metrics.logloss, "%.4f") +
         " for good. The layer: " + dead_layer(metrics, config) +
         ". The job stops before the "
         "pass's save (" +
         saves + ")";
}

}  // namespace gpubox::trainer
