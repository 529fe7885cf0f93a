// lane_max<kLanes>(p, n): the maximum of p[0 .. n) as a scan takes it (`top = p[j] > top ? p[j] :
// top` from -inf), over kLanes lanes and then across them, so that the cpu vectorizes the loop. A
// maximum is exact, so the value is the scan's; NaNs are never taken in either form (all NaN, or
// n = 0: -inf); only of zeros of both signs may the two take a different sign.
// tests/trainer/autoint_test.cu compares it bit for bit with the scan.
#pragma once

#include <cmath>

#include "common/macros.hpp"

namespace gpubox::trainer::detail {

template <int kLanes>
GPUBOX_HD GPUBOX_FORCEINLINE float lane_max(const float* __restrict__ p, int n) {
  float lane[kLanes];
  for (int m = 0; m < kLanes; ++m) lane[m] = -INFINITY;
  int j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int m = 0; m < kLanes; ++m) lane[m] = p[j + m] > lane[m] ? p[j + m] : lane[m];
  }
  float top = -INFINITY;
  for (int m = 0; m < kLanes; ++m) top = lane[m] > top ? lane[m] : top;
  for (; j < n; ++j) top = p[j] > top ? p[j] : top;
  return top;
}

}  // namespace gpubox::trainer::detail
