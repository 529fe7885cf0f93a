// Linear (layers.hpp): one fully connected layer's parameters and its fused GEMMs (LinearGemms).
#include <cmath>

#include "common/error.hpp"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {

const char* element_type_name(ElementType type) {
  return type == ElementType::kBf16 ? "bf16" : "fp32";
}
std::size_t element_bytes(ElementType type) { return type == ElementType::kBf16 ? 2 : 4; }

Linear::Linear(DenseParameters& params, Blas& blas, const LinearGemmSpec& spec)
    : gemms_(blas, spec) {
  // N(0, 1/in): unit-variance pre-activations for unit-variance inputs (Paddle's DNN uses the same
  // normal scale for its fc layers).
  w_ = params.add(spec.name + ".w", static_cast<std::size_t>(spec.in) * spec.out,
                  ParamInit::kNormal, 1.0f / std::sqrt(static_cast<float>(spec.in)));
  b_ = params.add(spec.name + ".b", static_cast<std::size_t>(spec.out), ParamInit::kZero);
}

const void* Linear::weights(const DenseParameters& params) const {
  if (spec().input == ElementType::kF32) return params.values(w_);
  GPUBOX_EXPECTS(params.has_bf16_copy(), "layer ", spec().name,
                 " reads bf16 weights but the parameters keep no bf16 copy");
  return params.values_bf16(w_);
}

void Linear::forward(const DenseParameters& params, const void* x, void* y, int64_t batch) {
  gemms_.forward(x, weights(params), params.values(b_),
                 params.has_bf16_copy() ? params.values_bf16(b_) : nullptr, y, batch);
}

void Linear::backward_weights(DenseParameters& params, const void* x, const void* dz,
                              int64_t batch) {
  gemms_.backward_weights(x, dz, params.grads(w_), params.grads(b_), batch);
}

void Linear::backward_data(const DenseParameters& params, const void* dz, const void* x,
                           const Linear* producer, float alpha, void* dx, int64_t batch) {
  gemms_.backward_data(dz, weights(params), x, producer != nullptr ? &producer->gemms_ : nullptr,
                       alpha, dx, batch);
}

}  // namespace gpubox::trainer
