#include <cmath>
#include <vector>

#include "common/error.hpp"
#include "heterps/device/parallel_for.cuh"
#include "heterps/heter_comm/heter_comm_types.hpp"
#include "trainer/nn/bf16.hpp"
#include "trainer/nn/dense_optimizer.hpp"
#include "trainer/nn/device_math.cuh"

namespace gpubox::trainer {
namespace {
// w_bf16 (may be null): the bf16 copy of the weights the bf16 GEMMs read, rewritten in the same
// pass (no second pass over the weights per step).
//
// Each rule is one element function, called per item (CUDA) or over a thread's range (cpu:
// parallel_for's run_range hook, where the step's scalars are read once and the loop vectorizes;
// per item it ran scalar, the largest cost of a bf16 step after the GEMMs).
GPUBOX_HD GPUBOX_FORCEINLINE bool vetoed(const uint32_t* veto) {
  return veto != nullptr && *veto != heter_comm::kNoVeto;
}

GPUBOX_HD GPUBOX_FORCEINLINE float sgd_element(float& w, float grad, float lr) {
  w = w - lr * grad;
  return w;
}

GPUBOX_HD GPUBOX_FORCEINLINE float adam_element(float& w, float& m, float& v, float grad,
                                                float beta1, float beta2, float lr_t,
                                                float eps_hat) {
  const float m_i = beta1 * m + (1.0f - beta1) * grad;
  const float v_i = beta2 * v + (1.0f - beta2) * grad * grad;
  m = m_i;
  v = v_i;
  w = w - lr_t * m_i / (detail::sqrt_f(v_i) + eps_hat);
  return w;
}

GPUBOX_HD GPUBOX_FORCEINLINE float adagrad_element(float& w, float& g2, float grad, float lr,
                                                   float epsilon) {
  g2 = g2 + grad * grad;
  w = w - lr * grad / (detail::sqrt_f(g2) + epsilon);
  return w;
}

#if !defined(GPUBOX_BACKEND_CUDA)
// `element(i, w_i)` over [begin, end) with the bf16 copy (if any) written from each new weight;
// the two loops keep the bf16 test out of the vectorized body.
template <class Element>
GPUBOX_FORCEINLINE void step_range(std::size_t begin, std::size_t end, Bf16* __restrict w_bf16,
                                   const Element& element) {
  if (w_bf16 == nullptr) {
    for (std::size_t i = begin; i < end; ++i) element(i);
    return;
  }
  for (std::size_t i = begin; i < end; ++i) w_bf16[i] = to_bf16(element(i));
}

// Adam's range, compiled for AVX-512, AVX2 and the baseline (the loader picks the machine's
// best; the build targets the baseline): its divisions and square roots 16 lanes wide, not 4.
// No clone contracts a * b + c into an FMA (GCC does in C++ even under -std=c++17), so each
// rounds every operation as the baseline does: the same bits on any machine.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"),
               optimize("fp-contract=off")))
#endif
void adam_range(std::size_t begin, std::size_t end, float* __restrict w, float* __restrict m,
                float* __restrict v, const float* __restrict g, Bf16* __restrict w_bf16,
                float beta1, float beta2, float lr_t, float eps_hat) {
  step_range(begin, end, w_bf16, [=](std::size_t i) {
    return adam_element(w[i], m[i], v[i], g[i], beta1, beta2, lr_t, eps_hat);
  });
}
#endif

struct SgdStep {
  float* w;
  Bf16* w_bf16;
  const float* g;
  float lr;
  const uint32_t* veto;  // null, or step only while *veto == kNoVeto
  GPUBOX_HD void operator()(std::size_t i) const {
    if (vetoed(veto)) return;
    const float w_i = sgd_element(w[i], g[i], lr);
    if (w_bf16 != nullptr) w_bf16[i] = to_bf16(w_i);
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const {
    if (vetoed(veto)) return;
    float* __restrict w_r = w;
    const float* __restrict g_r = g;
    const float lr_r = lr;
    step_range(begin, end, w_bf16,
               [=](std::size_t i) { return sgd_element(w_r[i], g_r[i], lr_r); });
  }
#endif
};
// The statistics' step (DenseParameters::add_statistic): w += g, g being the all-reduced change
// of the statistic; no learning rate, no moments.
struct StatisticStep {
  float* w;
  Bf16* w_bf16;
  const float* g;
  const uint32_t* veto;  // as SgdStep's
  GPUBOX_HD void operator()(std::size_t i) const {
    if (vetoed(veto)) return;
    w[i] = w[i] + g[i];
    if (w_bf16 != nullptr) w_bf16[i] = to_bf16(w[i]);
  }
};
using AdamSchedule = DenseOptimizer::AdamSchedule;

// Advances adam's step count on the card and computes the step's bias corrections in double
// (identical on every card, exact for long runs); one work item.
struct AdvanceAdam {
  AdamSchedule* schedule;
  float beta1;
  float beta2;
  float learning_rate;
  float epsilon;
  GPUBOX_HD void operator()(std::size_t) const {
    const int64_t steps = schedule->steps + 1;
    const double t = static_cast<double>(steps);
    const double b1_pow = ::pow(static_cast<double>(beta1), t);
    const double b2_pow = ::pow(static_cast<double>(beta2), t);
    const double correction = ::sqrt(1.0 - b2_pow);
    schedule->steps = steps;
    schedule->lr_t = static_cast<float>(learning_rate * correction / (1.0 - b1_pow));
    schedule->eps_hat = static_cast<float>(epsilon * correction);
  }
};
struct SetAdamSteps {
  AdamSchedule* schedule;
  int64_t steps;
  GPUBOX_HD void operator()(std::size_t) const { schedule->steps = steps; }
};

struct AdamStep {
  float* w;
  Bf16* w_bf16;
  const float* g;
  float* m;
  float* v;
  float beta1;
  float beta2;
  const AdamSchedule* schedule;  // lr_t and eps_hat of this step
  const uint32_t* veto;          // as SgdStep's
  GPUBOX_HD void operator()(std::size_t i) const {
    if (vetoed(veto)) return;
    const float w_i =
        adam_element(w[i], m[i], v[i], g[i], beta1, beta2, schedule->lr_t, schedule->eps_hat);
    if (w_bf16 != nullptr) w_bf16[i] = to_bf16(w_i);
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const {
    if (vetoed(veto)) return;
    adam_range(begin, end, w, m, v, g, w_bf16, beta1, beta2, schedule->lr_t, schedule->eps_hat);
  }
#endif
};
// Paddle's adagrad: g2 += g^2; w -= lr * g / (sqrt(g2) + epsilon).
struct AdagradStep {
  float* w;
  Bf16* w_bf16;
  const float* g;
  float* g2;
  float lr;
  float epsilon;
  const uint32_t* veto;  // as SgdStep's
  GPUBOX_HD void operator()(std::size_t i) const {
    if (vetoed(veto)) return;
    const float w_i = adagrad_element(w[i], g2[i], g[i], lr, epsilon);
    if (w_bf16 != nullptr) w_bf16[i] = to_bf16(w_i);
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const {
    if (vetoed(veto)) return;
    float* __restrict w_r = w;
    float* __restrict g2_r = g2;
    const float* __restrict g_r = g;
    const float lr_r = lr;
    const float eps = epsilon;
    step_range(begin, end, w_bf16,
               [=](std::size_t i) { return adagrad_element(w_r[i], g2_r[i], g_r[i], lr_r, eps); });
  }
#endif
};
}  // namespace

DenseOptimizer::DenseOptimizer(device::Card& card, const DenseOptimizerConfig& config,
                               std::size_t size)
    : card_(&card), config_(config), size_(size) {
  GPUBOX_EXPECTS(config.learning_rate > 0.0f && std::isfinite(config.learning_rate),
                 "dense learning_rate must be positive, got ", config.learning_rate);
  if (config.kind == DenseOptimizerKind::kAdam) {
    GPUBOX_EXPECTS(config.beta1 >= 0.0f && config.beta1 < 1.0f && config.beta2 >= 0.0f &&
                       config.beta2 < 1.0f && config.epsilon > 0.0f,
                   "adam needs beta1, beta2 in [0, 1) and epsilon > 0, got beta1 ", config.beta1,
                   ", beta2 ", config.beta2, ", epsilon ", config.epsilon);
    m_ = device::to_device(std::vector<float>(size, 0.0f), card.memory(), card.stream());
    v_ = device::to_device(std::vector<float>(size, 0.0f), card.memory(), card.stream());
    schedule_ = device::to_device(std::vector<AdamSchedule>(1), card.memory(), card.stream());
  }
  if (config.kind == DenseOptimizerKind::kAdagrad) {
    GPUBOX_EXPECTS(config.epsilon > 0.0f && config.initial_accumulator >= 0.0f,
                   "adagrad needs epsilon > 0 and initial_accumulator_value >= 0, got epsilon ",
                   config.epsilon, ", initial_accumulator_value ", config.initial_accumulator);
    // The squared-gradient sums are the second-moment buffer (saved and restored as adam's v).
    v_ = device::to_device(std::vector<float>(size, config.initial_accumulator), card.memory(),
                           card.stream());
  }
}

void DenseOptimizer::set_steps(int64_t steps) {
  steps_ = steps;
  if (config_.kind == DenseOptimizerKind::kAdam) {
    device::parallel_for(card_->stream(), 1, SetAdamSteps{schedule_.data(), steps});
  }
}

void DenseOptimizer::step(DenseParameters& params, const uint32_t* veto) {
  count_step();
  step_on_card(params, veto);
}

void DenseOptimizer::step(float* values, const float* grads, Bf16* values_bf16,
                          const uint32_t* veto) {
  count_step();
  step_on_card(values, grads, values_bf16, veto);
}

void DenseOptimizer::step_on_card(DenseParameters& params, const uint32_t* veto) {
  GPUBOX_EXPECTS(params.size() == size_, "dense optimizer of ", size_, " floats stepping ",
                 params.size());
  float* values = params.values().data();
  const float* grads = params.grads().data();
  Bf16* values_bf16 = params.has_bf16_copy() ? params.values_bf16().data() : nullptr;
  const std::size_t trained = params.trained_size();
  step_rule(values, grads, values_bf16, veto, trained);
  stepped_statistics_ = stepped_statistics_ || trained < size_;
  if (trained < size_) {
    device::parallel_for(
        card_->stream(), size_ - trained,
        StatisticStep{values + trained, values_bf16 ? values_bf16 + trained : nullptr,
                      grads + trained, veto});
  }
}

void DenseOptimizer::step_on_card(float* values, const float* grads, Bf16* values_bf16,
                                  const uint32_t* veto) {
  GPUBOX_EXPECTS(!stepped_statistics_,
                 "dense optimizer: a raw buffer stepped where the parameters have statistic "
                 "blocks (batch norm's running statistics), which the rule must not step: use "
                 "step_on_card(DenseParameters&)");
  step_rule(values, grads, values_bf16, veto, size_);
}

void DenseOptimizer::step_rule(float* values, const float* grads, Bf16* values_bf16,
                               const uint32_t* veto, std::size_t count) {
  const device::Stream& stream = card_->stream();
  if (config_.kind == DenseOptimizerKind::kSgd) {
    device::parallel_for(stream, count,
                         SgdStep{values, values_bf16, grads, config_.learning_rate, veto});
    return;
  }
  if (config_.kind == DenseOptimizerKind::kAdagrad) {
    device::parallel_for(stream, count,
                         AdagradStep{values, values_bf16, grads, v_.data(), config_.learning_rate,
                                     config_.epsilon, veto});
    return;
  }
  device::parallel_for(stream, 1,
                       AdvanceAdam{schedule_.data(), config_.beta1, config_.beta2,
                                   config_.learning_rate, config_.epsilon});
  device::parallel_for(stream, count,
                       AdamStep{values, values_bf16, grads, m_.data(), v_.data(), config_.beta1,
                                config_.beta2, schedule_.data(), veto});
}

}  // namespace gpubox::trainer
