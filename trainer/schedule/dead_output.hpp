// The dead-output check of the epoch loop, beside the divergence check (divergence.hpp): a
// training pass whose predictions are all the same has a network that learns nothing and, once
// its output is constant, cannot learn again (a ReLU'd unit that outputs 0 for every instance
// passes no gradient). PaddleRec dlrm's output layer (hyper_parameters.dlrm_output softmax2)
// without hyper_parameters.dnn_batch_norm is where it was met: both of its 2 ReLU'd units died,
// softmax(0, 0) = 0.5 for every instance, AUC 0.5 and logloss ln 2 for good, a run that exited
// 0 (the divergence check does not stop it: ln 2 is at most 1.3 times the constant predictor's
// at click rates over 20%). Any network whose output saturates (every prediction 0 or 1) is
// caught alike.
//
// "All the same" is read from the pass's AUC histogram (every prediction in one bucket of
// runner.auc_buckets_log2's, 2^20 by default: equal to within about 1e-6), or from its steady
// steps: at least kDeadOutputTiedShare of their pairs of neighbouring instances predicted the
// same to within a bucket, though the value moved from step to step (dead hidden units leave the
// output layer its bias, which the optimizer still moves: a dnn at learning rate 1 was met so, AUC
// 0.4996 and exit 0). Both are job-wide, as the divergence check's figures are (the PS modes gather
// every trainer's through the servers: ps_modes/job_steady_loss.hpp). It is judged only over at
// least kMinDeadOutputExamples predictions of steady steps (after each card's or training thread's
// first runner.print_interval steps, so made after the model had been updated in the pass): one
// step of a fresh model on unseen keys predicts its biases' constant for every instance, a healthy
// thing; a pass of fewer instances, or of no steady step, is not judged. Nor is a pass of one
// class (every label 0, or every label 1: a constant fits it, logloss 0 at best) or one whose
// logloss is below kDeadOutputLossRatio times the constant predictor's (one value for every
// instance does no better than the constant: its predictions differ within the bucket, and
// fit). Evaluation passes (a one-class test set) are never judged. A dead pass stops the job
// before its save.
// Host-only, plain functions.
#pragma once

#include <cstdint>
#include <string>

#include "trainer/config/trainer_config.hpp"
#include "trainer/metrics/metric_values.hpp"

namespace gpubox::trainer {

inline constexpr double kMinDeadOutputExamples = 100;
// One value for every prediction has a logloss of at least the constant predictor's (ratio 1);
// the margin is for rounding.
inline constexpr double kDeadOutputLossRatio = 0.999;
// The share of the steady steps' neighbour pairs predicted the same that makes a network dead
// (with a loss no better than the constant's): a live network's neighbours differ (two instances
// tie by chance, or when they share all their features), ~0 of them in every run measured; a
// dead one's tie but where a unit still alive singles out some instances by a feature that says
// nothing of the click: a dnn at Adam 1 predicted one value for 90% of its instances and another
// for the rest (0.82 of its neighbours tied, AUC 0.4999), another one value but for one instance
// in hundreds (0.99).
inline constexpr double kDeadOutputTiedShare = 0.5;

// Whether the training pass `metrics` stands for predicted one value for everything, by the rule
// above.
bool dead_output(const MetricValues& metrics);

// The error that stops the job at pass `pass` (dead_output): the pass, its predictions, the
// layer that died and the config keys that choose it (dlrm's two-class output:
// hyper_parameters.dlrm_output and dnn_batch_norm), what to do, and what the saves hold
// (`saves`, as divergence_error's).
std::string dead_output_error(int64_t pass, const MetricValues& metrics,
                              const TrainerConfig& config, const std::string& saves);

}  // namespace gpubox::trainer
