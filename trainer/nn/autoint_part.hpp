// autoint's field embeddings and interacting layers (AutoInt, Song et al. 2019; PaddleRec's
// models/rank/autoint net.py), the part of the dense model that adds its term to the logit and,
// with fc_sizes, feeds the DNN:
//
//   fields   F = S slots + dense_dim dense features, each a D-wide vector (D = mf_dim):
//            slot s: its pooled embedx_w; dense feature i: x_i * e_i (e_i a learned D-vector:
//            PaddleRec's embedding row of the dense field's index, times its value)
//   H^0      [F x D] per instance; H^{l+1} [F x A_l], A_l = attn_layer_sizes[l]
//   layer l  Q, K, V, R = relu(H^l W_q), relu(H^l W_k), relu(H^l W_v), relu(H^l W_r)  [F x A_l]
//            per head h (columns h a .. h a + a - 1, a = A_l / head_num):
//              P_h = softmax_j(Q_h K_h^T / (scaling ? sqrt(a) : 1)),  O_h = P_h V_h
//            Y = relu(O + R) (R only with use_residual), H^{l+1} = LayerNorm(Y) (gamma, beta,
//            eps 1e-8), as net.py's InteractingLayer
//   autoint  = flatten(H^L) . w_out                       (added to the logit)
//   DNN input (fc_sizes non-empty) = H^0 flattened (column f D + d, net.py's reshape), then, with
//            use_cvm, each slot's show/click features (no gradient): the model's fc layers read it.
// The first-order term (use_wide: PaddleRec's feature_bias, sum of the keys' 1-wide weights +
// dense . w) is the model's WidePart over embed_w; the biases of PaddleRec's output Linear and of
// its DNN's last layer are the logit's one bias.
//
// Layout: every per-field matrix is [(B F) x cols] row-major (row b F + f), so each layer's four
// projections are one GEMM H^l [W_q | W_k | W_v | W_r] over (instance, field) rows; attention's
// products are batched GEMMs, one per head; softmax, ReLU and LayerNorm are parallel_for items
// owning the rows they write (no atomics, fixed order: deterministic). On a cpu card of one
// thread the attention runs chunk by chunk of instances, all its kernels on one chunk before the
// next (autoint.cu's attention_chunk: a chunk stays in cache), the same bits as the whole batch.
// Gradients follow the MLP's convention (layers.hpp), fp32: made with the dense scale from the
// unscaled dlogits; the pooled gradient handed to the sparse side multiplies it back out.
//
// Owns its parameters' blocks (autoint_<l>.w, autoint_<l>.ln_gamma, autoint_<l>.ln_beta,
// autoint_out.w, autoint.dense_w in the model's DenseParameters) and every buffer named here.
// Thread-safety: one card's thread only.
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

class AutointPart {
 public:
  // Registers the blocks in `params` (before params.finalize()). Throws gpubox::Error naming the
  // keys when the slots differ in width (hyper_parameters.slot_dims), attn_layer_sizes is empty
  // or a layer is not a multiple of head_num.
  AutointPart(device::Card& card, DenseParameters& params, const SlotSumPool& pool,
              const DenseModelConfig& config);
  AutointPart(const AutointPart&) = delete;
  AutointPart& operator=(const AutointPart&) = delete;

  int fields() const { return slots_ + dense_dim_; }
  int width() const { return width_; }  // D
  // The DNN input's columns: the field embeddings (fields() x width()), then 2 per slot with cvm.
  int dnn_in() const { return fields() * width_ + (use_cvm_ ? 2 * slots_ : 0); }
  int embedding_cols() const { return fields() * width_; }
  int64_t dnn_ld() const { return dnn_ld_; }
  // Multiply-adds x2 of one example's interacting layers: the projections' GEMMs (forward, weight
  // and input gradients) and the attention's products (scores and P V, forward and backward).
  double flops_per_example() const;
  std::string kernel_report(int64_t batch) const;

  // Sizes the buffers for batches of up to `batch` instances (allocates only when they grow).
  void reserve(int64_t batch);
  // H^0 (and the DNN input when `with_dnn`) from the pooled slots (`pooled`: the pool's fp32
  // output rows) and the dense features ([B x dense_dim] floats); then every layer.
  void forward(const Blas& blas, const DenseParameters& params, const InputRows& pooled,
               const float* dense, int64_t batch, bool with_dnn);
  // [B x dnn_in()] floats, row stride dnn_ld(): the DNN's first layer reads it.
  const float* dnn_input() const { return dnn_x_.data(); }
  // Where the DNN's first layer writes scale * dL/d(DNN input), the first embedding_cols()
  // columns (fp32, row stride dnn_ld()).
  float* dnn_input_grad() { return dnn_dx_.data(); }
  // logits[i] += flatten(H^L)[i] . w_out.
  void add_logits(const Blas& blas, const DenseParameters& params, int64_t batch,
                  float* logits) const;
  // From the unscaled dlogits (and dnn_input_grad() when `with_dnn`): the layers' and the dense
  // embeddings' gradients (scaled by `scale`), and d_pooled ([B x pool out_dim] floats,
  // overwritten) = unscale * dL/d(embedx_w) in each slot's embedx columns, 0 in its other columns
  // (the wide part adds embed_w's after).
  void backward(const Blas& blas, DenseParameters& params, const float* dense, const float* dlogits,
                float scale, int64_t batch, bool with_dnn, float unscale, float* d_pooled);

 private:
  int in_cols(std::size_t l) const { return l == 0 ? width_ : sizes_[l - 1]; }
  // Projection columns of layer l: Q, K, V (and R with use_residual), each sizes_[l] wide.
  int proj_cols(std::size_t l) const { return (residual_ ? 4 : 3) * sizes_[l]; }
  const float* layer_input(std::size_t l) const { return l == 0 ? x0_.data() : out_[l - 1].data(); }
  void backward_layer(const Blas& blas, DenseParameters& params, std::size_t l, int64_t batch,
                      float* d_out, float* d_in);

  int slots_;
  int dense_dim_;
  int width_;
  bool use_cvm_;
  int slot_width_;     // the pool's block width per slot
  int embedx_column_;  // embedx_w's first column inside a slot's block
  std::vector<int> sizes_;
  int heads_;
  bool residual_;
  bool scaling_;
  int64_t dnn_ld_;
  std::vector<std::size_t> w_;                       // autoint_<l>.w: [in x proj_cols(l)]
  std::vector<std::size_t> gamma_;                   // autoint_<l>.ln_gamma: [A_l]
  std::vector<std::size_t> beta_;                    // autoint_<l>.ln_beta: [A_l]
  std::size_t w_out_ = 0;                            // autoint_out.w: [F A_L]
  std::size_t dense_w_ = 0;                          // autoint.dense_w: [dense_dim x D]
  device::device_buffer<float> x0_;                  // H^0 [(B F) x D]
  std::vector<device::device_buffer<float>> proj_;   // relu'd Q | K | V | R per layer
  std::vector<device::device_buffer<float>> att_;    // P [B x heads x F x F] per layer
  std::vector<device::device_buffer<float>> y_;      // Y = relu(O + R) per layer
  std::vector<device::device_buffer<float>> stats_;  // mean, 1 / std of Y's rows per layer
  std::vector<device::device_buffer<float>> out_;    // H^{l+1} per layer
  device::device_buffer<float> dnn_x_;               // the DNN input
  device::device_buffer<float> dnn_dx_;              // scale * dL/d(DNN input)
  device::device_buffer<float> d_proj_;              // scale * dL/d(Q | K | V | R)
  device::device_buffer<float> d_o_;                 // scale * dL/dO
  device::device_buffer<float> d_s_;                 // scale * dL/d(scores)
  device::device_buffer<float> g_a_;                 // scale * dL/dH^l, ping-ponging
  device::device_buffer<float> g_b_;
  device::device_buffer<float> dx0_;  // scale * dL/dH^0
  // The parameter gradients' sums over rows as GEMV/GEMM (one thread per column would walk the
  // whole batch serially: milliseconds a step on a GPU): ones over the rows, G * xhat per layer
  // (in d_o_, before AttendBackRows writes it), and the dense rows' all-pairs products, of which
  // the gradient is the diagonal blocks.
  device::Card* card_;
  device::device_buffer<float> ones_;         // 1 x (B F)
  device::device_buffer<float> dense_pairs_;  // [dense_dim x dense_dim D]
};

}  // namespace gpubox::trainer
