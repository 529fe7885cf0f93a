// The elementwise work the cross networks' layers share (CrossNet, layers.hpp): functors over the
// entries, rows or columns of [B x dim] row-major matrices, for parallel_for. Included by
// cross_net.cu, cross_vector.cu and cross_mix.cu only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/macros.hpp"
#include "trainer/nn/device_math.cuh"

namespace gpubox::trainer::detail {

// Entry (i, j) of a [B x dim] matrix from a flat index.
struct Entry {
  int64_t i;
  int64_t j;
};
GPUBOX_HD GPUBOX_FORCEINLINE Entry entry(std::size_t flat, int dim) {
  const auto d = static_cast<int64_t>(dim);
  return Entry{static_cast<int64_t>(flat) / d, static_cast<int64_t>(flat) % d};
}

inline std::size_t entries(int64_t batch, int dim) {
  return static_cast<std::size_t>(batch) * static_cast<std::size_t>(dim);
}

// pre[i, j] += b[j]; out[i, j] = x0[i, j] * pre[i, j] + in[i, j] (a dcn_v2 layer, plain or
// mixture, after its GEMMs).
struct CrossCombine {
  const float* x0;
  const float* in;
  const float* bias;
  float* pre;
  float* out;
  int64_t ld;
  int dim;
  GPUBOX_HD void operator()(std::size_t flat) const {
    const Entry e = entry(flat, dim);
    const int64_t at = e.i * ld + e.j;
    const float p = pre[at] + bias[e.j];
    pre[at] = p;
    out[at] = x0[at] * p + in[at];
  }
};

// From g = dL/dx_{l+1}: dpre = g * x0; dx0 (+)= g * pre (the product's share of dL/dx0).
struct CrossBackwardProduct {
  const float* g;
  const float* x0;
  const float* pre;
  float* dpre;
  float* dx0;
  int64_t ld;
  int dim;
  bool first;  // the top layer: dx0 starts here
  GPUBOX_HD void operator()(std::size_t flat) const {
    const Entry e = entry(flat, dim);
    const int64_t at = e.i * ld + e.j;
    dpre[at] = g[at] * x0[at];
    const float share = g[at] * pre[at];
    dx0[at] = first ? share : dx0[at] + share;
  }
};

// sums[j] (+)= sum over the rows of m[i, j] (one thread per column, rows in order:
// deterministic).
struct ColumnSum {
  const float* m;
  float* sums;
  int64_t rows;
  int64_t ld;
  bool accumulate = false;
  GPUBOX_HD void operator()(std::size_t j) const {
    float sum = 0.0f;
    for (int64_t i = 0; i < rows; ++i) sum += m[i * ld + static_cast<int64_t>(j)];
    sums[j] = accumulate ? sums[j] + sum : sum;
  }
};

// y[k] += alpha * x[k]: the L2 penalty's gradient term.
struct AddScaled {
  const float* x;
  float* y;
  float alpha;
  GPUBOX_HD void operator()(std::size_t k) const { y[k] += alpha * x[k]; }
};

}  // namespace gpubox::trainer::detail
