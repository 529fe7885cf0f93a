// autoint's field embeddings and interacting layers (AutointPart, autoint_part.hpp): forward and
// backward. Portable: GEMMs through the card's Blas, the rest parallel_for over items that each
// own the values they write (no atomics; sums in a fixed order, so runs are deterministic).
//
// Backward of layer l from G = scale * dL/dH^{l+1} (rows r = b F + i, a = A / heads):
//   LayerNorm:  xhat = (Y - mean) rstd; dgamma = sum_r G xhat, dbeta = sum_r G;
//               dY = rstd (G gamma - mean(G gamma) - xhat mean(G gamma xhat))
//   dO = dR' = dY [Y > 0]  (dR = dR' [R > 0] with use_residual)
//   per head:   dP_ij = dO_i . V_j;  dS_ij = P_ij (dP_ij - sum_j' P_ij' dP_ij') / (sqrt(a) | 1)
//               dQ_i = [Q_i > 0] sum_j dS_ij K_j;  dK_j = [K_j > 0] sum_i dS_ij Q_i;
//               dV_j = [V_j > 0] sum_i P_ij dO_i
//   dW = H^T [dQ | dK | dV | dR],  dH^l = [dQ | dK | dV | dR] W^T.
#include <cmath>
#include <utility>

#include "common/error.hpp"
#include "heterps/device/isa_clones.cuh"
#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/autoint_part.hpp"
#include "trainer/nn/detail/exp_f_loop.cuh"
#include "trainer/nn/detail/lane_max.cuh"

namespace gpubox::trainer {
namespace {

constexpr float kLayerNormEps = 1e-8f;  // net.py's LayerNorm(epsilon=1e-08)

// Item (r = b F + f, d): H^0[r, d] = slot f's pooled embedx_w[d], or dense feature i's x_i e_i[d].
struct BuildFields {
  const float* pooled;
  int64_t pooled_ld;
  const float* dense;
  const float* dense_w;
  float* x0;
  int slots;
  int dense_dim;
  int width;
  int slot_width;
  int embedx_column;
  GPUBOX_HD void operator()(std::size_t item) const {
    const int fields = slots + dense_dim;
    const auto r = static_cast<int64_t>(item / static_cast<std::size_t>(width));
    const int d = static_cast<int>(item % static_cast<std::size_t>(width));
    const int64_t b = r / fields;
    const int f = static_cast<int>(r % fields);
    x0[item] = f < slots ? pooled[b * pooled_ld + f * slot_width + embedx_column + d]
                         : dense[b * dense_dim + (f - slots)] * dense_w[(f - slots) * width + d];
  }
};

// Item (b, c) of the DNN input: c < F D is H^0[b F + c / D, c % D]; the ones behind it are the
// slots' cvm features.
struct BuildDnnInput {
  const float* x0;
  const float* pooled;
  int64_t pooled_ld;
  float* out;
  int64_t ld;
  int cols;
  int embedding_cols;
  int slot_width;
  GPUBOX_HD void operator()(std::size_t item) const {
    const auto b = static_cast<int64_t>(item / static_cast<std::size_t>(cols));
    const int c = static_cast<int>(item % static_cast<std::size_t>(cols));
    const int cvm = c - embedding_cols;
    out[b * ld + c] = cvm < 0 ? x0[b * embedding_cols + c]
                              : pooled[b * pooled_ld + (cvm / 2) * slot_width + cvm % 2];
  }
};

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
};

#if !defined(GPUBOX_BACKEND_CUDA)
// cpu: how many rows the row functors below (SoftmaxRows, ResidualNorm, NormBack, SoftmaxBackRows)
// take at once in their run_range forms. Each row's sums keep their order; side by side, the
// rows' chains of dependent additions overlap instead of one row's chain waiting on the last.
constexpr int kRowsAtOnce = 4;

// cpu: rows [begin, end) of a row functor, kRowsAtOnce at a time through its rows<kRowsAtOnce>,
// the rest one by one.
template <class RowFunctor>
void run_rows(const RowFunctor& f, std::size_t begin, std::size_t end) {
  auto r = static_cast<int64_t>(begin);
  const auto stop = static_cast<int64_t>(end);
  for (; r + kRowsAtOnce <= stop; r += kRowsAtOnce) f.template rows<kRowsAtOnce>(r);
  for (; r < stop; ++r) f.template rows<1>(r);
}
#endif

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
  GPUBOX_HD void operator()(std::size_t item) const { rows<1>(static_cast<int64_t>(item)); }
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const { run_rows(*this, begin, end); }
#endif
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
  GPUBOX_HD void operator()(std::size_t item) const { rows<1>(static_cast<int64_t>(item)); }
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const { run_rows(*this, begin, end); }
#endif
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
  GPUBOX_HD void operator()(std::size_t item) const { rows<1>(static_cast<int64_t>(item)); }
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const { run_rows(*this, begin, end); }
#endif
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
  GPUBOX_HD void operator()(std::size_t item) const { rows<1>(static_cast<int64_t>(item)); }
#if !defined(GPUBOX_BACKEND_CUDA)
  void run_range(std::size_t begin, std::size_t end) const { run_rows(*this, begin, end); }
#endif
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

// One operand of the per-head GEMMs: instance b's head h block starts at
// base + b * stride + h * head_step, its rows `ld` apart.
template <typename T>
struct HeadBlock {
  T* base;
  int64_t ld;
  int64_t stride;
  int64_t head_step;
};

// For every head h, over the batch's instances: C_h = alpha op(A_h) op(B_h) [m x n], k inner:
// one batched GEMM per head (a head's blocks are evenly strided over the instances; the heads'
// offsets are not a multiple of that stride).
void head_gemms(const Blas& blas, int heads, int64_t batch, int64_t m, int64_t n, int64_t k,
                float alpha, Transpose ta, HeadBlock<const float> a, Transpose tb,
                HeadBlock<const float> b, HeadBlock<float> c) {
  for (int h = 0; h < heads; ++h) {
    blas.sgemm_batched(ta, tb, m, n, k, alpha, a.base + h * a.head_step, a.ld, a.stride,
                       b.base + h * b.head_step, b.ld, b.stride, 0.0f, c.base + h * c.head_step,
                       c.ld, c.stride, batch);
  }
}

// G[b, c] = scale * dlogits[b] * w_out[c] (c over F A_L: the flattened last layer).
struct OutputGrad {
  const float* dlogits;
  const float* w_out;
  float* g;
  float scale;
  int cols;
  GPUBOX_HD void operator()(std::size_t item) const {
    const std::size_t b = item / static_cast<std::size_t>(cols);
    g[item] = scale * dlogits[b] * w_out[item % static_cast<std::size_t>(cols)];
  }
#if !defined(GPUBOX_BACKEND_CUDA)
  // cpu: one division per row instead of per item, the row's products in a loop that vectorizes
  // (the same products: scale * dlogits[b] is the left one either way).
  void run_range(std::size_t begin, std::size_t end) const {
    device::for_row_segments(begin, end, cols, [this](int64_t b, int64_t c0, int64_t c1) {
      const float row = scale * dlogits[b];
      const float* __restrict__ w = w_out;
      float* __restrict__ gr = g + b * cols;
      for (int64_t c = c0; c < c1; ++c) gr[c] = row * w[c];
    });
  }
#endif
};

// dH^0[b, c] += the DNN's dL/d(input)[b, c] for c < F D.
struct AddDnnGrad {
  const float* dnn_dx;
  int64_t ld;
  float* dx0;
  int cols;
  GPUBOX_HD void operator()(std::size_t item) const {
    const auto b = static_cast<int64_t>(item / static_cast<std::size_t>(cols));
    dx0[item] += dnn_dx[b * ld + static_cast<int64_t>(item % static_cast<std::size_t>(cols))];
  }
};

// d_pooled[b, c] = unscale * dH^0 for slot c / slot_width's embedx column, 0 elsewhere.
struct ScatterPooledGrad {
  const float* dx0;
  float* d_pooled;
  int pooled_cols;
  int slot_width;
  int embedx_column;
  int fields;
  int width;
  float unscale;
  GPUBOX_HD void operator()(std::size_t item) const {
    const auto b = static_cast<int64_t>(item / static_cast<std::size_t>(pooled_cols));
    const int c = static_cast<int>(item % static_cast<std::size_t>(pooled_cols));
    const int s = c / slot_width, d = c % slot_width - embedx_column;
    d_pooled[item] = d >= 0 ? unscale * dx0[(b * fields + s) * width + d] : 0.0f;
  }
};

// grad[i, d] = pairs[i, i D + d]: of the products sum_b x_j dH^0[b F + slots + i, d] for every
// (j, i), those of a feature with its own embedding rows.
struct DenseEmbeddingGrad {
  const float* pairs;
  float* grad;
  int dense_dim;
  int width;
  GPUBOX_HD void operator()(std::size_t item) const {
    const auto i = static_cast<int64_t>(item / static_cast<std::size_t>(width));
    grad[item] = pairs[i * dense_dim * width + static_cast<int64_t>(item)];
  }
};

std::size_t items(int64_t a, int64_t b) { return static_cast<std::size_t>(a * b); }

// O_h = softmax(Q_h K_h^T inv_scale) V_h for every instance and head, into y (P into att).
void attend(const Blas& blas, const LayerShape& s, int64_t batch, const float* pr, float* att,
            float* y) {
  const int64_t f = s.fields, a = s.head, proj = s.proj, cols = s.cols;
  const int64_t att_stride = s.heads * f * f;
  const HeadBlock<const float> q{pr, proj, f * proj, a}, k{pr + cols, proj, f * proj, a},
      v{pr + 2 * cols, proj, f * proj, a};
  head_gemms(blas, s.heads, batch, f, f, a, s.inv_scale, Transpose::kNo, q, Transpose::kYes, k,
             HeadBlock<float>{att, f, att_stride, f * f});
  device::parallel_for(blas.stream(), items(batch * s.heads, f),
                       device::isa_clones(SoftmaxRows{att, s.fields}));
  head_gemms(blas, s.heads, batch, f, a, f, 1.0f, Transpose::kNo,
             HeadBlock<const float>{att, f, att_stride, f * f}, Transpose::kNo, v,
             HeadBlock<float>{y, cols, f * cols, a});
}

// From dO: dQ, dK, dV of every instance and head into dp (the projections' gradient rows),
// through the projections' ReLUs (dS in d_s on the way).
void attend_backward(const Blas& blas, const LayerShape& s, int64_t batch, const float* pr,
                     const float* att_p, const float* d_o_p, float* d_s_p, float* dp) {
  const int64_t f = s.fields, a = s.head, proj = s.proj, cols = s.cols;
  const int64_t att_stride = s.heads * f * f;
  const HeadBlock<const float> q{pr, proj, f * proj, a}, k{pr + cols, proj, f * proj, a},
      v{pr + 2 * cols, proj, f * proj, a}, d_o{d_o_p, cols, f * cols, a},
      att{att_p, f, att_stride, f * f}, d_s{d_s_p, f, att_stride, f * f};
  // dP_h = dO_h V_h^T, then dS_h through the softmax (in place).
  head_gemms(blas, s.heads, batch, f, f, a, 1.0f, Transpose::kNo, d_o, Transpose::kYes, v,
             HeadBlock<float>{d_s_p, f, att_stride, f * f});
  device::parallel_for(blas.stream(), items(batch * s.heads, f),
                       device::isa_clones(SoftmaxBackRows{att_p, d_s_p, s.fields, s.inv_scale}));
  // dQ_h = dS_h K_h, dK_h = dS_h^T Q_h, dV_h = P_h^T dO_h; then the ReLUs of Q, K and V.
  head_gemms(blas, s.heads, batch, f, a, f, 1.0f, Transpose::kNo, d_s, Transpose::kNo, k,
             HeadBlock<float>{dp, proj, f * proj, a});
  head_gemms(blas, s.heads, batch, f, a, f, 1.0f, Transpose::kYes, d_s, Transpose::kNo, q,
             HeadBlock<float>{dp + cols, proj, f * proj, a});
  head_gemms(blas, s.heads, batch, f, a, f, 1.0f, Transpose::kYes, att, Transpose::kNo, d_o,
             HeadBlock<float>{dp + 2 * cols, proj, f * proj, a});
  device::parallel_for(blas.stream(), items(batch * f, proj),
                       device::isa_clones(MaskProjections{pr, dp}));
}

}  // namespace

void AutointPart::forward(const Blas& blas, const DenseParameters& params, const InputRows& pooled,
                          const float* dense, int64_t batch, bool with_dnn) {
  GPUBOX_EXPECTS(pooled.type == ElementType::kF32, "autoint reads the pooled slots as fp32");
  const device::Stream& stream = blas.stream();
  const auto* rows_in = static_cast<const float*>(pooled.data);
  const int64_t rows = batch * fields();
  device::parallel_for(
      stream, items(rows, width_),
      BuildFields{rows_in, pooled.ld, dense, dense_dim_ > 0 ? params.values(dense_w_) : nullptr,
                  x0_.data(), slots_, dense_dim_, width_, slot_width_, embedx_column_});
  if (with_dnn) {
    device::parallel_for(stream, items(batch, dnn_in()),
                         BuildDnnInput{x0_.data(), rows_in, pooled.ld, dnn_x_.data(), dnn_ld_,
                                       dnn_in(), embedding_cols(), slot_width_});
  }
  for (std::size_t l = 0; l < sizes_.size(); ++l) {
    const int in = in_cols(l), cols = proj_cols(l), a = sizes_[l] / heads_;
    blas.sgemm(Transpose::kNo, Transpose::kNo, rows, cols, in, 1.0f, layer_input(l), in,
               params.values(w_[l]), cols, 0.0f, proj_[l].data(), cols);
    device::parallel_for(stream, items(rows, cols),
                         device::isa_clones(ReluInPlace{proj_[l].data()}));
    const LayerShape shape{fields(), sizes_[l],
                           cols,     heads_,
                           a,        scaling_ ? 1.0f / std::sqrt(static_cast<float>(a)) : 1.0f,
                           residual_};
    attend(blas, shape, batch, proj_[l].data(), att_[l].data(), y_[l].data());
    device::parallel_for(stream, static_cast<std::size_t>(rows),
                         device::isa_clones(ResidualNorm{proj_[l].data(), params.values(gamma_[l]),
                                                         params.values(beta_[l]), y_[l].data(),
                                                         stats_[l].data(), out_[l].data(), shape}));
  }
}

void AutointPart::add_logits(const Blas& blas, const DenseParameters& params, int64_t batch,
                             float* logits) const {
  const int flat = fields() * sizes_.back();
  blas.sgemv(Transpose::kNo, batch, flat, 1.0f, out_.back().data(), flat, params.values(w_out_),
             1.0f, logits);
}

void AutointPart::backward_layer(const Blas& blas, DenseParameters& params, std::size_t l,
                                 int64_t batch, float* d_out, float* d_in) {
  const device::Stream& stream = blas.stream();
  const int64_t rows = batch * fields();
  const int in = in_cols(l), cols = proj_cols(l), a = sizes_[l] / heads_;
  const LayerShape shape{fields(), sizes_[l],
                         cols,     heads_,
                         a,        scaling_ ? 1.0f / std::sqrt(static_cast<float>(a)) : 1.0f,
                         residual_};
  // dgamma and dbeta: column sums of G xhat (in d_o_, free until NormBack) and of G.
  device::parallel_for(stream, items(rows, sizes_[l]),
                       device::isa_clones(GradTimesXhat{d_out, y_[l].data(), stats_[l].data(),
                                                        d_o_.data(), sizes_[l]}));
  blas.sgemv(Transpose::kYes, rows, sizes_[l], 1.0f, d_o_.data(), sizes_[l], ones_.data(), 0.0f,
             params.grads(gamma_[l]));
  blas.sgemv(Transpose::kYes, rows, sizes_[l], 1.0f, d_out, sizes_[l], ones_.data(), 0.0f,
             params.grads(beta_[l]));
  device::parallel_for(
      stream, static_cast<std::size_t>(rows),
      device::isa_clones(NormBack{d_out, y_[l].data(), stats_[l].data(), params.values(gamma_[l]),
                                  d_o_.data(), d_proj_.data(), shape}));
  attend_backward(blas, shape, batch, proj_[l].data(), att_[l].data(), d_o_.data(), d_s_.data(),
                  d_proj_.data());
  blas.sgemm(Transpose::kYes, Transpose::kNo, in, cols, rows, 1.0f, layer_input(l), in,
             d_proj_.data(), cols, 0.0f, params.grads(w_[l]), cols);
  blas.sgemm(Transpose::kNo, Transpose::kYes, rows, in, cols, 1.0f, d_proj_.data(), cols,
             params.values(w_[l]), cols, 0.0f, d_in, in);
}

void AutointPart::backward(const Blas& blas, DenseParameters& params, const float* dense,
                           const float* dlogits, float scale, int64_t batch, bool with_dnn,
                           float unscale, float* d_pooled) {
  const device::Stream& stream = blas.stream();
  const int flat = fields() * sizes_.back();
  float* g = g_a_.data();
  float* spare = g_b_.data();
  device::parallel_for(
      stream, items(batch, flat),
      device::isa_clones(OutputGrad{dlogits, params.values(w_out_), g, scale, flat}));
  blas.sgemv(Transpose::kYes, batch, flat, scale, out_.back().data(), flat, dlogits, 0.0f,
             params.grads(w_out_));
  for (std::size_t l = sizes_.size(); l-- > 0;) {
    backward_layer(blas, params, l, batch, g, l > 0 ? spare : dx0_.data());
    std::swap(g, spare);
  }
  if (with_dnn) {
    device::parallel_for(stream, items(batch, embedding_cols()),
                         AddDnnGrad{dnn_dx_.data(), dnn_ld_, dx0_.data(), embedding_cols()});
  }
  const int pool_cols = slots_ * slot_width_;
  device::parallel_for(stream, items(batch, pool_cols),
                       ScatterPooledGrad{dx0_.data(), d_pooled, pool_cols, slot_width_,
                                         embedx_column_, fields(), width_, unscale});
  if (dense_dim_ > 0) {
    // pairs = X^T dH^0's dense rows, viewed [B x dense_dim D] (row stride F D): one GEMM.
    const int fields_ld = fields() * width_;
    blas.sgemm(Transpose::kYes, Transpose::kNo, dense_dim_, dense_dim_ * width_, batch, 1.0f, dense,
               dense_dim_, dx0_.data() + static_cast<int64_t>(slots_) * width_, fields_ld, 0.0f,
               dense_pairs_.data(), dense_dim_ * width_);
    device::parallel_for(
        stream, items(dense_dim_, width_),
        DenseEmbeddingGrad{dense_pairs_.data(), params.grads(dense_w_), dense_dim_, width_});
  }
}

}  // namespace gpubox::trainer
