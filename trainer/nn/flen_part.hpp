// flen's field-wise bi-interaction (FLEN, Chen et al. 2020; PaddleRec's models/rank/flen net.py),
// the part of the dense model beside its DNN:
//
//   fields   the S sparse slots, split into G groups of consecutive slots (field_group_sizes:
//            PaddleRec's net takes user fields 1-13, item 14-16, context 17-22)
//   e_s      slot s's pooled embedding, k = sparse_feature_dim values: the key's embed_w and its
//            embedx (the row's whole embedding, as PaddleRec's one sparse_feature_dim table)
//   g_j      = sum of e_s over the slots of group j
//   h        = sum_{i<j} r_p (g_i * g_j)   (elementwise; p in itertools.combinations order,
//            r = flen.kernel_mf, P = G (G - 1) / 2 scalars: FieldWiseBiInteraction's MF module)
//   a        = relu(h W + b)               (W = flen.fc_w, k x k, b = flen.fc_b: fwbi_fc_32)
//   logit   += a . w_out                   (w_out = flen.out_w: the k columns of PaddleRec's
//            last Linear that read the bi-interaction; the DNN's columns are the model's logit
//            layer over its last hidden layer, with the bias)
// PaddleRec's FieldWiseBiInteraction also computes an FM module within the groups (h_fm), but its
// forward returns h_mf alone: h_fm reaches nothing, so it is not built here.
//
// Dropout (hyper_parameters.dnn_dropout, a training forward's MlpDropout): PaddleRec's Dropout
// after the layer's batch norm, here on a itself (the norm is not built): its side mask, keep
// 1-p, stored a = relu(u) m / q, so du = dlogits out_w [a > 0] / q. The DNN's dropout is the
// MLP's.
// Not built: the batch norm after the bi-interaction layer's ReLU.
//
// Portable: parallel_for over (instance, column) items (the group sums and h, the ReLU, the
// pooled gradient) and (instance, pair) items; the k x k layer, its gradients and every sum over
// the batch (the parameters' gradients: GEMV against a ones vector or dlogits) through the
// model's Blas. No item loops over the batch, and the launches of a forward or backward do not
// depend on its size (flen_test counts them); deterministic, no atomics. Gradients: the pooled
// one unscaled and added (the MLP's backward wrote it first), the parameters' scaled by the dense
// scale (layers.hpp's convention).
//
// Owns its parameters' blocks (flen.kernel_mf, flen.fc_w, flen.fc_b, flen.out_w in the model's
// DenseParameters) and the buffers named here. Thread-safety: one card's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "trainer/nn/blas.hpp"
#include "trainer/nn/dense_model_types.hpp"
#include "trainer/nn/dropout.hpp"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {

// Up to this many field groups (PaddleRec's flen has 3).
inline constexpr int kFlenMaxGroups = 16;

class FlenPart {
 public:
  // Registers the blocks in `params` (before params.finalize()). Throws gpubox::Error naming the
  // key when the groups do not cover the slots (hyper_parameters.field_group_sizes), there are
  // fewer than 2 or more than kFlenMaxGroups, or the slots differ in width (slot_dims).
  FlenPart(device::Card& card, DenseParameters& params, const SlotSumPool& pool,
           const std::vector<int>& group_sizes);
  FlenPart(const FlenPart&) = delete;
  FlenPart& operator=(const FlenPart&) = delete;

  int groups() const { return groups_; }
  int pairs() const { return groups_ * (groups_ - 1) / 2; }
  int width() const { return k_; }
  // Multiply-adds x2 of one example's forward and backward.
  double flops_per_example() const;
  std::string kernel_report(int64_t batch) const;

  // Sizes the buffers for batches of up to `batch` instances (allocates only when they grow).
  void reserve(int64_t batch);
  // logits[i] += a_i . w_out, from the pooled rows `input` (the MLP's input rows). `dropout`: a
  // training forward's (its side mask drops a), null in evaluation.
  void forward(const Blas& blas, const DenseParameters& params, const InputRows& input,
               int64_t batch, const MlpDropout* dropout, float* logits);
  // d_pooled ([B x pool out_dim] floats, unscaled) += dL/d e_s in each slot's embedding columns;
  // the blocks' gradients = grad_scale * their sums over the batch (overwritten).
  // Reads what forward() kept of the same batch, which `dropout` (the same) dropped.
  void backward(const Blas& blas, DenseParameters& params, const float* dlogits, int64_t batch,
                float grad_scale, const MlpDropout& dropout, float* d_pooled);

 private:
  device::Card* card_;
  int slots_;
  int groups_;
  int k_;
  int slot_width_;    // the pool's block width per slot
  int embed_column_;  // embed_w's column inside a slot's block (embedx follows it)
  int starts_[kFlenMaxGroups + 1] = {};
  std::size_t kernel_mf_ = 0;          // [P]
  std::size_t fc_w_ = 0;               // [k x k], row = input
  std::size_t fc_b_ = 0;               // [k]
  std::size_t out_w_ = 0;              // [k]
  device::device_buffer<float> g_;     // group sums: [B x G x k]
  device::device_buffer<float> h_;     // the bi-interaction: [B x k]
  device::device_buffer<float> a_;     // relu(h W + b) (in training, dropped): [B x k]
  device::device_buffer<float> du_;    // dL/du (unscaled): [B x k]
  device::device_buffer<float> dh_;    // dL/dh (unscaled): [B x k]
  device::device_buffer<float> q_;     // dL/d kernel_mf per instance (unscaled): [B x P]
  device::device_buffer<float> ones_;  // B ones: fc_b's and kernel_mf's gradients sum against it
};

}  // namespace gpubox::trainer
