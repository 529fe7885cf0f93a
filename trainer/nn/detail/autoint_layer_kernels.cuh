// autoint's interacting-layer kernels (trainer/nn/autoint.cu runs them; the formulas are in its
// header comment): the parallel_for functors of a layer's ReLUs, softmax rows, residual and
// LayerNorm, and their backward. Each item owns the values it writes; sums keep a fixed order.
// The row functors say only their rows (rows<n>) and run as a RowLoop, whose cpu run_range takes
// kRowsAtOnce rows at a time; autoint.cu runs the functors through device::isa_clones, whose
// header below stops g++ builds of a source without gpubox_no_fp_contract. One includer only
// (autoint.cu): the functors are in an anonymous namespace, so that their isa_clones instances (and
// the clones' resolvers) stay local to it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "common/macros.hpp"
#include "heterps/device/isa_clones.cuh"
#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/detail/exp_f_loop.cuh"
#include "trainer/nn/detail/lane_max.cuh"

// Their own namespace: generic names (ReluInPlace, NormBack) kept apart from autoint.cu's.
namespace gpubox::trainer::detail::autoint_layers {
namespace {

constexpr float kLayerNormEps = 1e-8f;  // net.py's LayerNorm(epsilon=1e-08)

// d[c] = 0 where x[c] is not above 0, for c < n. The select reads and writes d[c] whatever the
// sign, so that the cpu vectorizes it (a select computed on one side only is a branch per value,
// mispredicted half the time on a ReLU's signs).
GPUBOX_HD inline void relu_mask(const float* __restrict__ x, float* __restrict__ d, int n) {
  for (int c = 0; c < n; ++c) d[c] = x[c] > 0.0f ? d[c] : 0.0f;
}

struct ReluInPlace {
  float* x;
  GPUBOX_HD void operator()(std::size_t item) const { x[item] = x[item] > 0.0f ? x[item] : 0.0f; }
#if !defined(GPUBOX_BACKEND_CUDA)
  // cpu: the same selects as one loop over the items, which vectorizes (a select per item, no
  // data-dependent branch).
  void run_range(std::size_t begin, std::size_t end) const {
    float* __restrict__ v = x;
    for (std::size_t i = begin; i < end; ++i) v[i] = v[i] > 0.0f ? v[i] : 0.0f;
  }
#endif
};

// One layer's shapes: proj rows are [Q | K | V | R], each `cols` wide; heads of `head` columns.
struct LayerShape {
  int fields;
  int cols;
  int proj;
  int heads;
  int head;
  float inv_scale;  // 1 / sqrt(head) with scaling, else 1
  bool residual;
  // P's (and dS's) values an instance: heads F x F.
  GPUBOX_HD int64_t att_stride() const { return static_cast<int64_t>(heads) * fields * fields; }
};

#if !defined(GPUBOX_BACKEND_CUDA)
// cpu: how many rows a RowLoop's run_range takes at once. Each row's sums keep their order; side
// by side, the rows' chains of dependent additions overlap instead of one row's chain waiting on
// the last.
constexpr int kRowsAtOnce = 4;
#endif

// The parallel_for functor of a row body (SoftmaxRows, ResidualNorm, NormBack, SoftmaxBackRows),
// whose rows<n>(r) does rows r .. r + n - 1 (a row's sums in order, n rows side by side): item r
// is rows<1>(r); on the cpu, run_range does rows [begin, end) kRowsAtOnce at a time, the rest one
// by one. The bodies say only their rows; autoint.cu runs them as row_loop(Body{...}).
template <class Body>
struct RowLoop {
  Body body;
  GPUBOX_HD void operator()(std::size_t item) const {
    body.template rows<1>(static_cast<int64_t>(item));
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const {
    auto r = static_cast<int64_t>(begin);
    const auto stop = static_cast<int64_t>(end);
    for (; r + kRowsAtOnce <= stop; r += kRowsAtOnce) body.template rows<kRowsAtOnce>(r);
    for (; r < stop; ++r) body.template rows<1>(r);
  }
#endif
};

template <class Body>
RowLoop<Body> row_loop(const Body& body) {
  return RowLoop<Body>{body};
}

// Item (b, h, i): P_h[i, .] = softmax(S_h[i, .]) in place, S_h = Q_h K_h^T inv_scale (made by
// the batched GEMMs beforehand): one row of F scores, stored at ((b H + h) F + i) F. rows<n>(i)
// does items i .. i + n - 1.
// A row's maximum is taken over kMaxLanes lanes, then across them (detail::lane_max): the same
// value as a scan (a maximum is exact; of equal zeros either sign gives the same exp(p - top), and
// NaNs are never taken in either form), in a loop the cpu vectorizes; so do the exponentials
// (exp_f_loop: glibc's expf bits on cpu, expf on the device). The sums keep their order.
struct SoftmaxRows {
  static constexpr int kMaxLanes = 8;
  float* att;
  int fields;
  template <int kRows>
  GPUBOX_HD void rows(int64_t i0) const {
    float* __restrict__ p0 = att + i0 * fields;
    for (int k = 0; k < kRows; ++k) {
      float* __restrict__ p = p0 + k * fields;
      const float top = detail::lane_max<kMaxLanes>(p, fields);
      for (int j = 0; j < fields; ++j) p[j] = detail::exp_f_loop(p[j] - top);
    }
    float sum[kRows];
    for (int k = 0; k < kRows; ++k) sum[k] = 0.0f;
    for (int j = 0; j < fields; ++j) {
      for (int k = 0; k < kRows; ++k) sum[k] += p0[k * fields + j];
    }
    for (int k = 0; k < kRows; ++k) {
      float* __restrict__ p = p0 + k * fields;
      for (int j = 0; j < fields; ++j) p[j] /= sum[k];
    }
  }
};

// Item r = b F + i: Y[r] = relu(O[r] + R[r]) in place (O made by the P V GEMMs), H^{l+1}[r] =
// LayerNorm(Y[r]); mean and 1 / std into stats[r]. rows<n>(r) does items r .. r + n - 1.
struct ResidualNorm {
  const float* proj;
  const float* gamma;
  const float* beta;
  float* y;
  float* stats;
  float* out;
  LayerShape s;
  // The selects and the output are loops of their own beside the sums (which keep their order),
  // so that the cpu vectorizes them rather than branching on each value's sign.
  template <int kRows>
  GPUBOX_HD void rows(int64_t r0) const {
    const int64_t cols = s.cols;
    for (int k = 0; k < kRows; ++k) {
      const float* __restrict__ rr = proj + (r0 + k) * s.proj + 3 * cols;
      float* __restrict__ yr = y + (r0 + k) * cols;
      if (s.residual) {
        for (int col = 0; col < s.cols; ++col) {
          const float o = yr[col] + rr[col];
          yr[col] = o > 0.0f ? o : 0.0f;
        }
      } else {
        for (int col = 0; col < s.cols; ++col) yr[col] = yr[col] > 0.0f ? yr[col] : 0.0f;
      }
    }
    const float* y0 = y + r0 * cols;
    float mean[kRows], var[kRows];
    for (int k = 0; k < kRows; ++k) mean[k] = 0.0f;
    for (int col = 0; col < s.cols; ++col) {
      for (int k = 0; k < kRows; ++k) mean[k] += y0[k * cols + col];
    }
    for (int k = 0; k < kRows; ++k) {
      mean[k] /= static_cast<float>(s.cols);
      var[k] = 0.0f;
    }
    for (int col = 0; col < s.cols; ++col) {
      for (int k = 0; k < kRows; ++k) {
        const float centred = y0[k * cols + col] - mean[k];
        var[k] += centred * centred;
      }
    }
    for (int k = 0; k < kRows; ++k) {
      const int64_t r = r0 + k;
      const float rstd = 1.0f / sqrtf(var[k] / static_cast<float>(s.cols) + kLayerNormEps);
      stats[2 * r] = mean[k];
      stats[2 * r + 1] = rstd;
      const float* __restrict__ yr = y0 + k * cols;
      float* __restrict__ outr = out + r * cols;
      for (int col = 0; col < s.cols; ++col) {
        outr[col] = gamma[col] * (yr[col] - mean[k]) * rstd + beta[col];
      }
    }
  }
};

// Item (r, c): G[r, c] xhat[r, c], whose column sums are dgamma.
struct GradTimesXhat {
  const float* g;
  const float* y;
  const float* stats;
  float* out;
  int cols;
  GPUBOX_HD void operator()(std::size_t item) const {
    const auto r = static_cast<int64_t>(item / static_cast<std::size_t>(cols));
    out[item] = g[item] * (y[item] - stats[2 * r]) * stats[2 * r + 1];
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  // cpu: a row's statistics read once, its values in one loop that vectorizes.
  void run_range(std::size_t begin, std::size_t end) const {
    device::for_row_segments(begin, end, cols, [this](int64_t r, int64_t c0, int64_t c1) {
      const float mean = stats[2 * r], rstd = stats[2 * r + 1];
      const float* __restrict__ gr = g + r * cols;
      const float* __restrict__ yr = y + r * cols;
      float* __restrict__ outr = out + r * cols;
      for (int64_t c = c0; c < c1; ++c) outr[c] = gr[c] * (yr[c] - mean) * rstd;
    });
  }
#endif
};

// Item r = b F + i: dO[r] through the LayerNorm and Y's ReLU, and dR[r] = dO[r] with use_residual
// (R's ReLU is MaskProjections', which reads the projections anyway: masking here too read R's
// columns twice, a pass over memory that was most of this kernel's time). rows<n>(r) does items
// r .. r + n - 1.
struct NormBack {
  const float* g;
  const float* y;
  const float* stats;
  const float* gamma;
  float* d_o;
  float* d_proj;
  LayerShape s;
  template <int kRows>
  GPUBOX_HD void rows(int64_t r0) const {
    const int64_t cols = s.cols;
    const float* __restrict__ g0 = g + r0 * cols;
    const float* __restrict__ y0 = y + r0 * cols;
    float mean[kRows], rstd[kRows], m1[kRows], m2[kRows];
    for (int k = 0; k < kRows; ++k) {
      mean[k] = stats[2 * (r0 + k)];
      rstd[k] = stats[2 * (r0 + k) + 1];
      m1[k] = 0.0f;
      m2[k] = 0.0f;
    }
    for (int c = 0; c < s.cols; ++c) {
      for (int k = 0; k < kRows; ++k) {
        const float dxhat = g0[k * cols + c] * gamma[c];
        m1[k] += dxhat;
        m2[k] += dxhat * (y0[k * cols + c] - mean[k]) * rstd[k];
      }
    }
    for (int k = 0; k < kRows; ++k) {
      const int64_t r = r0 + k;
      const float* __restrict__ gr = g0 + k * cols;
      const float* __restrict__ yr = y0 + k * cols;
      const float mean1 = m1[k] / static_cast<float>(s.cols);
      const float mean2 = m2[k] / static_cast<float>(s.cols);
      float* __restrict__ dor = d_o + r * cols;
      for (int c = 0; c < s.cols; ++c) {
        const float xhat = (yr[c] - mean[k]) * rstd[k];
        dor[c] = rstd[k] * (gr[c] * gamma[c] - mean1 - xhat * mean2);
      }
      relu_mask(yr, dor, s.cols);
      if (!s.residual) continue;
      // dR before R's ReLU: MaskProjections masks it with the Q, K and V columns.
      float* __restrict__ dpr = d_proj + r * s.proj + 3 * cols;
      for (int c = 0; c < s.cols; ++c) dpr[c] = dor[c];
    }
  }
};

// Item (b, h, i): dS_h[i, .] = P_h[i, .] (dP_h[i, .] - P_h[i, .] . dP_h[i, .]) inv_scale in
// place over dP_h = dO_h V_h^T (made by the batched GEMMs beforehand). rows<n>(i) does items
// i .. i + n - 1.
struct SoftmaxBackRows {
  const float* att;
  float* d_s;
  int fields;
  float inv_scale;
  template <int kRows>
  GPUBOX_HD void rows(int64_t i0) const {
    const float* __restrict__ p0 = att + i0 * fields;
    float* __restrict__ ds0 = d_s + i0 * fields;
    float weighted[kRows];
    for (int k = 0; k < kRows; ++k) weighted[k] = 0.0f;
    for (int j = 0; j < fields; ++j) {
      for (int k = 0; k < kRows; ++k) weighted[k] += p0[k * fields + j] * ds0[k * fields + j];
    }
    for (int k = 0; k < kRows; ++k) {
      const float* __restrict__ p = p0 + k * fields;
      float* __restrict__ ds = ds0 + k * fields;
      for (int j = 0; j < fields; ++j) ds[j] = p[j] * (ds[j] - weighted[k]) * inv_scale;
    }
  }
};

// Item i of the [rows x proj] projection rows: d_proj[i] through the projection's ReLU, over every
// column (Q, K, V and R: NormBack leaves dR unmasked), so the items are the flat buffer (no
// per-item division, a loop the cpu backend vectorizes).
struct MaskProjections {
  const float* proj;
  float* d_proj;
  GPUBOX_HD void operator()(std::size_t item) const {
    d_proj[item] = proj[item] > 0.0f ? d_proj[item] : 0.0f;
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const {
    const float* __restrict__ p = proj;
    float* __restrict__ d = d_proj;
    for (std::size_t i = begin; i < end; ++i) d[i] = p[i] > 0.0f ? d[i] : 0.0f;
  }
#endif
};

}  // namespace
}  // namespace gpubox::trainer::detail::autoint_layers
