// The dense optimizer: one elementwise step over the flat parameter buffer after the gradient
// all-reduce. Every card runs it on identical gradients with identical state, so dense weights
// stay identical on all cards without a broadcast.
//
//   sgd:  w -= lr * g
//   adam: m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//         lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t);  w -= lr_t * m / (sqrt(v) + eps * sqrt(1 -
//         b2^t)) (Paddle's adam: epsilon is applied to the bias-corrected second moment.)
//   adagrad: g2 += g^2;  w -= lr * g / (sqrt(g2) + eps)  (Paddle's; g2 starts at
//         initial_accumulator, kept in the second-moment buffer)
// Always on the fp32 master weights; a bf16 copy for the GEMMs is written alongside.
// adam's t is counted on the card as well as on the host, and the step's bias corrections are
// computed there, so that a step captured into a step graph (heterps/device/step_graph.hpp) and
// replayed computes the step it runs (the host count follows through count_step()).
//
// Ownership: owns the moment buffers (card memory). Thread-safety: one card's thread only.
#pragma once

#include <cstdint>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "trainer/nn/dense_model_types.hpp"
#include "trainer/nn/dense_parameters.hpp"

namespace gpubox::trainer {

class DenseOptimizer {
 public:
  // `size`: floats in the parameter buffer the optimizer will step.
  DenseOptimizer(device::Card& card, const DenseOptimizerConfig& config, std::size_t size);

  const DenseOptimizerConfig& config() const { return config_; }
  // Steps taken so far (the t of adam's bias correction).
  int64_t steps() const { return steps_; }

  // values -= update(grads); both `size` floats of card memory. `values_bf16` (may be null):
  // rewritten as the bf16 rounding of the new values in the same pass. `veto` (card memory, may
  // be null): the step changes nothing (values, moments) unless *veto == heter_comm::kNoVeto, so
  // a verdict computed on the card (a non-finite gradient) stops it without a host round trip.
  // count_step() then step_on_card().
  void step(float* values, const float* grads, Bf16* values_bf16 = nullptr,
            const uint32_t* veto = nullptr);
  // The same on the parameters, their bf16 copy included when they keep one.
  void step(DenseParameters& params, const uint32_t* veto = nullptr);
  // step()'s two halves, for a caller that replays the card half from a step graph: the host's
  // step count, and the card work (enqueued, capturable: nothing in it depends on host state
  // that changes from step to step).
  void count_step() { ++steps_; }
  // The raw form steps every value by the rule: the buffer must hold no statistic blocks (a
  // model with batch norm steps through the parameters' form). Refused once this optimizer has
  // stepped parameters with statistics (the raw pointers cannot say what they hold).
  void step_on_card(float* values, const float* grads, Bf16* values_bf16 = nullptr,
                    const uint32_t* veto = nullptr);
  // The parameters' form steps their trained blocks by the rule and adds the statistics' changes
  // (DenseParameters::add_statistic: w += g, the same on every card after the all-reduce).
  // Adam's and Adagrad's moments span all size() floats: those of the statistic range exist
  // (saved, loaded) but stay at their initial values.
  void step_on_card(DenseParameters& params, const uint32_t* veto = nullptr);

  // State for save/load: first and second moments (empty for sgd; adagrad: the second only,
  // its squared-gradient sums) and the step count.
  device::device_buffer<float>& moment1() { return m_; }
  device::device_buffer<float>& moment2() { return v_; }
  // Sets the step count on the host and on the card (enqueued).
  void set_steps(int64_t steps);

  // adam: the card's step count and the current step's bias corrections.
  struct AdamSchedule {
    int64_t steps = 0;
    float lr_t = 0;     // lr * sqrt(1 - b2^t) / (1 - b1^t)
    float eps_hat = 0;  // eps * sqrt(1 - b2^t)
  };

 private:
  // The rule over the first `count` floats.
  void step_rule(float* values, const float* grads, Bf16* values_bf16, const uint32_t* veto,
                 std::size_t count);

  device::Card* card_;
  DenseOptimizerConfig config_;
  std::size_t size_;
  int64_t steps_ = 0;
  bool stepped_statistics_ = false;  // step_on_card(DenseParameters&) met statistic blocks
  device::device_buffer<float> m_;
  device::device_buffer<float> v_;
  device::device_buffer<AdamSchedule> schedule_;  // adam: 1 element
};

}  // namespace gpubox::trainer
