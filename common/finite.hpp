// Whether a value is finite (not a NaN, not an inf), with one spelling for GPUBOX_HD code on the
// card and on the host: the device math library's isfinite under nvcc's device pass, std::isfinite
// elsewhere. Shared by heterps (the clip's global norm), which may not include trainer's headers,
// and trainer (the dense checks).
#pragma once

#include <cmath>
#include <type_traits>

#include "common/macros.hpp"

namespace gpubox {

// Real: float or double (device code has an isfinite of each).
template <class Real>
GPUBOX_HD GPUBOX_FORCEINLINE bool is_finite(Real x) {
  static_assert(std::is_floating_point_v<Real>, "is_finite: float or double");
#if GPUBOX_ON_DEVICE
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

}  // namespace gpubox
