// fat_deepffm's attention and field-aware interactions (FAT-DeepFFM, Zhang et al. 2019;
// PaddleRec's models/rank/fat_deepffm net.py), the part of the dense model that feeds its DNN and
// adds the first-order term to the logit:
//
//   fields   N = S slots + D dense features; every field holds one k-vector toward each field
//            (k = mf_dim / N, ffm's rows: config::row_embedx_width): F[i, j] (N^2 vectors)
//            slot s: its pooled embedx_w, columns j*k .. j*k+k; dense feature d: x_d E[d, j]
//            (E: fat_deepffm.dense_w, [D x N x k], 1 at start as PaddleRec's dense_w)
//   CEN      p[i*N+j] = max_e F[i, j][e]                    (AdaptiveMaxPool1D over the vector)
//            a = relu(relu(p W0 + b0) W1 + b1)              (cen.fc_0, cen.fc_1: N^2 x N^2,
//                                                            PaddleRec's reduction 1)
//            O[i, j] = a[i*N+j] F[i, j]
//   first    y1 = sum over every i, j, e of O[i, j][e]     (added to the logit; PaddleRec's
//            DeepFFM first-order term, the diagonal i = j included)
//   pairs    H_p = O[i, j] * O[j, i] (Hadamard, k values) for p = (i, j), i < j, in
//            itertools.combinations order
//   DNN input = [H (P k) | with use_cvm each slot's show/click features (no gradient)]: the
//            model's fc layers (layer_sizes_dnn) read it; logit = y1 + the DNN's output.
//
// Gradients follow the MLP's convention (layers.hpp): dL/d(DNN input) arrives multiplied by the
// dense scale, y1's share is the unscaled dlogits times the scale, CEN's GEMMs run on scaled
// gradients (so their weight gradients come out scaled), and the pooled gradient handed to the
// sparse side multiplies it back out. The max pool's gradient goes to the first maximal value
// (argmax kept from the forward).
//
// Owns its blocks (fat_deepffm.dense_w and CEN's two Linears in the model's DenseParameters) and
// every buffer named here. fp32 throughout. Portable: GEMMs and GEMVs through the model's Blas
// (CEN's Linears; y1's sum over a row's cells; the sum of dense_w's gradient over chunks of the
// batch) and parallel_for over items that each own what they write (sums in a fixed order, no
// atomics: runs are deterministic). No item loops over the batch (dense_w's partial sums loop over
// one chunk of it), and the launches of a forward or backward do not depend on its size
// (fat_deepffm_test counts them).
// Thread-safety: one card's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "trainer/nn/blas.hpp"
#include "trainer/nn/dense_model_types.hpp"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {

class FatDeepffmPart {
 public:
  // Registers the blocks in `params` (before params.finalize()). Throws gpubox::Error naming the
  // key when the slots differ in width (hyper_parameters.slot_dims), there is no field pair or
  // the rows' width is no whole number of factors per field.
  FatDeepffmPart(device::Card& card, DenseParameters& params, Blas& blas, const SlotSumPool& pool,
                 const DenseModelConfig& config);
  FatDeepffmPart(const FatDeepffmPart&) = delete;
  FatDeepffmPart& operator=(const FatDeepffmPart&) = delete;

  int fields() const { return slots_ + dense_dim_; }
  int pairs() const { return fields() * (fields() - 1) / 2; }
  int factor_dim() const { return k_; }
  // The DNN input's columns: embedding_cols(), then 2 per slot with cvm.
  int dnn_in() const { return embedding_cols() + (use_cvm_ ? 2 * slots_ : 0); }
  int embedding_cols() const { return pairs() * k_; }  // the pairs' Hadamard products
  int64_t dnn_ld() const { return dnn_ld_; }
  // dense_w's gradient sums the batch in chunks of dense_w_chunk_rows(batch) instances (at least
  // kDenseWGradChunkRows, at most kDenseWGradChunks chunks), then sums the chunks: a workspace of
  // kDenseWGradChunks x D N k floats whatever the batch. The chunks depend on the batch alone, so
  // the gradient's bits do not depend on the thread count.
  static constexpr int64_t kDenseWGradChunks = 64;
  static constexpr int64_t kDenseWGradChunkRows = 16;
  static int64_t dense_w_chunk_rows(int64_t batch);
  // Multiply-adds x2 of one example's CEN (its two layers' forward, weight and input gradients)
  // and its elementwise work by hand (pool, attention, first-order term, pairs, their backward).
  double flops_per_example() const;
  std::string kernel_report(int64_t batch) const;

  // Sizes the buffers and plans CEN's GEMMs for batches of up to `batch` instances.
  void reserve(int64_t batch);
  // F, CEN's attention and the DNN input from the pooled slots (`x0`: the pool's fp32 rows) and
  // the dense features ([B x dense_dim] floats).
  void forward(const device::Stream& stream, const DenseParameters& params, const InputRows& x0,
               const float* dense, int64_t batch);
  // [B x dnn_in()] floats, row stride dnn_ld(): the DNN's first layer reads it.
  const float* dnn_input() const { return dnn_x_.data(); }
  // Where the DNN's first layer writes scale * dL/d(DNN input), its first embedding_cols()
  // columns.
  float* dnn_input_grad() { return dnn_dx_.data(); }
  // logits[i] += y1.
  void add_logits(const device::Stream& stream, int64_t batch, float* logits) const;
  // From the unscaled dlogits and dnn_input_grad(): CEN's and E's gradients (scaled by `scale`)
  // and d_pooled ([B x pool out_dim] floats, overwritten) = unscale * dL/d(embedx_w) in each
  // slot's embedx columns, 0 in its other columns (embed_w is read by no term).
  void backward(const device::Stream& stream, DenseParameters& params, const float* dense,
                const float* dlogits, float scale, int64_t batch, float unscale, float* d_pooled);

 private:
  int slots_;
  int dense_dim_;
  const Blas* blas_;  // the model's, on this card's stream
  int k_ = 0;
  bool use_cvm_;
  int slot_width_;     // the pool's block width per slot
  int embedx_column_;  // embedx_w's first column inside a slot's block
  int64_t cen_ld_;     // row stride of the [B x N^2] buffers
  int64_t dnn_ld_;
  std::size_t dense_w_ = 0;                    // fat_deepffm.dense_w: [D x N x k]
  Linear fc0_;                                 // cen.fc_0
  Linear fc1_;                                 // cen.fc_1
  device::device_buffer<float> feat_;          // F: [B x N^2 x k]
  device::device_buffer<int32_t> argmax_;      // the max pool's e: [B x N^2]
  device::device_buffer<float> pooled_;        // p: [B x cen_ld]
  device::device_buffer<float> hidden_;        // relu(p W0 + b0)
  device::device_buffer<float> attn_;          // a
  device::device_buffer<float> first_;         // a[cell] sum_e F[cell][e]: [B x cen_ld]
  device::device_buffer<float> ones_;          // max(N^2, 64) ones, for the GEMVs
  device::device_buffer<float> dnn_x_;         // the DNN input
  device::device_buffer<float> dnn_dx_;        // scale * dL/d(DNN input)
  device::device_buffer<float> d_attn_;        // scale * dL/d(fc_1's pre-activation)
  device::device_buffer<float> d_hidden_;      // scale * dL/d(fc_0's pre-activation)
  device::device_buffer<float> d_pool_;        // scale * dL/dp
  device::device_buffer<float> dense_w_sums_;  // dE per chunk of the batch: [64 x D N k]
};

}  // namespace gpubox::trainer
