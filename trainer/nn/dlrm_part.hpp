// dlrm's bottom MLP and dot interaction (DLRM, Naumov et al. 2019; PaddleRec's models/rank/dlrm,
// MLPerf's recommendation network), the part of the dense model that feeds its top MLP:
//
//   b   = bottom MLP (every layer ReLU) over the instance's dense features, d = its last width
//   v_s = slot s's pooled embedding: the columns embed_w, embedx_w[mf_dim] of its block
//         (sparse_feature_dim = 1 + mf_dim values; every slot must be d wide)
//   T   = [v_0, ..., v_{S-1}, b]                                   (F = S + 1 vectors)
//   R   = [b | <T_a, T_b> for a < b, row-major upper triangle | cvm columns of every slot]
//
// R (top_in() columns: d + F(F-1)/2, + 2 S with use_cvm) is the top MLP's input: the model's
// fc layers read it in place of the first layer's input rows. With use_cvm the slots' show/click
// features (which carry no gradient) join the top MLP's input, as dense features would.
//
// Precision: the bottom MLP, b, the pairs in R and the bottom's gradients are of the model's
// activation type (fp32 or bf16, like the fc layers); dot products accumulate in fp32, and dR,
// written by the top MLP's first layer, is fp32. Gradients follow the MLP's convention
// (layers.hpp): dR arrives multiplied by the dense scale, which the bottom MLP keeps and the
// pooled gradient handed to the sparse side multiplies back out.
//
// With hyper_parameters.dnn_batch_norm (config.batch_norm) every bottom layer is Linear -> ReLU
// -> BatchNorm1D, as PaddleRec's MLPLayer builds it (batch_norm.hpp), its last one's output
// normalised into R; the interaction's gradient of b then goes through the norm to the last dZ.
//
// Owns its layers' parameters (bot_<l>.w/.b, bot_<l>.bn.* in the model's DenseParameters) and
// every buffer named here. Thread-safety: one card's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "trainer/nn/batch_norm.hpp"
#include "trainer/nn/dense_model_types.hpp"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {

class DlrmPart {
 public:
  // Registers the bottom layers in `params` (before params.finalize()). Throws gpubox::Error
  // naming the keys when the slots' embeddings are not all as wide as the bottom MLP's output
  // or there are no dense features. `blas` and `pool` must outlive the part.
  DlrmPart(device::Card& card, DenseParameters& params, Blas& blas, const SlotSumPool& pool,
           const DenseModelConfig& config, ElementType activation);
  DlrmPart(const DlrmPart&) = delete;
  DlrmPart& operator=(const DlrmPart&) = delete;

  int width() const { return width_; }  // d: the interaction vectors' width
  int features() const { return slots_ + 1; }
  int pairs() const { return features() * (features() - 1) / 2; }
  int top_in() const { return width_ + pairs() + (use_cvm_ ? 2 * slots_ : 0); }
  int64_t top_ld() const { return top_ld_; }
  const std::vector<Linear>& bottom_layers() const { return bottom_; }
  // Multiply-adds x2 of one example's bottom MLP (forward, weight and input gradients; none for
  // the dense features) and interaction (forward, and both vectors' gradients per pair).
  double flops_per_example() const;
  std::string kernel_report(int64_t batch) const;

  // Sizes the buffers and plans the bottom GEMMs for batches of up to `batch` rows.
  void reserve(int64_t batch);
  // R from the pooled slots (`x0`: the pool's output rows) and the dense features ([B x
  // dense_dim] floats); `training`: batch norm with the batch's statistics, else the running ones.
  void forward(const device::Stream& stream, const DenseParameters& params, const InputRows& x0,
               const float* dense, int64_t batch, bool training);
  // R ([B x top_in()], row stride top_ld(), activation type) and where the top MLP's first layer
  // writes dR (fp32, the same stride, scaled by the dense scale).
  const void* top_input() const { return top_in_.data(); }
  float* top_input_grad() { return d_top_in_.data(); }
  // From top_input_grad(): the bottom layers' gradients and the pooled gradient (overwritten:
  // d_pooled = unscale * dL/dv_s in the vectors' columns, 0 in the cvm columns). `scale`: the
  // dense scale (the batch norms' statistics move by the card's share, batch * scale).
  void backward(const device::Stream& stream, DenseParameters& params, const InputRows& x0,
                int64_t batch, float scale, float unscale, float* d_pooled);

 private:
  // The dense features ([B x dense_dim] floats) into the bottom MLP's input rows.
  void write_bottom_input(const device::Stream& stream, const float* dense, int64_t batch);
  // Slot vectors from x0, b from R: launches on the row type (dot_interaction.cu).
  void interaction_forward(const device::Stream& stream, const InputRows& x0, int64_t batch);
  void interaction_backward(const device::Stream& stream, const InputRows& x0, int64_t batch,
                            float unscale, float* d_pooled);

  ElementType activation_;
  int slots_;
  int slot_width_;     // the pool's block width per slot
  int vector_column_;  // where v_s starts inside its block (embed_w's column)
  int width_;
  bool use_cvm_;
  int dense_dim_;
  int64_t bottom_in_ld_;
  int64_t top_ld_;
  // The bottom layer's input: the dense features, or the previous layer's (normalised) output.
  const void* bottom_input(std::size_t l) const {
    if (l == 0) return bottom_in_.data();
    return norms_.empty() ? hidden_[l - 1].data() : normed_[l - 1].data();
  }

  std::vector<Linear> bottom_;
  std::vector<BatchNorm> norms_;           // one per bottom layer, or none
  device::device_buffer<char> bottom_in_;  // the dense features, activation type
  // The bottom layers' outputs but the last's (it writes R), every layer's with batch norm.
  std::vector<device::device_buffer<char>> hidden_;
  std::vector<device::device_buffer<char>> normed_;  // batch norm: the norms' outputs but the last
  device::device_buffer<char> top_in_;               // R
  device::device_buffer<float> d_top_in_;            // dR
  device::device_buffer<float> d_bottom_;            // the pairs' share of dL/db, fp32
  device::device_buffer<char> dz_a_;                 // the bottom's dZ, ping-ponging
  device::device_buffer<char> dz_b_;
};

}  // namespace gpubox::trainer
