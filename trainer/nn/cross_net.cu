// dcn_v2's cross network (CrossNet, layers.hpp). Portable: the GEMMs through the card's Blas, the
// elementwise work as parallel_for functors over the [B x D] entries.
#include <cmath>
#include <string>

#include "common/error.hpp"
#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {
namespace {
// Entry (i, j) of a [B x dim] matrix from a flat index.
struct Entry {
  int64_t i;
  int64_t j;
};
GPUBOX_HD GPUBOX_FORCEINLINE Entry entry(std::size_t flat, int dim) {
  const auto d = static_cast<int64_t>(dim);
  return Entry{static_cast<int64_t>(flat) / d, static_cast<int64_t>(flat) % d};
}

// pre[i, j] += b[j]; out[i, j] = x0[i, j] * pre[i, j] + in[i, j] (one layer, after the GEMM).
struct CrossCombine {
  const float* x0;
  const float* in;
  const float* bias;
  float* pre;
  float* out;
  int64_t ld;
  int dim;
  GPUBOX_HD void operator()(std::size_t flat) const {
    const Entry e = entry(flat, dim);
    const int64_t at = e.i * ld + e.j;
    const float p = pre[at] + bias[e.j];
    pre[at] = p;
    out[at] = x0[at] * p + in[at];
  }
};

// From g = dL/dx_{l+1}: dpre = g * x0; dx0 (+)= g * pre (the product's share of dL/dx0).
struct CrossBackwardProduct {
  const float* g;
  const float* x0;
  const float* pre;
  float* dpre;
  float* dx0;
  int64_t ld;
  int dim;
  bool first;  // the top layer: dx0 starts here
  GPUBOX_HD void operator()(std::size_t flat) const {
    const Entry e = entry(flat, dim);
    const int64_t at = e.i * ld + e.j;
    dpre[at] = g[at] * x0[at];
    const float share = g[at] * pre[at];
    dx0[at] = first ? share : dx0[at] + share;
  }
};

// db[j] = sum over the batch of dpre[i, j] (one thread per column, rows in order: deterministic).
struct ColumnSum {
  const float* m;
  float* sums;
  int64_t rows;
  int64_t ld;
  GPUBOX_HD void operator()(std::size_t j) const {
    float sum = 0.0f;
    for (int64_t i = 0; i < rows; ++i) sum += m[i * ld + static_cast<int64_t>(j)];
    sums[j] = sum;
  }
};

// d_pooled[i, j] (+)= unscale * (g[i, j] + dx0[i, j]) for the pooled columns j < cols.
struct PooledGrad {
  const float* g;
  const float* dx0;
  float* d_pooled;
  int64_t ld;
  int cols;
  float unscale;
  bool accumulate;
  GPUBOX_HD void operator()(std::size_t flat) const {
    const Entry e = entry(flat, cols);
    const int64_t at = e.i * ld + e.j;
    const float d = unscale * (g[at] + dx0[at]);
    float* out = d_pooled + e.i * cols + e.j;
    *out = accumulate ? *out + d : d;
  }
};

std::size_t entries(int64_t batch, int dim) {
  return static_cast<std::size_t>(batch) * static_cast<std::size_t>(dim);
}
}  // namespace

CrossNet::CrossNet(device::Card& card, DenseParameters& params, int dim, int64_t ld, int layers,
                   int rank, bool parallel)
    : dim_(dim), ld_(ld), layers_(layers), rank_(rank), parallel_(parallel) {
  GPUBOX_EXPECTS(dim > 0 && ld >= dim, "cross network: dim ", dim, " with row stride ", ld);
  GPUBOX_EXPECTS(layers >= 1, "hyper_parameters.cross_layers must be >= 1, got ", layers);
  GPUBOX_EXPECTS(rank >= 0, "hyper_parameters.cross_rank must be >= 0, got ", rank);
  const auto d = static_cast<std::size_t>(dim);
  const auto r = static_cast<std::size_t>(rank);
  const float normal_d = 1.0f / std::sqrt(static_cast<float>(dim));
  for (int l = 0; l < layers; ++l) {
    const std::string name = "cross_" + std::to_string(l);
    if (rank == 0) {
      w_.push_back(params.add(name + ".w", d * d, ParamInit::kNormal, normal_d));
    } else {
      w_.push_back(params.add(name + ".v", d * r, ParamInit::kNormal, normal_d));
      u_.push_back(params.add(name + ".u", r * d, ParamInit::kNormal,
                              1.0f / std::sqrt(static_cast<float>(rank))));
    }
    b_.push_back(params.add(name + ".b", d, ParamInit::kZero));
  }
  if (parallel) w_out_ = params.add("cross_out.w", d, ParamInit::kNormal, normal_d);
  for (int l = 0; l < layers; ++l) {
    xs_.push_back(card.make_buffer<float>(0));
    pre_.push_back(card.make_buffer<float>(0));
    if (rank > 0) low_.push_back(card.make_buffer<float>(0));
  }
  for (auto* buffer : {&g_, &dpre_, &dx0_, &dlow_}) *buffer = card.make_buffer<float>(0);
}

double CrossNet::flops_per_example() const {
  // Per layer: the forward GEMM(s), the weight gradient(s) and the input gradient(s).
  const double per_gemm =
      rank_ == 0 ? static_cast<double>(dim_) * dim_ : 2.0 * static_cast<double>(dim_) * rank_;
  return 2.0 * layers_ * 3.0 * per_gemm + (parallel_ ? 2.0 * 2.0 * dim_ : 0.0);
}

void CrossNet::reserve(int64_t batch) {
  GPUBOX_EXPECTS(batch >= 0, "negative batch ", batch);
  const auto rows = static_cast<std::size_t>(batch);
  const std::size_t matrix = rows * static_cast<std::size_t>(ld_);
  const std::size_t low = rows * static_cast<std::size_t>(rank_);
  for (auto& buffer : xs_) buffer.resize_discard(matrix);
  for (auto& buffer : pre_) buffer.resize_discard(matrix);
  for (auto& buffer : low_) buffer.resize_discard(low);
  for (auto* buffer : {&g_, &dpre_, &dx0_}) buffer->resize_discard(matrix);
  dlow_.resize_discard(low);
}

const float* CrossNet::output() const { return xs_.back().data(); }

void CrossNet::forward(const Blas& blas, const DenseParameters& params, const float* x0,
                       int64_t batch) {
  reserve(batch);
  for (int l = 0; l < layers_; ++l) {
    const auto at = static_cast<std::size_t>(l);
    const float* in = layer_input(x0, l);
    float* pre = pre_[at].data();
    if (rank_ == 0) {
      blas.sgemm(Transpose::kNo, Transpose::kNo, batch, dim_, dim_, 1.0f, in, ld_,
                 params.values(w_[at]), dim_, 0.0f, pre, ld_);
    } else {
      float* low = low_[at].data();
      blas.sgemm(Transpose::kNo, Transpose::kNo, batch, rank_, dim_, 1.0f, in, ld_,
                 params.values(w_[at]), rank_, 0.0f, low, rank_);
      blas.sgemm(Transpose::kNo, Transpose::kNo, batch, dim_, rank_, 1.0f, low, rank_,
                 params.values(u_[at]), dim_, 0.0f, pre, ld_);
    }
    device::parallel_for(
        blas.stream(), entries(batch, dim_),
        CrossCombine{x0, in, params.values(b_[at]), pre, xs_[at].data(), ld_, dim_});
  }
}

void CrossNet::add_logits(const Blas& blas, const DenseParameters& params, int64_t batch,
                          float* logits) const {
  GPUBOX_EXPECTS(parallel_, "add_logits is the parallel structure's");
  blas.sgemv(Transpose::kNo, batch, dim_, 1.0f, output(), ld_, params.values(w_out_), 1.0f, logits);
}

void CrossNet::backward_from_logits(const Blas& blas, DenseParameters& params, const float* dlogits,
                                    float scale, int64_t batch) {
  GPUBOX_EXPECTS(parallel_, "backward_from_logits is the parallel structure's");
  blas.sgemv(Transpose::kYes, batch, dim_, scale, output(), ld_, dlogits, 0.0f,
             params.grads(w_out_));
  blas.sgemm(Transpose::kNo, Transpose::kNo, batch, dim_, 1, scale, dlogits, 1,
             params.values(w_out_), dim_, 0.0f, g_.data(), ld_);
}

void CrossNet::backward(const Blas& blas, DenseParameters& params, const float* x0, int64_t batch,
                        float unscale, float* d_pooled, int pooled_cols, bool accumulate) {
  GPUBOX_EXPECTS(pooled_cols >= 0 && pooled_cols <= dim_, "pooled columns ", pooled_cols,
                 " of a cross network over ", dim_);
  const device::Stream& stream = blas.stream();
  for (int l = layers_ - 1; l >= 0; --l) {
    const auto at = static_cast<std::size_t>(l);
    const float* in = layer_input(x0, l);
    device::parallel_for(stream, entries(batch, dim_),
                         CrossBackwardProduct{g_.data(), x0, pre_[at].data(), dpre_.data(),
                                              dx0_.data(), ld_, dim_, l == layers_ - 1});
    device::parallel_for(stream, static_cast<std::size_t>(dim_),
                         ColumnSum{dpre_.data(), params.grads(b_[at]), batch, ld_});
    // g becomes dL/dx_l: the identity path (g itself) plus dpre through the layer's GEMM(s).
    if (rank_ == 0) {
      const float* w = params.values(w_[at]);
      blas.sgemm(Transpose::kYes, Transpose::kNo, dim_, dim_, batch, 1.0f, in, ld_, dpre_.data(),
                 ld_, 0.0f, params.grads(w_[at]), dim_);
      blas.sgemm(Transpose::kNo, Transpose::kYes, batch, dim_, dim_, 1.0f, dpre_.data(), ld_, w,
                 dim_, 1.0f, g_.data(), ld_);
    } else {
      const float* v = params.values(w_[at]);
      const float* u = params.values(u_[at]);
      blas.sgemm(Transpose::kYes, Transpose::kNo, rank_, dim_, batch, 1.0f, low_[at].data(), rank_,
                 dpre_.data(), ld_, 0.0f, params.grads(u_[at]), dim_);
      blas.sgemm(Transpose::kNo, Transpose::kYes, batch, rank_, dim_, 1.0f, dpre_.data(), ld_, u,
                 dim_, 0.0f, dlow_.data(), rank_);
      blas.sgemm(Transpose::kYes, Transpose::kNo, dim_, rank_, batch, 1.0f, in, ld_, dlow_.data(),
                 rank_, 0.0f, params.grads(w_[at]), rank_);
      blas.sgemm(Transpose::kNo, Transpose::kYes, batch, dim_, rank_, 1.0f, dlow_.data(), rank_, v,
                 rank_, 1.0f, g_.data(), ld_);
    }
  }
  device::parallel_for(
      stream, entries(batch, pooled_cols),
      PooledGrad{g_.data(), dx0_.data(), d_pooled, ld_, pooled_cols, unscale, accumulate});
}

}  // namespace gpubox::trainer
