// autoint's field embeddings and interacting layers (AutointPart, autoint_part.hpp): forward and
// backward. Portable: GEMMs through the card's Blas, the rest parallel_for over items that each
// own the values they write (no atomics; sums in a fixed order, so runs are deterministic). On
// a cpu card of one thread a layer's attention runs over chunks of instances, kernel after kernel
// per chunk (attention_chunk), with the bits of one pass over the batch (each item is one row or
// value, computed alike whichever chunk holds it).
//
// Backward of layer l from G = scale * dL/dH^{l+1} (rows r = b F + i, a = A / heads):
//   LayerNorm:  xhat = (Y - mean) rstd; dgamma = sum_r G xhat, dbeta = sum_r G;
//               dY = rstd (G gamma - mean(G gamma) - xhat mean(G gamma xhat))
//   dO = dR' = dY [Y > 0]  (dR = dR' [R > 0] with use_residual)
//   per head:   dP_ij = dO_i . V_j;  dS_ij = P_ij (dP_ij - sum_j' P_ij' dP_ij') / (sqrt(a) | 1)
//               dQ_i = [Q_i > 0] sum_j dS_ij K_j;  dK_j = [K_j > 0] sum_i dS_ij Q_i;
//               dV_j = [V_j > 0] sum_i P_ij dO_i
//   dW = H^T [dQ | dK | dV | dR],  dH^l = [dQ | dK | dV | dR] W^T.
#include <algorithm>
#include <cmath>
#include <utility>

#include "common/error.hpp"
#include "heterps/device/isa_clones.cuh"
#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/autoint_part.hpp"
#include "trainer/nn/detail/autoint_layer_kernels.cuh"

namespace gpubox::trainer {
namespace {

using detail::autoint_layers::GradTimesXhat;
using detail::autoint_layers::LayerShape;
using detail::autoint_layers::MaskProjections;
using detail::autoint_layers::NormBack;
using detail::autoint_layers::ReluInPlace;
using detail::autoint_layers::ResidualNorm;
using detail::autoint_layers::row_loop;
using detail::autoint_layers::SoftmaxBackRows;
using detail::autoint_layers::SoftmaxRows;

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

// parallel_for's serial limit for a row kernel whose item is a row of `width` values: the limit
// counts values, as it does for the elementwise kernels (counted in rows, a few hundred rows of
// a small batch ran on one thread of a card of several).
std::size_t row_serial_limit(int width) {
  return device::kSerialLoopLimit / static_cast<std::size_t>(width);
}

// O_h = softmax(Q_h K_h^T inv_scale) V_h for every instance and head, into y (P into att).
void attend(const Blas& blas, const LayerShape& s, int64_t batch, const float* pr, float* att,
            float* y) {
  const int64_t f = s.fields, a = s.head, proj = s.proj, cols = s.cols;
  const int64_t att_stride = s.att_stride();
  const HeadBlock<const float> q{pr, proj, f * proj, a}, k{pr + cols, proj, f * proj, a},
      v{pr + 2 * cols, proj, f * proj, a};
  head_gemms(blas, s.heads, batch, f, f, a, s.inv_scale, Transpose::kNo, q, Transpose::kYes, k,
             HeadBlock<float>{att, f, att_stride, f * f});
  device::parallel_for(blas.stream(), items(batch * s.heads, f),
                       device::isa_clones(row_loop(SoftmaxRows{att, s.fields})),
                       row_serial_limit(s.fields));
  head_gemms(blas, s.heads, batch, f, a, f, 1.0f, Transpose::kNo,
             HeadBlock<const float>{att, f, att_stride, f * f}, Transpose::kNo, v,
             HeadBlock<float>{y, cols, f * cols, a});
}

// From dO: dQ, dK, dV of every instance and head into dp (the projections' gradient rows),
// through the projections' ReLUs (dS in d_s on the way).
void attend_backward(const Blas& blas, const LayerShape& s, int64_t batch, const float* pr,
                     const float* att_p, const float* d_o_p, float* d_s_p, float* dp) {
  const int64_t f = s.fields, a = s.head, proj = s.proj, cols = s.cols;
  const int64_t att_stride = s.att_stride();
  const HeadBlock<const float> q{pr, proj, f * proj, a}, k{pr + cols, proj, f * proj, a},
      v{pr + 2 * cols, proj, f * proj, a}, d_o{d_o_p, cols, f * cols, a},
      att{att_p, f, att_stride, f * f}, d_s{d_s_p, f, att_stride, f * f};
  // dP_h = dO_h V_h^T, then dS_h through the softmax (in place).
  head_gemms(blas, s.heads, batch, f, f, a, 1.0f, Transpose::kNo, d_o, Transpose::kYes, v,
             HeadBlock<float>{d_s_p, f, att_stride, f * f});
  device::parallel_for(
      blas.stream(), items(batch * s.heads, f),
      device::isa_clones(row_loop(SoftmaxBackRows{att_p, d_s_p, s.fields, s.inv_scale})),
      row_serial_limit(s.fields));
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

#if defined(GPUBOX_BACKEND_CUDA)
// CUDA: the whole batch in one chunk (each kernel and batched GEMM spreads over the card as it
// is; chunks would only add launches).
int64_t attention_chunk(const Blas& blas, int64_t batch) {
  (void)blas;
  return batch > 0 ? batch : 1;
}
#else
// cpu, on a card of one thread: instances in one chunk of the attention (forward_chunk,
// backward_chunk). A chunk's rows (per instance and layer: projections 40 KB, P and dS 12 KB, the
// 10 KB rows of O, dO and H^{l+1}) stay in the core's caches from the kernel that writes them to
// the products and row kernels that read them; over the whole batch (20 MB of projections a
// layer at 512) each of the six per-head products and the passes between them read their
// operands from memory again. docs/bench/h163.md timed the products alone at chunks of 4 to 512.
// On a card of several threads the whole batch is one chunk: chunks of 8 instances per thread
// there (their row kernels split over the threads) took more CPU than one pass in every round
// docs/bench/h163.md timed, each kernel a parallel region too short for its threads' hand-offs.
constexpr int64_t kAttentionChunk = 8;
int64_t attention_chunk(const Blas& blas, int64_t batch) {
  const int64_t whole = batch > 0 ? batch : 1;
  return blas.card().threads() > 1 ? whole : std::min(kAttentionChunk, whole);
}
#endif

// run(b0, n) for each chunk [b0, b0 + n) of the batch's instances, in order.
template <class Run>
void for_each_chunk(const Blas& blas, int64_t batch, Run run) {
  const int64_t chunk = attention_chunk(blas, batch);
  for (int64_t b0 = 0; b0 < batch; b0 += chunk) run(b0, std::min(chunk, batch - b0));
}

// One layer's forward buffers, [B F x cols] rows as AutointPart keeps them.
struct LayerRows {
  float* proj;   // [Q | K | V | R], proj columns
  float* att;    // P, heads F x F an instance
  float* y;      // O, then Y
  float* stats;  // mean and 1 / std, 2 a row
  float* out;    // H^{l+1}
  // The same buffers from instance b0 on (null stays null).
  LayerRows from(const LayerShape& s, int64_t b0) const {
    const int64_t r0 = b0 * s.fields;
    return LayerRows{proj + r0 * s.proj, att + b0 * s.att_stride(), y + r0 * s.cols, stats + 2 * r0,
                     out != nullptr ? out + r0 * s.cols : nullptr};
  }
};

// One layer's backward buffers: G = scale dL/dH^{l+1}, dO, dS and the projections' gradient.
struct LayerGradRows {
  const float* d_out;
  float* d_o;
  float* d_s;
  float* d_proj;
  LayerGradRows from(const LayerShape& s, int64_t b0) const {
    const int64_t r0 = b0 * s.fields;
    return LayerGradRows{d_out + r0 * s.cols, d_o + r0 * s.cols, d_s + b0 * s.att_stride(),
                         d_proj + r0 * s.proj};
  }
};

// Instances [0, n) of `at` (the projection GEMM's rows written): the projections' ReLUs, the
// attention and Y's residual, ReLU and LayerNorm. Every item is one row's (or value's) in a
// chunk as in the whole batch, so a chunked layer gives the same bits as one pass.
void forward_chunk(const Blas& blas, const LayerShape& s, int64_t n, const LayerRows& at,
                   const float* gamma, const float* beta) {
  const device::Stream& stream = blas.stream();
  const int64_t rows = n * s.fields;
  device::parallel_for(stream, items(rows, s.proj), device::isa_clones(ReluInPlace{at.proj}));
  attend(blas, s, n, at.proj, at.att, at.y);
  device::parallel_for(
      stream, static_cast<std::size_t>(rows),
      device::isa_clones(row_loop(ResidualNorm{at.proj, gamma, beta, at.y, at.stats, at.out, s})),
      row_serial_limit(s.cols));
}

// Instances [0, n) of the layer's backward from G (dgamma and dbeta summed beforehand over the
// batch): dO through the LayerNorm and ReLU, then dQ, dK, dV (and dR) into d_proj.
void backward_chunk(const Blas& blas, const LayerShape& s, int64_t n, const LayerRows& at,
                    const LayerGradRows& grad, const float* gamma) {
  device::parallel_for(blas.stream(), static_cast<std::size_t>(n * s.fields),
                       device::isa_clones(row_loop(
                           NormBack{grad.d_out, at.y, at.stats, gamma, grad.d_o, grad.d_proj, s})),
                       row_serial_limit(s.cols));
  attend_backward(blas, s, n, at.proj, at.att, grad.d_o, grad.d_s, grad.d_proj);
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
    const LayerShape shape{fields(), sizes_[l],
                           cols,     heads_,
                           a,        scaling_ ? 1.0f / std::sqrt(static_cast<float>(a)) : 1.0f,
                           residual_};
    const LayerRows at{proj_[l].data(), att_[l].data(), y_[l].data(), stats_[l].data(),
                       out_[l].data()};
    for_each_chunk(blas, batch, [&](int64_t b0, int64_t n) {
      forward_chunk(blas, shape, n, at.from(shape, b0), params.values(gamma_[l]),
                    params.values(beta_[l]));
    });
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
  const LayerRows at{proj_[l].data(), att_[l].data(), y_[l].data(), stats_[l].data(), nullptr};
  const LayerGradRows grad{d_out, d_o_.data(), d_s_.data(), d_proj_.data()};
  for_each_chunk(blas, batch, [&](int64_t b0, int64_t n) {
    backward_chunk(blas, shape, n, at.from(shape, b0), grad.from(shape, b0),
                   params.values(gamma_[l]));
  });
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
