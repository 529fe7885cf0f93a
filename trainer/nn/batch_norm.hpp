// Batch normalization over the columns of a [B x cols] activation matrix, as Paddle's
// BatchNorm1D (PaddleRec's dlrm puts Linear -> ReLU -> BatchNorm1D after every MLP layer):
//
//   training:  mu_j = 1/B sum_i x_ij,  var_j = 1/B sum_i (x_ij - mu_j)^2   (the batch's, biased)
//              y_ij = gamma_j (x_ij - mu_j) / sqrt(var_j + eps) + beta_j
//              running_mean = m running_mean + (1 - m) mu,  running_var likewise with var
//              (the biased batch variance, as Paddle's CPU batch_norm kernel; PyTorch's running
//              variance takes the unbiased one)
//   inference: y_ij = gamma_j (x_ij - running_mean_j) / sqrt(running_var_j + eps) + beta_j
//
// with Paddle's defaults m = 0.9, eps = 1e-5; gamma starts at 1, beta at 0, the running mean at 0
// and the running variance at 1. Edge sizes: a batch of one instance has var = 0, so it
// normalises to beta and passes no gradient to its input (its statistics still move the running
// ones, as Paddle's); an empty batch writes nothing but zero gradients.
//
// Backward (dy already multiplied by the dense scale, the MLP's convention: layers.hpp):
//   d beta_j = sum_i dy_ij,  d gamma_j = sum_i dy_ij xhat_ij,
//   dx_ij = gamma_j / sqrt(var_j + eps) (dy_ij - d beta_j / B - xhat_ij d gamma_j / B),
// masked to 0 where x_ij = 0 when the input is a ReLU's output (the ReLU's backward folded in),
// so dx is the producing layer's dZ.
//
// The running statistics are DenseParameters statistic blocks (add_statistic): saved, loaded,
// exchanged and served with the weights. backward writes their "gradient" slot as the change
// share * (1 - m) * (batch statistic - running statistic), share = this card's part of the global
// batch (B * the dense scale): the gradient all-reduce sums the cards' changes into one change
// toward the cards' batch-weighted mean statistics, and the optimizer adds it (DenseOptimizer),
// so every card keeps the same running statistics (one card: exactly Paddle's update). Each card
// normalises with its own batch's statistics (Paddle's BatchNorm1D, not SyncBatchNorm).
//
// Precision: x, y, dy and dx are of the MLP's activation type (fp32 or bf16); the statistics, the
// column sums (double), gamma, beta and every gradient of them are fp32 or wider.
// Portable (batch_norm.cu): one work item per column, rows summed in order (the cpu form walks
// rows over a range of columns: the same sums in the same order, so the same bits); nvcc's
// default (BatchNormSpec::staged_column_sums) reads each row chunk once per (chunk, column) item
// (its sum and its squared distances from its own mean), then combines the chunks in order per
// column (Chan et al.'s pairwise variance): deterministic, within rounding of the one-pass sums.
// Launches: forward_train 1 + 1 (the statistics, the normalisation), staged 2 + 1; backward
// 1 + 1 (the column sums, the input gradient), staged 2 + 1: a batch-norm model's launch and
// step-graph node counts on the cpu backend are 2 per norm layer fewer than on CUDA.
//
// Owns the batch's mean and variance (card memory); the model owns x, y, dy and dx.
// Thread-safety: one card's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "heterps/device/card.hpp"
#include "heterps/device/memory.hpp"
#include "heterps/device/stream.hpp"
#include "trainer/nn/dense_parameters.hpp"
#include "trainer/nn/linear_gemms.hpp"

namespace gpubox::trainer {

// Whether the column sums are staged by default (BatchNormSpec::staged_column_sums): nvcc's
// one thread per column walking B rows is latency-bound; the cpu form's rows-outer walk over a
// range of columns is already contiguous.
#if defined(GPUBOX_BACKEND_CUDA)
inline constexpr bool kStagedColumnSums = true;
#else
inline constexpr bool kStagedColumnSums = false;
#endif

struct BatchNormSpec {
  std::string name;  // blocks <name>.gamma, .beta (trained), .running_mean, .running_var
  int cols = 0;
  int64_t x_ld = 0;                      // row stride of x (elements)
  int64_t y_ld = 0;                      // of y
  int64_t grad_ld = 0;                   // of dy and dx
  ElementType type = ElementType::kF32;  // of x, y, dy and dx
  bool input_is_relu = true;             // dx = 0 where x = 0
  float momentum = 0.9f;
  float epsilon = 1e-5f;
  // The column sums in two stages (row chunks, then the chunks combined in order:
  // batch_norm.cu), with a [2 x 64 x cols] double scratch made at construction; else one item
  // per column.
  bool staged_column_sums = kStagedColumnSums;
};

class BatchNorm {
 public:
  // Registers the blocks in `params` (before params.finalize()).
  BatchNorm(device::Card& card, DenseParameters& params, const BatchNormSpec& spec);
  const BatchNormSpec& spec() const { return spec_; }
  std::size_t gamma_block() const { return gamma_; }
  std::size_t beta_block() const { return beta_; }
  std::size_t running_mean_block() const { return running_mean_; }
  std::size_t running_var_block() const { return running_var_; }
  // The kernel report's line: "<name> <cols>: batch norm ...".
  std::string describe() const;

  // y from x with the batch's statistics (kept for backward). Enqueued.
  void forward_train(const device::Stream& stream, const DenseParameters& params, const void* x,
                     void* y, int64_t batch);
  // y from x with the running statistics. Enqueued. Rewrites coef_'s scale with the running
  // variance's, which backward reads as the forward's: a backward needs a forward_train of the
  // same x after the last forward_infer (DenseModel's forward_backward always runs one).
  void forward_infer(const device::Stream& stream, const DenseParameters& params, const void* x,
                     void* y, int64_t batch);
  // After forward_train of the same x: gamma's and beta's gradients, the running statistics'
  // changes (weighted by `share`, see the file comment) and dx (may alias nothing). Enqueued.
  void backward(const device::Stream& stream, DenseParameters& params, const void* x,
                const void* dy, void* dx, int64_t batch, float share);

 private:
  // y = (x - mean) a + beta, a from coef_ (x of the element type T).
  template <class T>
  void normalize(const device::Stream& stream, const DenseParameters& params, const T* x,
                 const float* mean, void* y, int64_t batch);

  BatchNormSpec spec_;
  std::size_t gamma_;
  std::size_t beta_;
  std::size_t running_mean_;
  std::size_t running_var_;
  device::device_buffer<float> mean_;  // [cols]: the batch's
  device::device_buffer<float> var_;   // [cols]
  // [3 x cols]: the forward's scale gamma / sqrt(var + eps), the input gradient's x and
  // constant terms (batch_norm.cu's Coefficients).
  device::device_buffer<float> coef_;
  device::device_buffer<double> partial_;  // the staged sums' chunks (staged_column_sums only)
};

}  // namespace gpubox::trainer
