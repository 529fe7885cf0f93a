// The elementwise work of the cross networks' layers (CrossNet, layers.hpp): functors over the
// entries, rows or columns of [B x dim] row-major matrices, for parallel_for, each entrywise one
// with the cpu's run_range form (bit-equal to its per-entry calls; cross_net_test.cu checks it).
// Included by cross_net.cu, cross_vector.cu, cross_mix.cu and their test only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/macros.hpp"
#include "heterps/device/parallel_for.cuh"
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

#if !defined(GPUBOX_BACKEND_CUDA)
using device::for_row_segments;  // the cpu run_range forms' walk over a row's entries
#endif

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
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const {
    for_row_segments(begin, end, dim, [this](int64_t i, int64_t j0, int64_t j1) {
      const float* __restrict x0_row = x0 + i * ld;
      const float* __restrict in_row = in + i * ld;
      const float* __restrict b = bias;
      float* __restrict pre_row = pre + i * ld;
      float* __restrict out_row = out + i * ld;
      for (int64_t j = j0; j < j1; ++j) {
        const float p = pre_row[j] + b[j];
        pre_row[j] = p;
        out_row[j] = x0_row[j] * p + in_row[j];
      }
    });
  }
#endif
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
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const {
    for_row_segments(begin, end, dim, [this](int64_t i, int64_t j0, int64_t j1) {
      const float* __restrict g_row = g + i * ld;
      const float* __restrict x0_row = x0 + i * ld;
      const float* __restrict pre_row = pre + i * ld;
      float* __restrict dpre_row = dpre + i * ld;
      float* __restrict dx0_row = dx0 + i * ld;
      for (int64_t j = j0; j < j1; ++j) dpre_row[j] = g_row[j] * x0_row[j];
      if (first) {
        for (int64_t j = j0; j < j1; ++j) dx0_row[j] = g_row[j] * pre_row[j];
      } else {
        for (int64_t j = j0; j < j1; ++j) dx0_row[j] = dx0_row[j] + g_row[j] * pre_row[j];
      }
    });
  }
#endif
};

// out[i, j] = x0[i, j] * s[i] + b[j] + in[i, j].
struct VectorCombine {
  const float* x0;
  const float* in;
  const float* s;
  const float* bias;
  float* out;
  int64_t ld;
  int dim;
  GPUBOX_HD void operator()(std::size_t flat) const {
    const Entry e = entry(flat, dim);
    const int64_t at = e.i * ld + e.j;
    out[at] = x0[at] * s[e.i] + bias[e.j] + in[at];
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const {
    for_row_segments(begin, end, dim, [this](int64_t i, int64_t j0, int64_t j1) {
      const float* __restrict x0_row = x0 + i * ld;
      const float* __restrict in_row = in + i * ld;
      const float* __restrict b = bias;
      float* __restrict out_row = out + i * ld;
      const float s_i = s[i];
      for (int64_t j = j0; j < j1; ++j) out_row[j] = x0_row[j] * s_i + b[j] + in_row[j];
    });
  }
#endif
};

// dx0[i, j] (+)= g[i, j] * s[i].
struct VectorX0Grad {
  const float* g;
  const float* s;
  float* dx0;
  int64_t ld;
  int dim;
  bool first;  // the top layer: dx0 starts here
  GPUBOX_HD void operator()(std::size_t flat) const {
    const Entry e = entry(flat, dim);
    const int64_t at = e.i * ld + e.j;
    const float share = g[at] * s[e.i];
    dx0[at] = first ? share : dx0[at] + share;
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const {
    for_row_segments(begin, end, dim, [this](int64_t i, int64_t j0, int64_t j1) {
      const float* __restrict g_row = g + i * ld;
      float* __restrict dx0_row = dx0 + i * ld;
      const float s_i = s[i];
      if (first) {
        for (int64_t j = j0; j < j1; ++j) dx0_row[j] = g_row[j] * s_i;
      } else {
        for (int64_t j = j0; j < j1; ++j) dx0_row[j] = dx0_row[j] + g_row[j] * s_i;
      }
    });
  }
#endif
};

// d_pooled[i, j] (+)= unscale * (g[i, j] + dx0[i, j]) for the pooled columns j < cols (d_pooled's
// rows d_ld apart).
struct PooledGrad {
  const float* g;
  const float* dx0;
  float* d_pooled;
  int64_t ld;
  int64_t d_ld;
  int cols;
  float unscale;
  bool accumulate;
  GPUBOX_HD void operator()(std::size_t flat) const {
    const Entry e = entry(flat, cols);
    const int64_t at = e.i * ld + e.j;
    const float d = unscale * (g[at] + dx0[at]);
    float* out = d_pooled + e.i * d_ld + e.j;
    *out = accumulate ? *out + d : d;
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const {
    for_row_segments(begin, end, cols, [this](int64_t i, int64_t j0, int64_t j1) {
      const float* __restrict g_row = g + i * ld;
      const float* __restrict dx0_row = dx0 + i * ld;
      float* __restrict out_row = d_pooled + i * d_ld;
      const float u = unscale;
      if (accumulate) {
        for (int64_t j = j0; j < j1; ++j) out_row[j] = out_row[j] + u * (g_row[j] + dx0_row[j]);
      } else {
        for (int64_t j = j0; j < j1; ++j) out_row[j] = u * (g_row[j] + dx0_row[j]);
      }
    });
  }
#endif
};

// t[i] = g[i] . x0[i] (one thread per row, columns in order: deterministic).
struct RowDot {
  const float* g;
  const float* x0;
  float* t;
  int64_t ld;
  int dim;
  GPUBOX_HD void operator()(std::size_t i) const {
    const int64_t row = static_cast<int64_t>(i) * ld;
    float sum = 0.0f;
    for (int j = 0; j < dim; ++j) sum += g[row + j] * x0[row + j];
    t[i] = sum;
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  // cpu: kRows rows side by side, each summed in column order from 0 as above (the same bits):
  // a row's adds wait on each other, the rows' do not, so they overlap.
  void run_range(std::size_t begin, std::size_t end) const {
    constexpr std::size_t kRows = 4;
    std::size_t i = begin;
    for (; i + kRows <= end; i += kRows) {
      const int64_t first = static_cast<int64_t>(i) * ld;
      float sum[kRows] = {};
      for (int j = 0; j < dim; ++j) {
        for (std::size_t r = 0; r < kRows; ++r) {
          const int64_t at = first + static_cast<int64_t>(r) * ld + j;
          sum[r] += g[at] * x0[at];
        }
      }
      for (std::size_t r = 0; r < kRows; ++r) t[i + r] = sum[r];
    }
    for (; i < end; ++i) (*this)(i);
  }
#endif
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
#if !defined(GPUBOX_BACKEND_CUDA)
  // cpu: the same per-column sums (rows in order), a block of columns at a time walked row by row
  // (contiguous reads that vectorize) instead of one strided column after another.
  void run_range(std::size_t begin, std::size_t end) const {
    constexpr std::size_t kBlock = 64;
    for (std::size_t j0 = begin; j0 < end; j0 += kBlock) {
      const std::size_t count = std::min(kBlock, end - j0);
      float block[kBlock] = {};
      for (int64_t i = 0; i < rows; ++i) {
        const float* __restrict row = m + i * ld + static_cast<int64_t>(j0);
        for (std::size_t k = 0; k < count; ++k) block[k] += row[k];
      }
      for (std::size_t k = 0; k < count; ++k) {
        sums[j0 + k] = accumulate ? sums[j0 + k] + block[k] : block[k];
      }
    }
  }
#endif
};

// y[k] += alpha * x[k]: the L2 penalty's gradient term.
struct AddScaled {
  const float* x;
  float* y;
  float alpha;
  GPUBOX_HD void operator()(std::size_t k) const { y[k] += alpha * x[k]; }
};

}  // namespace gpubox::trainer::detail
