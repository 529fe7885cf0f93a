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
struct SgdStep {
  float* w;
  Bf16* w_bf16;
  const float* g;
  float lr;
  const uint32_t* veto;  // null, or step only while *veto == kNoVeto
  GPUBOX_HD void operator()(std::size_t i) const {
    if (veto != nullptr && *veto != heter_comm::kNoVeto) return;
    const float w_i = w[i] - lr * g[i];
    w[i] = w_i;
    if (w_bf16 != nullptr) w_bf16[i] = to_bf16(w_i);
  }
};
struct AdamStep {
  float* w;
  Bf16* w_bf16;
  const float* g;
  float* m;
  float* v;
  float beta1;
  float beta2;
  float lr_t;            // lr * sqrt(1 - b2^t) / (1 - b1^t)
  float eps_hat;         // eps * sqrt(1 - b2^t)
  const uint32_t* veto;  // as SgdStep's
  GPUBOX_HD void operator()(std::size_t i) const {
    if (veto != nullptr && *veto != heter_comm::kNoVeto) return;
    const float grad = g[i];
    const float m_i = beta1 * m[i] + (1.0f - beta1) * grad;
    const float v_i = beta2 * v[i] + (1.0f - beta2) * grad * grad;
    m[i] = m_i;
    v[i] = v_i;
    const float w_i = w[i] - lr_t * m_i / (detail::sqrt_f(v_i) + eps_hat);
    w[i] = w_i;
    if (w_bf16 != nullptr) w_bf16[i] = to_bf16(w_i);
  }
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
  }
}

void DenseOptimizer::step(DenseParameters& params, const uint32_t* veto) {
  step(params.values().data(), params.grads().data(),
       params.has_bf16_copy() ? params.values_bf16().data() : nullptr, veto);
}

void DenseOptimizer::step(float* values, const float* grads, Bf16* values_bf16,
                          const uint32_t* veto) {
  ++steps_;
  const device::Stream& stream = card_->stream();
  if (config_.kind == DenseOptimizerKind::kSgd) {
    device::parallel_for(stream, size_,
                         SgdStep{values, values_bf16, grads, config_.learning_rate, veto});
    return;
  }
  // Bias corrections in double on the host: identical on every card, exact for long runs.
  const double t = static_cast<double>(steps_);
  const double b1_pow = std::pow(static_cast<double>(config_.beta1), t);
  const double b2_pow = std::pow(static_cast<double>(config_.beta2), t);
  const double correction = std::sqrt(1.0 - b2_pow);
  const auto lr_t = static_cast<float>(config_.learning_rate * correction / (1.0 - b1_pow));
  const auto eps_hat = static_cast<float>(config_.epsilon * correction);
  device::parallel_for(stream, size_,
                       AdamStep{values, values_bf16, grads, m_.data(), v_.data(), config_.beta1,
                                config_.beta2, lr_t, eps_hat, veto});
}

}  // namespace gpubox::trainer
