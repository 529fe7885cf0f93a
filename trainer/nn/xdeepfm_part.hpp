// xdeepfm's field embeddings and Compressed Interaction Network (xDeepFM, Lian et al. 2018;
// PaddleRec's models/rank/xdeepfm net.py), the part of the dense model that feeds its DNN and adds
// the CIN's term to the logit:
//
//   fields   F = S slots + dense_dim dense features, each a D-wide vector (D = mf_dim):
//            slot s: its pooled embedx_w; dense feature i: x_i * e_i (e_i a learned D-vector, 1 at
//            start: PaddleRec's dense_w)
//   X^0      [F x D] per instance; X^k [H_k x D], H_k = layer_sizes_cin[k-1]
//   X^{k+1}[o, d] = sum_{f, h} W_k[f H_k + h, o] X^0[f, d] X^k[h, d]   (PaddleRec's 1x1 conv,
//            no bias, no activation)
//   p        = [sum_d X^1[., d] | ... | sum_d X^K[., d]]  (sum_k H_k values)
//   cin      = p . w_out                                    (added to the logit)
//   DNN input = X^0 flattened (column d F + f), then, with use_cvm, each slot's show/click
//            features (which carry no gradient): the model's fc layers read it.
// The first-order term (PaddleRec's Linear: sum of the keys' 1-wide weights + dense . w) is the
// model's WidePart over embed_w; the biases of PaddleRec's CIN output and of its sum are the logit
// layer's one bias.
//
// Layout: X^k for k >= 1 are [(B D) x H_k] row-major (row b D + d), so each layer is one GEMM
// Z_k W_k with Z_k[(b, d), f H_k + h] = X^0[b, f, d] X^k[b, h, d] ([(B D) x F H_k], built by
// parallel_for; the backward builds it again rather than keeping every layer's). fp32
// throughout (in bf16 the model's MLP reads a bf16 copy of dnn_input()). Gradients follow the MLP's
// convention (layers.hpp): dL/d(DNN input) arrives multiplied by the dense scale, the CIN's
// gradients are made with it from the unscaled dlogits, and the pooled gradient handed to the
// sparse side multiplies it back out.
//
// Owns its parameters' blocks (cin_<k>.w, cin_out.w, xdeepfm.dense_w in the model's
// DenseParameters) and every buffer named here. Thread-safety: one card's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "trainer/nn/blas.hpp"
#include "trainer/nn/dense_model_types.hpp"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {

class XdeepfmPart {
 public:
  // Registers the blocks in `params` (before params.finalize()). Throws gpubox::Error naming the
  // keys when the slots differ in width (hyper_parameters.slot_dims) or layer_sizes_cin is empty.
  XdeepfmPart(device::Card& card, DenseParameters& params, const SlotSumPool& pool,
              const DenseModelConfig& config);
  XdeepfmPart(const XdeepfmPart&) = delete;
  XdeepfmPart& operator=(const XdeepfmPart&) = delete;

  int fields() const { return slots_ + dense_dim_; }
  int width() const { return width_; }  // D
  const std::vector<int>& cin_sizes() const { return sizes_; }
  // The DNN input's columns: the field embeddings (fields() x width()), then 2 per slot with cvm.
  int dnn_in() const { return fields() * width_ + (use_cvm_ ? 2 * slots_ : 0); }
  int embedding_cols() const { return fields() * width_; }
  int64_t dnn_ld() const { return dnn_ld_; }
  // Multiply-adds x2 of one example's CIN: every layer's GEMM forward, its weight gradient and
  // its input gradient (elementwise work and the sum pooling are not counted).
  double flops_per_example() const;
  std::string kernel_report(int64_t batch) const;

  // Sizes the buffers for batches of up to `batch` instances (allocates only when they grow).
  void reserve(int64_t batch);
  // The DNN input (X^0 and the cvm columns) from the pooled slots (`x0`: the pool's fp32 output
  // rows) and the dense features ([B x dense_dim] floats); then X^1 .. X^K and p.
  void forward(const Blas& blas, const DenseParameters& params, const InputRows& x0,
               const float* dense, int64_t batch);
  // [B x dnn_in()] floats, row stride dnn_ld(): the DNN's first layer reads it.
  const float* dnn_input() const { return x0_.data(); }
  // Where the DNN's first layer writes scale * dL/d(DNN input), the first embedding_cols()
  // columns (fp32, row stride dnn_ld()).
  float* dnn_input_grad() { return dx0_.data(); }
  // logits[i] += p[i] . w_out.
  void add_logits(const Blas& blas, const DenseParameters& params, int64_t batch,
                  float* logits) const;
  // From the unscaled dlogits and dnn_input_grad(): the CIN's and the dense embeddings'
  // gradients (scaled by `scale`), and d_pooled ([B x pool out_dim] floats, overwritten) =
  // unscale * dL/d(embedx_w) in each slot's embedx columns, 0 in its other columns (the wide
  // part adds embed_w's after).
  void backward(const Blas& blas, DenseParameters& params, const float* dense, const float* dlogits,
                float scale, int64_t batch, float unscale, float* d_pooled);

 private:
  // Z_k into z_ from X^0 and X^k (k = 0: X^0 itself).
  void build_z(const device::Stream& stream, int k, int64_t batch);
  int64_t layer_in(int k) const { return static_cast<int64_t>(fields()) * height(k); }
  int height(int k) const { return k == 0 ? fields() : sizes_[static_cast<std::size_t>(k - 1)]; }
  int pooled_cols() const;

  int slots_;
  int dense_dim_;
  int width_;
  bool use_cvm_;
  int slot_width_;     // the pool's block width per slot
  int embedx_column_;  // embedx_w's first column inside a slot's block
  std::vector<int> sizes_;
  int64_t dnn_ld_;
  std::vector<std::size_t> w_;                    // cin_<k>.w: [F H_k x H_{k+1}]
  std::size_t w_out_ = 0;                         // cin_out.w: [sum H_k]
  std::size_t dense_w_ = 0;                       // xdeepfm.dense_w: [dense_dim x D]
  device::device_buffer<float> x0_;               // the DNN input, X^0 inside it
  std::vector<device::device_buffer<float>> xs_;  // X^1 .. X^K
  device::device_buffer<float> z_;                // Z_k, then dL/dZ_k
  device::device_buffer<float> pooled_;           // p [B x sum H_k]
  device::device_buffer<float> d_pooled_cin_;     // scale * dL/dp
  device::device_buffer<float> g_a_;              // scale * dL/dX^k, ping-ponging
  device::device_buffer<float> g_b_;
  device::device_buffer<float> dx0_;  // scale * dL/d(DNN input)
};

}  // namespace gpubox::trainer
