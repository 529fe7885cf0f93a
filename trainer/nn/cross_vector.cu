// dcn's (DCN v1) cross layers, CrossKind::kVector (CrossNet, layers.hpp):
//   x_{l+1} = x0 * s + b_l + x_l,  s_i = x_l[i] . w_l
// Backward from g = dL/dx_{l+1}: t_i = g[i] . x0[i] (= dL/ds_i), dw_l = x_l^T t, db_l = 1^T g,
// dL/dx0 += g * s, dL/dx_l = g + t w_l^T. Portable: GEMV/GEMM through the card's Blas, the rest
// parallel_for.
#include <cmath>
#include <string>

#include "heterps/device/isa_clones.cuh"
#include "heterps/device/parallel_for.cuh"
#include "trainer/nn/detail/cross_functors.cuh"
#include "trainer/nn/layers.hpp"

namespace gpubox::trainer {
namespace {
using detail::entries;
using detail::RowDot;
using detail::VectorCombine;
using detail::VectorX0Grad;

}  // namespace

void CrossNet::add_vector_blocks(DenseParameters& params, int l) {
  const std::string name = "cross_" + std::to_string(l);
  const float normal_d = 1.0f / std::sqrt(static_cast<float>(dim_));
  w_.push_back(
      params.add(name + ".w", static_cast<std::size_t>(dim_), ParamInit::kNormal, normal_d));
}

void CrossNet::forward_vector(const Blas& blas, const DenseParameters& params, const float* x0,
                              int64_t batch, int l) {
  const auto at = static_cast<std::size_t>(l);
  const float* in = layer_input(x0, l);
  float* s = low_[at].data();
  blas.sgemv(Transpose::kNo, batch, dim_, 1.0f, in, ld_, params.values(w_[at]), 0.0f, s);
  device::parallel_for(blas.stream(), entries(batch, dim_),
                       device::isa_clones(VectorCombine{x0, in, s, params.values(b_[at]),
                                                        xs_[at].data(), ld_, dim_}));
}

void CrossNet::backward_vector(const Blas& blas, DenseParameters& params, const float* x0,
                               int64_t batch, int l) {
  const device::Stream& stream = blas.stream();
  const auto at = static_cast<std::size_t>(l);
  const float* in = layer_input(x0, l);
  float* t = dlow_.data();
  device::parallel_for(stream, static_cast<std::size_t>(batch),
                       device::isa_clones(RowDot{g_.data(), x0, t, ld_, dim_}));
  device::parallel_for(
      stream, static_cast<std::size_t>(dim_),
      device::isa_clones(detail::ColumnSum{g_.data(), params.grads(b_[at]), batch, ld_}));
  device::parallel_for(stream, entries(batch, dim_),
                       device::isa_clones(VectorX0Grad{g_.data(), low_[at].data(), dx0_.data(), ld_,
                                                       dim_, l == layers_ - 1}));
  blas.sgemv(Transpose::kYes, batch, dim_, 1.0f, in, ld_, t, 0.0f, params.grads(w_[at]));
  // g becomes dL/dx_l: the identity path plus the rank-1 term t w_l^T.
  blas.sgemm(Transpose::kNo, Transpose::kNo, batch, dim_, 1, 1.0f, t, 1, params.values(w_[at]),
             dim_, 1.0f, g_.data(), ld_);
}

}  // namespace gpubox::trainer
