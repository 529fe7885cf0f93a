// Small math helpers for GPUBOX_HD functors: the same spelling on host and device.
#pragma once

#include <cmath>

#include "common/macros.hpp"

namespace gpubox::trainer::detail {

GPUBOX_HD GPUBOX_FORCEINLINE float log1p_f(float x) {
#if GPUBOX_ON_DEVICE
  return log1pf(x);
#else
  return std::log1p(x);
#endif
}

GPUBOX_HD GPUBOX_FORCEINLINE double exp_d(double x) {
#if GPUBOX_ON_DEVICE
  return ::exp(x);
#else
  return std::exp(x);
#endif
}

GPUBOX_HD GPUBOX_FORCEINLINE double log1p_d(double x) {
#if GPUBOX_ON_DEVICE
  return ::log1p(x);
#else
  return std::log1p(x);
#endif
}

GPUBOX_HD GPUBOX_FORCEINLINE float sqrt_f(float x) {
#if GPUBOX_ON_DEVICE
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}

GPUBOX_HD GPUBOX_FORCEINLINE float tanh_f(float x) {
#if GPUBOX_ON_DEVICE
  return tanhf(x);
#else
  return std::tanh(x);
#endif
}

GPUBOX_HD GPUBOX_FORCEINLINE float exp_f(float x) {
#if GPUBOX_ON_DEVICE
  return expf(x);
#else
  return std::exp(x);
#endif
}

// Logistic function without overflow for large |z|.
GPUBOX_HD GPUBOX_FORCEINLINE float sigmoid(float z) {
  if (z >= 0.0f) {
    return static_cast<float>(1.0 / (1.0 + exp_d(-static_cast<double>(z))));
  }
  const double e = exp_d(static_cast<double>(z));
  return static_cast<float>(e / (1.0 + e));
}

// -[y log p + (1-y) log(1-p)] with p = sigmoid(z), from the logit: never log(0).
GPUBOX_HD GPUBOX_FORCEINLINE double log_loss_from_logit(float z, float y) {
  const double zd = z;
  const double pos = zd > 0.0 ? zd : 0.0;
  const double abs_z = zd > 0.0 ? zd : -zd;
  return pos - static_cast<double>(y) * zd + log1p_d(exp_d(-abs_z));
}

}  // namespace gpubox::trainer::detail
