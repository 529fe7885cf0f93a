// deepfefm's field-embedded factorization machine (DeepFEFM, Pande 2021; PaddleRec's
// models/rank/deepfefm net.py), the part of the dense model that feeds its DNN and adds the FEFM
// term to the logit:
//
//   fields   F = S slots + D dense features, each a k-wide vector (k = mf_dim):
//            slot s: its pooled embedx_w; dense feature d: x_d e_d (e_d a learned k-vector,
//            deepfefm.dense_v, N(0, 0.01/k) as PaddleRec's embeddings start)
//   pairs    P = F (F - 1) / 2, in itertools.combinations order: (0,1), (0,2), .., (F-2,F-1)
//   r_p      = v_a^T (W_p + W_p^T) v_b for the pair p = (a, b) (W_p: deepfefm.field_w[p], k x k;
//            PaddleRec symmetrises it the same way in net.py)
//   fefm     = sum_p r_p                                          (added to the logit)
//   DNN input = [every slot's embedx (S k) | x_d w_d (D; w = wide.dense_w, the first-order
//            term's dense weights, PaddleRec's dense_w_one) | r (P)], then, with use_cvm, each
//            slot's show/click features (which carry no gradient): the model's fc layers read it.
// The first-order term (the keys' embed_w summed + x . w) is the model's WidePart.
//
// One deviation from PaddleRec: its dense features are quantised into keys of the sparse table
// (int(x * 1e5 + 1e6 + 2), a looked-up row per value, shared by the 13 features); here a dense
// feature's field vector is its value times a learned vector, as xdeepfm and ffm take it (the
// dataset stays model-blind; issue 32 notes it).
//
// fp32 throughout (in bf16 the model's MLP reads a bf16 copy of dnn_input()). Gradients follow the
// MLP's convention (layers.hpp): dL/d(DNN input) arrives multiplied by the dense scale, the FEFM's
// gradients are made with it and the unscaled dlogits times the scale, and the pooled gradient
// handed to the sparse side multiplies it back out. Portable: parallel_for over items that each own
// what they write, sums in a fixed order (runs are deterministic, no atomics).
//
// Owns its parameters' blocks (deepfefm.field_w, deepfefm.dense_v in the model's
// DenseParameters) and every buffer named here. Thread-safety: one card's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "trainer/nn/dense_model_types.hpp"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {

class DeepfefmPart {
 public:
  // Registers the blocks in `params` (before params.finalize()). Throws gpubox::Error naming the
  // key when the slots differ in width (hyper_parameters.slot_dims) or there is no field pair.
  DeepfefmPart(device::Card& card, DenseParameters& params, const SlotSumPool& pool,
               const DenseModelConfig& config);
  DeepfefmPart(const DeepfefmPart&) = delete;
  DeepfefmPart& operator=(const DeepfefmPart&) = delete;

  int fields() const { return slots_ + dense_dim_; }
  int pairs() const { return fields() * (fields() - 1) / 2; }
  int width() const { return width_; }  // k
  // The DNN input's columns: embedding_cols(), then 2 per slot with cvm.
  int dnn_in() const { return embedding_cols() + (use_cvm_ ? 2 * slots_ : 0); }
  // The columns that carry a gradient: the slots' embeddings, the dense terms and the r_p.
  int embedding_cols() const { return slots_ * width_ + dense_dim_ + pairs(); }
  int64_t dnn_ld() const { return dnn_ld_; }
  // Multiply-adds x2 of one example's FEFM: per pair k^2 + k forward, about 4 k^2 backward
  // (both fields' gradients and W_p's).
  double flops_per_example() const;
  std::string kernel_report(int64_t batch) const;

  // Sizes the buffers for batches of up to `batch` instances (allocates only when they grow).
  void reserve(int64_t batch);
  // The field vectors and the DNN input from the pooled slots (`x0`: the pool's fp32 output
  // rows), the dense features ([B x dense_dim] floats) and the first-order dense weights
  // (`dense_w_block`: the WidePart's weight block).
  void forward(const device::Stream& stream, const DenseParameters& params, const InputRows& x0,
               const float* dense, std::size_t dense_w_block, int64_t batch);
  // [B x dnn_in()] floats, row stride dnn_ld(): the DNN's first layer reads it.
  const float* dnn_input() const { return x0_.data(); }
  // Where the DNN's first layer writes scale * dL/d(DNN input), the first embedding_cols()
  // columns (fp32, row stride dnn_ld()).
  float* dnn_input_grad() { return dx0_.data(); }
  // logits[i] += sum_p r_p.
  void add_logits(const device::Stream& stream, int64_t batch, float* logits) const;
  // From the unscaled dlogits and dnn_input_grad(): W's and the dense vectors' gradients (scaled
  // by `scale`), and d_pooled ([B x pool out_dim] floats, overwritten) = unscale * dL/d(embedx_w)
  // in each slot's embedx columns, 0 in its other columns (the wide part adds embed_w's after).
  void backward(const device::Stream& stream, DenseParameters& params, const float* dense,
                const float* dlogits, float scale, int64_t batch, float unscale, float* d_pooled);
  // wide.dense_w's gradient += the DNN's share (sum_i dL/d(x_d w_d) x_d, scaled); called after
  // the WidePart's backward, which overwrites that gradient with the first-order term's.
  void add_dense_w_grad(const device::Stream& stream, DenseParameters& params, const float* dense,
                        std::size_t dense_w_block, int64_t batch) const;

 private:
  int slots_;
  int dense_dim_;
  int width_;
  bool use_cvm_;
  int slot_width_;     // the pool's block width per slot
  int embedx_column_;  // embedx_w's first column inside a slot's block
  int64_t dnn_ld_;
  std::size_t field_w_ = 0;                // deepfefm.field_w: [P x k x k]
  std::size_t dense_v_ = 0;                // deepfefm.dense_v: [D x k]
  device::device_buffer<float> sym_;       // W_p + W_p^T, [P x k x k]
  device::device_buffer<float> fields_;    // v: [B x F x k]
  device::device_buffer<float> x0_;        // the DNN input
  device::device_buffer<float> dx0_;       // scale * dL/d(DNN input)
  device::device_buffer<float> d_pairs_;   // scale * dL/dr: [B x P]
  device::device_buffer<float> d_fields_;  // scale * dL/dv: [B x F x k]
};

}  // namespace gpubox::trainer
